-- Pause or resume. KEYS: config, counters, audit. ARGV: paused (0|1), new config JSON, audit record.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], 'paused', ARGV[1])
redis.call('XADD', KEYS[3], '*', 'r', ARGV[3])
return 1
