-- requires: campaign_lib
-- Create a campaign unless its id exists. KEYS: config, counters, audit. ARGV: config JSON, audit record.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'd', 0, 'paused', 0, 'w', fresh_stamp())
redis.call('XADD', KEYS[3], '*', 'r', ARGV[2])
return 1
