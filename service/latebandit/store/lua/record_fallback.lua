-- Record a fallback decision (campaign paused): audit it and remember its request_id; no counter moves.
-- KEYS: audit[, request]. ARGV: decision id, arm, propensity, request ttl, audit record.
-- Returns {1, earlier decision} for a retried request_id, else {0, ''}.
if #KEYS == 2 then
  local earlier = redis.call('GET', KEYS[2])
  if earlier then return {1, earlier} end
  redis.call('SET', KEYS[2], ARGV[1] .. '|' .. ARGV[2] .. '|' .. ARGV[3], 'EX', ARGV[4])
end
redis.call('XADD', KEYS[1], '*', 'r', ARGV[5])
return {0, ''}
