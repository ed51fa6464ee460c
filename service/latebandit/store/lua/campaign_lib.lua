-- Shared by every script that writes a campaign's state (prepended by store/redis.py to every script whose
-- first line "-- requires: ..." names campaign_lib). memory.py's ``_refusal`` checks the same, in the same
-- order: a retried request_id is answered before any refusal (record_decisions, claim_slots), then these.

-- Why the campaign refuses a write from a caller holding policy version ``version``, or nil: 'unknown' (no
-- state: never created, or lost), 'moved' (another policy version: the caller reloads it), 'paused'.
-- ``paused`` and ``stored`` are the counters' 'paused' and 'v' fields (false where absent), for a script
-- that reads them with others in one call.
local function refusal_of(paused, stored, version)
  if not paused then return 'unknown' end
  if (stored or '1') ~= version then return 'moved' end
  if paused == '1' then return 'paused' end
  return nil
end

local function campaign_refusal(counters, version)
  local fields = redis.call('HMGET', counters, 'paused', 'v')
  return refusal_of(fields[1], fields[2], version)
end

-- Float sums in IEEE doubles (HINCRBYFLOAT adds in long double): bit for bit what the embedded store and a
-- replay compute.
local function add_float(key, field, value)
  local total = (tonumber(redis.call('HGET', key, field)) or 0) + tonumber(value)
  redis.call('HSET', key, field, string.format('%.17g', total))
end

-- The counters' write stamp 'w', which record_decisions compares with the caller's: it answers a worker whose
-- cached counters predate a change other than its own decisions with all of them. Conversions summed and cells
-- matured bump it; counters started afresh (a new campaign, a new policy version) take one from Redis's clock,
-- so that no worker's counters of an earlier campaign or version pass for them.
local function stamp_counters(counters)
  redis.call('HINCRBY', counters, 'w', 1)
end

local function fresh_stamp()
  local now = redis.call('TIME')
  return now[1] .. string.format('%06d', now[2])
end
