-- Shared by every script that writes a campaign's state (prepended by store/redis.py to every script whose
-- first line "-- requires: ..." names campaign_lib). memory.py's ``_refusal`` checks the same, in the same
-- order: a retried request_id is answered before any refusal (record_decisions, claim_slots), then these.

-- Why the campaign refuses a write from a caller holding policy version ``version``, or nil: 'unknown' (no
-- state: never created, or lost), 'moved' (another policy version: the caller reloads it), 'paused'.
local function campaign_refusal(counters, version)
  local paused = redis.call('HGET', counters, 'paused')
  if not paused then return 'unknown' end
  if (redis.call('HGET', counters, 'v') or '1') ~= version then return 'moved' end
  if paused == '1' then return 'paused' end
  return nil
end

-- Float sums in IEEE doubles (HINCRBYFLOAT adds in long double): bit for bit what the embedded store and a
-- replay compute.
local function add_float(key, field, value)
  local total = (tonumber(redis.call('HGET', key, field)) or 0) + tonumber(value)
  redis.call('HSET', key, field, string.format('%.17g', total))
end


-- The counters changed other than by recording decisions (conversions summed, cells matured): a new write
-- stamp ('w'), so that record_decisions answers a worker whose cached counters predate it with all of them.
local function stamp_counters(counters)
  redis.call('HINCRBY', counters, 'w', 1)
end
