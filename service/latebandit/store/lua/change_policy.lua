-- requires: campaign_lib
-- Start a campaign's next policy version: the new configuration, fresh counters and histogram (pulls of an
-- earlier version no longer count), the pause flag and the deduplication memory kept.
-- A planning policy's schedule starts afresh too, and a contextual policy's model. KEYS: config, counters,
-- cells, audit, then the schedule's keys (sched, segments, starts, closed), then the model and its ``decided``
-- string. ARGV: new config JSON, new version, audit record, the arms version the caller read, the new one
-- (change_arms.lua: a restart with new arms changes both versions at once).
-- Returns 1 changed, 0 unknown campaign, -1 the version is not the one before ARGV[2] or the arms version not
-- ARGV[4] (a concurrent change), -2 archived (nothing changed: its fresh counters would drop the archive).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local stored = redis.call('HMGET', KEYS[2], 'v', 'a', 'paused', 'until')
if stored[4] then return -2 end
if tonumber(stored[1] or '1') + 1 ~= tonumber(ARGV[2]) or (stored[2] or '0') ~= ARGV[4] then return -1 end
local paused = stored[3] or '0'
redis.call('SET', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2], KEYS[3], unpack(KEYS, 5))
redis.call('HSET', KEYS[2], 'd', 0, 'paused', paused, 'v', ARGV[2], 'w', fresh_stamp(), 'a', ARGV[5])
redis.call('XADD', KEYS[4], '*', 'r', ARGV[3])
return 1
