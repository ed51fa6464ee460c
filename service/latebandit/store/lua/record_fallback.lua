-- requires: campaign_lib
-- Record a fallback decision (campaign paused): audit it and remember its request_id; no counter moves.
-- KEYS: counters, audit[, request]. ARGV: decision id, arm, propensity, request ttl, audit record, policy version.
-- Returns {3, ''} when the campaign is unknown (lost since the caller read it), {5, ''} when it is archived,
-- retried or not (as record_decisions answers), {1, earlier decision} for a retried request_id, else {0, ''}.
local refused = ({unknown = 3, archived = 5})[campaign_refusal(KEYS[1], ARGV[6])]
if refused then return {refused, ''} end
if #KEYS == 3 then
  local earlier = redis.call('GET', KEYS[3])
  if earlier then return {1, earlier} end
end
if #KEYS == 3 then
  redis.call('SET', KEYS[3], ARGV[1] .. '|' .. ARGV[2] .. '|' .. ARGV[3], 'EX', ARGV[4])
end
redis.call('XADD', KEYS[2], '*', 'r', ARGV[5])
return {0, ''}
