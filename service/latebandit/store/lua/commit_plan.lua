-- requires: schedule_lib
-- Install a plan unless another was committed since the version the caller planned from.
-- KEYS: sched, closed, audit. ARGV: expected version, plan JSON, table JSON ({segments, hold, next}),
-- closed records consumed, earliest first slot (wall-clock slots; 0 otherwise), audit record prefix
-- (the record's JSON without its closing brace: the version is appended here).
-- Returns the new version, or 0 if the expected version is stale.
local sched, closed, audit = KEYS[1], KEYS[2], KEYS[3]
local num = field_reader(sched)
local version = num('v') or 0
if version ~= tonumber(ARGV[1]) then return 0 end
for _, field in ipairs({'slot', 'last', 'crid', 'cuntil', 'wm'}) do redis.call('HSETNX', sched, field, '0') end
version = version + 1
local start = math.max(num('slot') + 1, tonumber(ARGV[5]))
redis.call('HSET', sched, 'v', int(version), 'plan', ARGV[2], 'table', ARGV[3], 'start', int(start), 'cur', '-2',
  'first', int(num('last') + 1))
local consumed = tonumber(ARGV[4])
if consumed > 0 then redis.call('LTRIM', closed, consumed, -1) end
redis.call('XADD', audit, '*', 'r', ARGV[6] .. ',"version":' .. int(version) .. '}}')
return version
