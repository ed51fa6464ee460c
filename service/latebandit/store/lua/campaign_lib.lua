-- Shared by every script that writes a campaign's state (prepended by store/redis.py to every script whose
-- first line "-- requires: ..." names campaign_lib). memory.py's ``_refusal`` checks the same, in the same
-- order: a retried request_id is answered before any refusal (record_decisions, claim_slots) unless the campaign
-- is archived, then these.

-- Why the campaign refuses a write from a caller holding policy version ``version``, or nil: 'unknown' (no
-- state: never created, lost, or purged after its archive), 'moved' (another policy version: the caller
-- reloads it), 'archived', 'paused'. ``paused``, ``stored`` and ``last_feedback`` are the counters' 'paused',
-- 'v' and 'until' fields (false where absent), for a script that reads them with others in one call. An
-- archived campaign refuses every decision (``now`` nil) and feedback received after its feedback_until
-- ``last_feedback`` (µs); before that it takes feedback even if it was paused when archived.
local function refusal_of(paused, stored, version, last_feedback, now)
  if not paused then return 'unknown' end
  if (stored or '1') ~= version then return 'moved' end
  if last_feedback then
    if not now or now > tonumber(last_feedback) then return 'archived' end
    return nil
  end
  if paused == '1' then return 'paused' end
  return nil
end

local function campaign_refusal(counters, version, now)
  local fields = redis.call('HMGET', counters, 'paused', 'v', 'until')
  return refusal_of(fields[1], fields[2], version, fields[3], now)
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
