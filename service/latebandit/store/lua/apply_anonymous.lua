-- requires: campaign_lib, schedule_lib, feedback_lib
-- Deduplicate and credit a batch of one planning campaign's aggregates and watermarks, then close the
-- records whose feedback is complete (mirrors MemoryStore.apply_anonymous and ScheduleBook.credit).
-- KEYS: counters, sched, segments, starts, closed, audit, dedup (sorted set by expiry).
-- ARGV: now µs, lateness µs, events (JSON array of [kind, start, end, value, event id or '', decision id or
-- '', expires s, counts: false for a conversion of a fallback or an earlier policy version]), audit records (a JSON array, one per event), policy version, the largest reward of one
-- decision and the most reward the schedule credits in all (store/schedule.py's RewardBounds).
-- Returns one outcome per event, or {'paused'} / {'unknown'} / {'moved'} / {'archived'} (after its
-- feedback_until) for the whole batch.
local counters, sched, segments, starts, closed, audit, seen =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local now, lateness = tonumber(ARGV[1]), tonumber(ARGV[2])
local refusal = campaign_refusal(counters, ARGV[5], now)
if refusal then return {refusal} end
local num = field_reader(sched)
local now_s = math.floor(now / 1000000)
local per_decision, limit = tonumber(ARGV[6]), tonumber(ARGV[7])
local decisions = tonumber(redis.call('HGET', counters, 'd')) or 0
local total = num('total') or 0  -- all reward credited since the schedule began: written back once, at the end

-- RewardBounds.admits: an aggregate (no decision) is at most the per-decision reward times the decisions
-- counted, a conversion at most the per-decision reward; either keeps the total within the limit. NaN (JSON's
-- null, from Python) admits nothing.
local function admits(value, aggregate)
  local most = aggregate and per_decision * decisions or per_decision
  return type(value) == 'number' and value >= 0 and value <= most and total + value <= limit
end

-- The open records that can overlap [start, finish): records are contiguous in time (each ends where the
-- next begins, only the last is open-ended), so they are those that begin at the latest beginning at or
-- before ``start`` (several only when some are empty) and those that begin inside. Two index reads: the cost
-- does not grow with the number of open records.
local function candidates(start, finish)
  local ids = {}
  local latest = redis.call('ZREVRANGEBYSCORE', starts, int(start), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #latest > 0 then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', starts, latest[2], latest[2])) do ids[#ids + 1] = id end
  end
  if finish > start then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', starts, '(' .. int(start), '(' .. int(finish))) do
      ids[#ids + 1] = id
    end
  end
  return ids
end

-- Credit [start, end) to the open records it overlaps, in proportion to time (an instant to the record
-- containing it), if the bounds admit its value.
local function credit(start, finish, value, aggregate)
  if start < (num('cuntil') or 0) then return 'phase_closed' end
  local ids = candidates(start, finish)
  local shares = {}
  for _, id in ipairs(ids) do
    local f = redis.call('HMGET', segments, id .. ':s', id .. ':x')
    local begins, ends = tonumber(f[1]), tonumber(f[2])
    local upper = ends or math.max(finish, start + 1)
    if finish == start then
      if begins <= start and start < upper then shares[#shares + 1] = {id, nil} end
    elseif math.min(finish, upper) > math.max(start, begins) then
      shares[#shares + 1] = {id, (math.min(finish, upper) - math.max(start, begins)) / (finish - start)}
    end
  end
  if #shares == 0 then return 'before_decision' end
  if not admits(value, aggregate) then return 'value_out_of_range' end
  for _, share in ipairs(shares) do
    add_float(segments, share[1] .. ':r', share[2] and value * share[2] or value)
  end
  total = total + value
  return 'counted'
end

local events = cjson.decode(ARGV[3])
sweep(seen, now_s, 2 * #events + 16)  -- as apply_conversions does: a planning campaign's entries expire too
local outcomes, audited = {}, {}
for i, event in ipairs(events) do
  local kind, start, finish, value, event_id, decision, expires, counts = unpack(event)
  local outcome
  if kind == 'watermark' then
    redis.call('HSET', sched, 'wm', int(math.max(num('wm') or 0, start)))
    outcome = 'counted'
  elseif event_id ~= '' and known(seen, 'ev:' .. event_id, now_s) then
    outcome = 'duplicate'
  elseif decision ~= '' and known(seen, 'cv:' .. decision, now_s) then
    -- a decision converted already: a new event id is a repeat (recorded, not credited), none a duplicate
    if event_id == '' then
      outcome = 'duplicate'
    else
      remember(seen, 'ev:' .. event_id, expires)
      outcome = 'repeat'
    end
  else
    outcome = counts and credit(start, finish, value, decision == '') or 'stale'
    if outcome ~= 'before_decision' and outcome ~= 'value_out_of_range' then
      if event_id ~= '' then remember(seen, 'ev:' .. event_id, expires) end
      if decision ~= '' then remember(seen, 'cv:' .. decision, expires) end
    end
  end
  outcomes[i] = outcome
  local recorded = outcome == 'counted' or outcome == 'phase_closed' or outcome == 'repeat' or outcome == 'stale'
  audited[i] = recorded and outcome or ''
end
if total ~= (num('total') or 0) then redis.call('HSET', sched, 'total', string.format('%.17g', total)) end
close_ready(sched, segments, starts, closed, now, lateness)
audit_batch(audit, ARGV[4], audited)
return outcomes
