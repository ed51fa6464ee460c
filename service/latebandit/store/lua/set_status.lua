-- Pause or resume. KEYS: config, counters, audit. ARGV: paused (0|1), audit record.
-- The stored configuration is left alone (the status lives in the counters' ``paused`` field): rewriting
-- it from a copy read earlier could undo a policy change made in between.
-- Returns 1 changed, 0 unknown campaign, -1 archived (nothing changed).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[2], 'until') == 1 then return -1 end
redis.call('HSET', KEYS[2], 'paused', ARGV[1])
redis.call('XADD', KEYS[3], '*', 'r', ARGV[2])
return 1
