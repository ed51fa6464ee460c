-- Shared by the feedback scripts (prepended by store/redis.py to every script that starts with
-- "-- requires: ... dedup_lib"): the deduplication entries are a hash of event ids and converted decisions
-- with a sorted set of their expiry times (seconds).

-- Forget up to ``limit`` entries whose expiry has passed (bounded per call, so that a call's cost stays
-- proportional to its batch, and the hash shrinks as fast as traffic adds to it).
local function sweep(seen, expiry, now_s, limit)
  local stale = redis.call('ZRANGEBYSCORE', expiry, '-inf', now_s, 'LIMIT', 0, limit)
  for i = 1, #stale, 1000 do
    local chunk = {unpack(stale, i, math.min(i + 999, #stale))}
    redis.call('HDEL', seen, unpack(chunk))
    redis.call('ZREM', expiry, unpack(chunk))
  end
end
