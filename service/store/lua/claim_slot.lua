-- requires: schedule_lib
-- Claim the next slot of a planning campaign's schedule for one decision (mirrors store/schedule.py).
-- KEYS: counters, sched, segments, starts (zset), closed (list), audit[, request].
-- ARGV: now µs, expected arm, expected propensity (Python repr), decision id, request ttl, audit record,
--       slot µs (0: one decision per slot), created µs, lateness µs, policy version.
-- Returns {status, arm or earlier decision, propensity, due, version}; status 0 new, 1 repeated,
-- 2 paused, 3 unknown, 4 needs a plan, 5 other arm (the slot is another arm's: nothing changed), 6 moved (the
-- campaign is at another policy version: the caller reloads it).
local counters, sched, segments, starts, closed, audit = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now, slot_us, created, lateness = tonumber(ARGV[1]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local num = field_reader(sched)

if #KEYS == 7 then
  local earlier = redis.call('GET', KEYS[7])
  if earlier then return {1, earlier, '', 0, 0} end
end
local paused = redis.call('HGET', counters, 'paused')
if not paused then return {3, '', '', 0, 0} end
if (redis.call('HGET', counters, 'v') or '1') ~= ARGV[10] then return {6, '', '', 0, 0} end
if paused == '1' then return {2, '', '', 0, 0} end
local table_json = redis.call('HGET', sched, 'table')
if not table_json then return {4, '', '', 0, 0} end
local plan = cjson.decode(table_json)  -- {segments = {{n, arm, p, counted, json}, ...}, hold = {...}, next}
local start, last_slot = num('start'), num('slot')
local slot = last_slot + 1
if slot_us > 0 then slot = math.max(last_slot, math.floor((now - created) / slot_us) + 1) end

local function resolve(s)
  local position = s - start
  for index, segment in ipairs(plan.segments) do
    if position < segment[1] then return index - 1, segment end
    position = position - segment[1]
  end
  return -1, plan.hold
end

local target, segment = resolve(slot)
if tostring(segment[2]) ~= ARGV[2] or segment[3] ~= ARGV[3] then
  return {5, tostring(segment[2]), segment[3], 0, num('v')}
end

local function first_slot(index)
  local first = start
  local upto = (index == -1) and #plan.segments or index
  for i = 1, upto do first = first + plan.segments[i][1] end
  return first
end

-- Open a record for each segment entered (several only with wall-clock slots and no traffic).
local current, last = num('cur'), num('last')
while current ~= target do
  local following = (current == -2) and 0 or current + 1
  if following < 0 or following >= #plan.segments then following = -1 end
  local first = first_slot(following)
  local begins = now
  if slot_us > 0 then begins = created + (first - 1) * slot_us end
  if redis.call('HEXISTS', segments, int(last) .. ':s') == 1 then
    redis.call('HSET', segments, int(last) .. ':x', int(begins), int(last) .. ':y', int(first))
  end
  local entered = (following == -1) and plan.hold or plan.segments[following + 1]
  last = last + 1
  local id = int(last)
  redis.call('HSET', segments, id .. ':j', entered[5], id .. ':a', entered[2], id .. ':c', entered[4],
    id .. ':f', int(first), id .. ':s', int(begins), id .. ':r', '0')
  redis.call('ZADD', starts, int(begins), id)
  current = following
end
redis.call('HSET', sched, 'cur', int(current), 'last', int(last), 'slot', int(slot))

local through = close_ready(sched, segments, starts, closed, now, lateness)

local arm = ARGV[2]
local seq = redis.call('HINCRBY', counters, 'd', 1)
redis.call('HINCRBY', counters, 'n:' .. arm, 1)
if #KEYS == 7 then
  redis.call('SET', KEYS[7], ARGV[4] .. '|' .. arm .. '|' .. ARGV[3], 'EX', ARGV[5])
end
redis.call('XADD', audit, '*', 'seq', seq, 'r', ARGV[6])

local due = 0
if current == -1 and plan.next ~= 'never' then
  if plan.next == 'played' or through >= num('first') + #plan.segments - 1 then due = 1 end
end
return {0, arm, ARGV[3], due, num('v')}
