-- Take, or keep, the lease on draining a campaign's audit queue; none on an empty queue, so that no lease key
-- is created for a campaign whose state a purge removed meanwhile (nothing is left to drain there).
-- KEYS: lease, audit. ARGV: owner, lease ms. Returns 1 held by the caller, 0 not.
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
