-- Shared by the feedback scripts (prepended by store/redis.py to every script that starts with
-- "-- requires: ... feedback_lib"): the deduplication entries and a batch's audit entry.
--
-- The deduplication entries, event ids (``ev:``) and converted decisions (``cv:``), are one sorted set scored
-- by their expiry time (s): one ZADD NX per lookup, where a hash beside the set doubled each entry's writes,
-- sweeps and memory.

-- Forget up to ``limit`` entries whose expiry has passed (bounded per call, so that a call's cost stays
-- proportional to its batch, and the set shrinks as fast as traffic adds to it). The set is ordered by
-- expiry: when more than ``limit`` have expired, the ``limit`` lowest ranks are all expired ones. ``credited``
-- (a sum campaign's hash of the reward credited per converted decision, by the same ``cv:`` names; nil for
-- none) loses the entries the set loses, which the set must then name.
local function sweep(expiry, now_s, limit, credited)
  if credited then
    local gone = redis.call('ZRANGEBYSCORE', expiry, '-inf', now_s, 'LIMIT', 0, limit)
    for first = 1, #gone, 1000 do  -- unpack's stack is bounded: at most 1000 names a call
      local part = {unpack(gone, first, math.min(first + 999, #gone))}
      redis.call('ZREM', expiry, unpack(part))
      redis.call('HDEL', credited, unpack(part))
    end
  elseif redis.call('ZCOUNT', expiry, '-inf', now_s) <= limit then
    redis.call('ZREMRANGEBYSCORE', expiry, '-inf', now_s)
  else
    redis.call('ZREMRANGEBYRANK', expiry, 0, limit - 1)
  end
end

-- Whether ``field`` is remembered: an entry whose expiry has passed counts as absent even before a sweep
-- reaches it.
local function known(expiry, field, now_s)
  local until_ = tonumber(redis.call('ZSCORE', expiry, field))
  return until_ ~= nil and until_ > now_s
end

-- Remember ``field`` until ``expires`` (its earlier expiry, if any, replaced).
local function remember(expiry, field, expires)
  redis.call('ZADD', expiry, expires, field)
end

-- Remember ``field`` until ``expires`` unless it is remembered already: true the first time.
local function first_time(expiry, field, expires, now_s)
  if redis.call('ZADD', expiry, 'NX', expires, field) == 1 then return true end
  if known(expiry, field, now_s) then return false end
  remember(expiry, field, expires)
  return true
end

-- A batch's audit entry: its records as the caller sent them (a JSON array, one per event) and, per event,
-- the outcome it is audited under or '' for one left out (store/redis.py's ``_records`` pairs them): two
-- fields, not two per event, so that the script never splits the records.
local function audit_batch(audit, records, audited)
  for _, outcome in ipairs(audited) do
    if outcome ~= '' then
      redis.call('XADD', audit, '*', 'o', table.concat(audited, ','), 'b', records)
      return
    end
  end
end
