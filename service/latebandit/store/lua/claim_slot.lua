-- requires: schedule_lib
-- Claim the next slot of a planning campaign's schedule for one decision (mirrors store/schedule.py).
-- KEYS: counters, sched, segments, starts (zset), closed (list), audit[, request].
-- ARGV: now µs, expected arm, expected propensity (Python repr), decision id, request ttl, audit record,
--       slot µs (0: one decision per slot), created µs, lateness µs, policy version.
-- Returns {status, arm or earlier decision, propensity, version}; status 0 new, 1 repeated, 2 paused,
-- 3 unknown, 4 needs a plan (none yet, or the plan has been played and the next may be made: no slot is
-- taken), 5 other arm (the slot is another arm's: nothing taken), 6 moved (the campaign is at another
-- policy version: the caller reloads it).
local counters, sched, segments, starts, closed, audit = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now, slot_us, created, lateness = tonumber(ARGV[1]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local num = field_reader(sched)

if #KEYS == 7 then
  local earlier = redis.call('GET', KEYS[7])
  if earlier then return {1, earlier, '', 0} end
end
local paused = redis.call('HGET', counters, 'paused')
if not paused then return {3, '', '', 0} end
if (redis.call('HGET', counters, 'v') or '1') ~= ARGV[10] then return {6, '', '', 0} end
if paused == '1' then return {2, '', '', 0} end
local table_json = redis.call('HGET', sched, 'table')
if not table_json then return {4, '', '', 0} end
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

local function first_slot(index)
  local first = start
  local upto = (index == -1) and #plan.segments or index
  for i = 1, upto do first = first + plan.segments[i][1] end
  return first
end

local function slot_start(s)
  if slot_us > 0 then return created + (s - 1) * slot_us end
  return now
end

-- Open a record for each segment entered until plan index ``target`` (several only with wall-clock slots
-- and no decision during whole segments).
local function enter(target)
  local current, last = num('cur'), num('last')
  while current ~= target do
    local following = (current == -2) and 0 or current + 1
    if following < 0 or following >= #plan.segments then following = -1 end
    local first = first_slot(following)
    local begins = slot_start(first)
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
  redis.call('HSET', sched, 'cur', int(current), 'last', int(last))
end

-- The plan has been played and the next one may be made (at once, or once its segments are closed).
local function due(through)
  if plan.next == 'never' then return false end
  return plan.next == 'played' or through >= num('first') + #plan.segments - 1
end

local target, segment = resolve(slot)
if target == -1 then
  -- Past the plan: end its last record here (the hold, if any, opens below), then ask for the next plan.
  if num('cur') ~= -1 and #plan.segments > 0 then
    enter(#plan.segments - 1)
    local last, ends = int(num('last')), first_slot(-1)
    if redis.call('HEXISTS', segments, last .. ':x') == 0 then
      redis.call('HSET', segments, last .. ':x', int(slot_start(ends)), last .. ':y', int(ends))
    end
  end
  if due(close_ready(sched, segments, starts, closed, now, lateness)) then return {4, '', '', num('v')} end
end
if tostring(segment[2]) ~= ARGV[2] or segment[3] ~= ARGV[3] then
  return {5, tostring(segment[2]), segment[3], num('v')}
end

enter(target)
redis.call('HSET', sched, 'slot', int(slot))

close_ready(sched, segments, starts, closed, now, lateness)

local arm = ARGV[2]
local seq = redis.call('HINCRBY', counters, 'd', 1)
redis.call('HINCRBY', counters, 'n:' .. arm, 1)
if #KEYS == 7 then
  redis.call('SET', KEYS[7], ARGV[4] .. '|' .. arm .. '|' .. ARGV[3], 'EX', ARGV[5])
end
redis.call('XADD', audit, '*', 'seq', seq, 'r', ARGV[6])

return {0, arm, ARGV[3], num('v')}
