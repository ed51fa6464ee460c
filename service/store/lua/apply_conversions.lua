-- Deduplicate, count and queue for audit a batch of one campaign's conversions (mirrors memory.py).
-- KEYS: counters, cells, audit, then per event its event key and its decision's converted key
-- (the converted key twice when the event has no event_id).
-- ARGV per event (8 values): has event_id, counts, censored, arm, bucket, value, dedup ttl, audit record.
-- Returns one outcome per event, or {'paused'} / {'unknown'} for the whole batch.
local counters, cells, audit = KEYS[1], KEYS[2], KEYS[3]
local paused = redis.call('HGET', counters, 'paused')
if not paused then return {'unknown'} end
if paused == '1' then return {'paused'} end
local outcomes = {}
local entry = {audit, '*'}
for i = 1, (#KEYS - 3) / 2 do
  local a = (i - 1) * 8
  local has_event, counts, censored = ARGV[a + 1] == '1', ARGV[a + 2] == '1', ARGV[a + 3] == '1'
  local arm, bucket, value, ttl = ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7]
  local outcome
  if has_event and not redis.call('SET', KEYS[2 + 2 * i], 1, 'NX', 'EX', ttl) then
    outcome = 'duplicate'
  elseif not redis.call('SET', KEYS[3 + 2 * i], 1, 'NX', 'EX', ttl) then
    if not has_event then outcome = 'duplicate' elseif censored then outcome = 'censored' else outcome = 'repeat' end
  elseif censored then
    outcome = 'censored'
  elseif not counts then
    outcome = 'stale'
  else
    redis.call('HINCRBYFLOAT', counters, 's:' .. arm, value)
    local cell = arm .. ':' .. bucket .. ':'
    if redis.call('HEXISTS', cells, cell .. 'c') == 1 then redis.call('HINCRBY', cells, cell .. 'v', 1) end
    outcome = 'counted'
  end
  outcomes[i] = outcome
  if outcome ~= 'duplicate' then
    entry[#entry + 1] = i .. ':' .. outcome  -- field names must be unique: redis-py reads entries as dicts
    entry[#entry + 1] = ARGV[a + 8]
  end
end
if #entry > 2 then redis.call('XADD', unpack(entry)) end
return outcomes
