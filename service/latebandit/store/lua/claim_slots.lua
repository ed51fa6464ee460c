-- requires: campaign_lib, schedule_lib
-- Claim the next slots of a planning campaign's schedule for a batch of decisions made at one moment (the
-- engine's group commit; mirrors store/schedule.py), in order, one slot each.
-- KEYS: counters, sched, segments, starts (zset), closed (list), audit, then one request key per decision that
-- has a request_id, in order.
-- ARGV: now µs, expected arm, expected propensity (Python repr), request ttl, slot µs (0: one decision per
--       slot), created µs, lateness µs, policy version, then per decision: its id, its audit record, has a
--       request key (0/1).
-- Returns one {status, arm or earlier decision, propensity, version} per decision; status 0 new, 1 repeated,
-- 2 paused, 3 unknown, 4 needs a plan (none yet, or the plan has been played and the next may be made: no
-- slot is taken), 5 other arm (the slot is another arm's: nothing taken), 6 moved (the campaign is at another
-- policy version: the caller reloads it), 7 archived. After a 4 or a 5 the decisions that follow get the same answer
-- (nothing changed), except that a retried request_id gets its earlier decision (unless archived: then none).
local counters, sched, segments, starts, closed, audit = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now, slot_us, created, lateness = tonumber(ARGV[1]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local expected_arm, expected_propensity, ttl = ARGV[2], ARGV[3], ARGV[4]

-- The schedule's fields this script reads, in one call, and kept current by ``set`` (a claim read each of
-- them separately, some twice); the closing rule (close_ready) reads and writes its own.
local names = {'table', 'start', 'slot', 'cur', 'last', 'first', 'v'}
local fields = {}
for i, value in ipairs(redis.call('HMGET', sched, unpack(names))) do fields[names[i]] = value end
local function num(field) return tonumber(fields[field]) end
local function set(...)
  redis.call('HSET', sched, ...)
  local written = {...}
  for i = 1, #written, 2 do fields[written[i]] = written[i + 1] end
end

local refused = ({paused = 2, unknown = 3, moved = 6, archived = 7})[campaign_refusal(counters, ARGV[8])]
local refusal = refused and {refused, '', '', 0}
local archived = redis.call('HEXISTS', counters, 'until') == 1  -- whatever the caller's version: no retry answered
if not refusal and not fields.table then refusal = {4, '', '', 0} end
local plan = not refusal and cjson.decode(fields.table)  -- {segments = {{n, arm, p, counted, json}, ...}, hold, next}
local start = num('start')

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
  if current == target then return end
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
  set('cur', int(current), 'last', int(last))
end

-- The plan has been played and the next one may be made (at once, or once its segments are closed).
local function due(through)
  if plan.next == 'never' then return false end
  return plan.next == 'played' or through >= num('first') + #plan.segments - 1
end

-- One decision's slot: {status, arm, propensity, version}, as in the header.
local function claim(decision, record, request)
  local slot = num('slot') + 1
  if slot_us > 0 then slot = math.max(num('slot'), math.floor((now - created) / slot_us) + 1) end
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
  if tostring(segment[2]) ~= expected_arm or segment[3] ~= expected_propensity then
    return {5, tostring(segment[2]), segment[3], num('v')}
  end

  enter(target)
  set('slot', int(slot))

  close_ready(sched, segments, starts, closed, now, lateness)

  local seq = redis.call('HINCRBY', counters, 'd', 1)
  redis.call('HINCRBY', counters, 'n:' .. expected_arm, 1)
  if request then
    redis.call('SET', request, decision .. '|' .. expected_arm .. '|' .. expected_propensity, 'EX', ttl)
  end
  redis.call('XADD', audit, '*', 'seq', seq, 'r', record)
  return {0, expected_arm, expected_propensity, num('v')}
end

local answers, stopped, request_index = {}, refusal, 6
for i = 0, (#ARGV - 8) / 3 - 1 do
  local base = 8 + 3 * i
  local request = nil
  if ARGV[base + 3] == '1' then
    request_index = request_index + 1
    request = KEYS[request_index]
  end
  local earlier = request and not archived and redis.call('GET', request)
  if earlier then
    answers[#answers + 1] = {1, earlier, '', 0}
  elseif stopped then
    answers[#answers + 1] = stopped
  else
    local answer = claim(ARGV[base + 1], ARGV[base + 2], request)
    if answer[1] == 4 or answer[1] == 5 then stopped = answer end
    answers[#answers + 1] = answer
  end
end
return answers
