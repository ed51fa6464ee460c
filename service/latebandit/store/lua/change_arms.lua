-- requires: campaign_lib
-- Add and retire arms within one policy version: the new configuration and the arms version 'a' in the
-- counters (record_decisions refuses, as 'moved', a decision chosen among another arm set), the statistics
-- kept (a new arm's fields n:k, s:k, m:k are absent, read as 0), the write stamp moved on.
-- KEYS: config, counters, audit. ARGV: new config JSON, policy version, arms version before, new arms
-- version, audit record.
-- Returns 1 changed, 0 unknown campaign, -1 the stored policy or arms version is not the caller's (a
-- concurrent change), -2 archived (its arm set is final).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local stored = redis.call('HMGET', KEYS[2], 'v', 'a', 'until')
if stored[3] then return -2 end
if (stored[1] or '1') ~= ARGV[2] or (stored[2] or '0') ~= ARGV[3] then return -1 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'a', ARGV[4])
stamp_counters(KEYS[2])
redis.call('XADD', KEYS[3], '*', 'r', ARGV[5])
return 1
