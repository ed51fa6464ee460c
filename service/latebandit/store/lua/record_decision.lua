-- Record one pull, atomically with its audit entry; a retried request_id gets its earlier decision.
-- KEYS: counters, cells, audit[, request]. ARGV: arm, bucket, offset µs, decision id, propensity,
-- request ttl, audit record, policy version, moments e1..eJ.
-- Returns {status, earlier decision or '', counters as HGETALL}: 0 new, 1 repeated, 2 paused, 3 unknown,
-- 4 moved (the campaign is at another policy version than the caller's: it must reload its configuration).
local counters, cells, audit = KEYS[1], KEYS[2], KEYS[3]

-- Float sums in IEEE doubles (HINCRBYFLOAT adds in long double): bit for bit what a replay computes.
local function add_float(key, field, value)
  local total = (tonumber(redis.call('HGET', key, field)) or 0) + tonumber(value)
  redis.call('HSET', key, field, string.format('%.17g', total))
end

if #KEYS == 4 then
  local earlier = redis.call('GET', KEYS[4])
  if earlier then return {1, earlier, redis.call('HGETALL', counters)} end
end
local paused = redis.call('HGET', counters, 'paused')
if not paused then return {3, '', {}} end
if (redis.call('HGET', counters, 'v') or '1') ~= ARGV[8] then return {4, '', {}} end
if paused == '1' then return {2, '', {}} end
local arm = ARGV[1]
local seq = redis.call('HINCRBY', counters, 'd', 1)
redis.call('HINCRBY', counters, 'n:' .. arm, 1)
local cell = arm .. ':' .. ARGV[2] .. ':'
redis.call('HINCRBY', cells, cell .. 'c', 1)
redis.call('HINCRBY', cells, cell .. 'o', ARGV[3])
for j = 9, #ARGV do
  add_float(cells, cell .. 'e' .. (j - 8), ARGV[j])
end
if #KEYS == 4 then
  redis.call('SET', KEYS[4], ARGV[4] .. '|' .. arm .. '|' .. ARGV[5], 'EX', ARGV[6])
end
redis.call('XADD', audit, '*', 'seq', seq, 'r', ARGV[7])
return {0, '', redis.call('HGETALL', counters)}
