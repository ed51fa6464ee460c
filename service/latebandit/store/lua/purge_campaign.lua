-- Remove an archived campaign's state once nothing can change it and the audit log has all it recorded.
-- KEYS: counters, audit, then every other key of the campaign with a fixed name (store/keys.py, ``purged``).
-- ARGV: now µs. Returns 1 purged (or gone already), 0 kept: not archived, feedback still possible until
-- its 'until', or audit entries still queued (the writer drains them first: an acknowledged event is never
-- lost).
local until = redis.call('HGET', KEYS[1], 'until')
if redis.call('EXISTS', KEYS[1]) == 1 and not (until and tonumber(until) < tonumber(ARGV[1])) then return 0 end
if redis.call('XLEN', KEYS[2]) > 0 then return 0 end
redis.call('DEL', unpack(KEYS))
return 1
