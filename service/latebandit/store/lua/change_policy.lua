-- requires: campaign_lib
-- Start a campaign's next policy version: the new configuration, fresh counters and histogram (pulls of an
-- earlier version no longer count), the pause flag and the deduplication memory kept.
-- A planning policy's schedule starts afresh too. KEYS: config, counters, cells, audit, then the schedule's
-- keys (sched, segments, starts, closed). ARGV: new config JSON, new version, audit record.
-- Returns 1 changed, 0 unknown campaign, -1 the version is not the one before ARGV[2] (a concurrent change),
-- -2 archived (nothing changed: its fresh counters would drop the archive).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[2], 'until') == 1 then return -2 end
local current = tonumber(redis.call('HGET', KEYS[2], 'v') or '1')
if current + 1 ~= tonumber(ARGV[2]) then return -1 end
local paused = redis.call('HGET', KEYS[2], 'paused') or '0'
redis.call('SET', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2], KEYS[3], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
redis.call('HSET', KEYS[2], 'd', 0, 'paused', paused, 'v', ARGV[2], 'w', fresh_stamp())
redis.call('XADD', KEYS[4], '*', 'r', ARGV[3])
return 1
