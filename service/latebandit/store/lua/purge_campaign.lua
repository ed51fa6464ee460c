-- Remove an archived campaign's state once nothing can change it and the audit log has all it recorded.
-- KEYS: counters, audit, then every other key of the campaign with a fixed name (store/keys.py, ``purged``).
-- ARGV: now µs. Returns 1 purged (or gone already), 0 kept: not archived, feedback still possible until
-- its 'until', or audit entries still queued (the writer drains them first: an acknowledged event is never
-- lost).
local last_feedback = redis.call('HGET', KEYS[1], 'until')
local due = last_feedback and tonumber(last_feedback) < tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 and not due then return 0 end
if redis.call('XLEN', KEYS[2]) > 0 then return 0 end
redis.call('DEL', unpack(KEYS))
return 1
