-- Archive a campaign. KEYS: config, counters, audit. ARGV: archive time µs, feedback_until µs, audit record.
-- Returns 1 archived now, 2 archived before (nothing changed: its first archive stands), 0 unknown campaign.
-- The archive lives in the counters ('archived', 'until'), which every refusal reads (campaign_lib.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[2], 'until') == 1 then return 2 end
redis.call('HSET', KEYS[2], 'archived', ARGV[1], 'until', ARGV[2])
redis.call('XADD', KEYS[3], '*', 'r', ARGV[3])
return 1
