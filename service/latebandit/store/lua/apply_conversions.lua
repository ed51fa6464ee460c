-- requires: campaign_lib, feedback_lib, linear_lib
-- Deduplicate, count and queue for audit a batch of one campaign's conversions (mirrors memory.py).
-- KEYS: counters, cells, audit, dedup (sorted set: seen event ids and converted decisions by expiry),
-- delays (hash arm:delay bucket -> count), credited (hash 'cv:<decision id>' -> the reward credited to a
-- counted decision so far, kept on a sum campaign as long as its dedup entry); for a contextual campaign then
-- its model and the features hashes of the events' decisions.
-- ARGV: now (s), events (JSON array of [event id or '', decision id, counts, censored, arm, bucket,
-- value, expires (s), delay bucket, the key index of its decision's features hash or 0 (not contextual)]),
-- audit records (a JSON array, one per event), policy version the events
-- were classified against, reward.max, '1' if a decision's conversions add up (reward.per_decision 'sum'),
-- now µs.
-- Returns one outcome per event ('value_out_of_range' for a value outside [0, max]: nothing changed, nothing
-- recorded; 'stale' for a contextual decision whose features are no longer kept), or {'paused'} / {'unknown'} / {'moved'} (another policy version) / {'archived'} (received after
-- its feedback_until) for the batch.
local counters, cells, audit, seen, delays, credited = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local refusal = campaign_refusal(counters, ARGV[4], tonumber(ARGV[7]))
if refusal then return {refusal} end

local now_s = tonumber(ARGV[1])
local events = cjson.decode(ARGV[2])
local most, sums_up = tonumber(ARGV[5]), ARGV[6] == '1'
if not sums_up then credited = nil end
sweep(seen, now_s, 2 * #events + 16, credited)

-- What the batch adds, written once per field after the loop (per event, these writes were a fifth of the
-- script's time). Float sums stay IEEE doubles added in event order (HINCRBYFLOAT adds in long double):
-- bit for bit what a replay computes, since '%.17g' round-trips a double exactly.
local sums, counted = {}, {}  -- per 's:arm', per 'c:arm'
local observed, converted = {}, {}  -- per 'arm:delay bucket', per 'arm:bucket:' cell
local rewards = {}  -- a contextual campaign's b per block: Σ value·A of its counted conversions

-- Add ``amount`` to the arm's S in ``sums`` (read once from the counters).
local function add_sum(arm, amount)
  local field = 's:' .. arm
  sums[field] = (sums[field] or tonumber(redis.call('HGET', counters, field)) or 0) + amount
end

local outcomes, audited = {}, {}
for i, event in ipairs(events) do
  local event_id, decision, counts, censored, arm, bucket, value, expires, delay_bucket, kept = unpack(event)
  local outcome
  value = tonumber(value)
  if not (value and value >= 0 and value <= most) then  -- NaN too: S grows by at most max a decision
    outcome = 'value_out_of_range'
  elseif event_id ~= '' and not first_time(seen, 'ev:' .. event_id, expires, now_s) then
    outcome = 'duplicate'
  elseif not first_time(seen, 'cv:' .. decision, expires, now_s) then
    if event_id == '' then
      outcome = 'duplicate'
    elseif censored then
      outcome = 'censored'
    else
      outcome = 'repeat'
      local before = credited and counts and tonumber(redis.call('HGET', credited, 'cv:' .. decision))
      if before then  -- a sum campaign's counted decision: the repeat adds up to max (RewardSpec.credit)
        local added = math.max(0, math.min(value, most - before))
        if added > 0 then
          add_sum(arm, added)
          redis.call('HSET', credited, 'cv:' .. decision, string.format('%.17g', before + added))
        end
      end
    end
  else
    -- a counted pull's first conversion, censored or not: its delay is data (memory.py does the same)
    if counts then
      local field = arm .. ':' .. delay_bucket
      observed[field] = (observed[field] or 0) + 1
    end
    if credited then  -- set afresh: an entry left by an expired earlier life of this name is no longer true
      if counts and not censored then
        redis.call('HSET', credited, 'cv:' .. decision, string.format('%.17g', value))
      else
        redis.call('HDEL', credited, 'cv:' .. decision)
      end
    end
    local vector = nil  -- a contextual decision's features, read only for a conversion that may count
    if counts and not censored and kept > 0 then vector = redis.call('HGET', KEYS[kept], features_field(decision)) end
    if censored then
      outcome = 'censored'
    elseif not counts or vector == false then  -- false: its features are gone, past window + lateness
      outcome = 'stale'
    else
      if vector then
        rewards[arm] = rewards[arm] or {}
        add_scaled(rewards[arm], vector, value)
      end
      add_sum(arm, value)
      counted['c:' .. arm] = (counted['c:' .. arm] or 0) + 1
      local cell = arm .. ':' .. bucket .. ':'
      converted[cell] = (converted[cell] or 0) + 1
      outcome = 'counted'
    end
  end
  outcomes[i] = outcome
  audited[i] = (outcome ~= 'duplicate' and outcome ~= 'value_out_of_range') and outcome or ''
end
for field, total in pairs(sums) do redis.call('HSET', counters, field, string.format('%.17g', total)) end
for field, count in pairs(counted) do redis.call('HINCRBY', counters, field, count) end
if next(sums) or next(counted) then stamp_counters(counters) end
for field, count in pairs(observed) do redis.call('HINCRBY', delays, field, count) end
for block, reward in pairs(rewards) do add_doubles(KEYS[7], 'b:' .. block, reward) end
for cell, count in pairs(converted) do  -- a cell folded into ``matured`` since the decision counts no more
  if redis.call('HEXISTS', cells, cell .. 'c') == 1 then redis.call('HINCRBY', cells, cell .. 'v', count) end
end
audit_batch(audit, ARGV[3], audited)
return outcomes
