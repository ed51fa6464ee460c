-- requires: campaign_lib, linear_lib
-- Record a batch of pulls (a group commit of the decisions one worker made meanwhile), each atomically with
-- its audit entry; a retried request_id gets its earlier decision.
-- KEYS: counters, cells, audit, then one request key per pull that has a request_id, in pull order; for a
-- contextual campaign then its model and the features hash of the batch's bucket (one: made at one moment).
-- ARGV: policy version, request ttl, moments per pull J, the decision count and write stamp ('w') of the
-- caller's cached counters (-1 for none), the caller's arms version (the counters' 'a', absent: 0; another
-- one is refused as 'moved': its arms were chosen among another arm set, change_arms.lua), the number B of
-- model blocks the batch adds to (0: not contextual), when (epoch s) its features may expire, then per pull
-- 7 + J values: arm, bucket, offset µs, decision id, propensity, audit record, has request key (0/1), moments
-- e1..eJ, and for a contextual campaign 2 more: its features (float64 blob), its footprint; last, B pairs: a
-- block, the Σ AAᵀ of the batch's pulls of it (used when every pull is new; else each new pull's own is added).
-- Returns {statuses, earlier decisions, counters}, one status and one earlier decision ('' unless repeated)
-- per pull: 0 new, 1 repeated, 2 paused, 3 unknown, 4 moved (the campaign is at another policy version than
-- the caller's: it must reload its configuration), 5 archived. A request_id's earlier decision is returned before any
-- other refusal, so a retried request is answered the same whatever happened to the campaign since, unless it
-- was archived: an archived campaign decides nothing, retried or not, whichever worker asks. The counters
-- are the decision count after the batch when the caller's were current (no decision and no other write
-- since: it adds the batch's new pulls itself), else all of them as HGETALL; none ({}) on a refusal.
local counters, cells, audit = KEYS[1], KEYS[2], KEYS[3]
local version, ttl, moments = ARGV[1], ARGV[2], tonumber(ARGV[3])
local blocks = tonumber(ARGV[7])
local width = 7 + moments + (blocks > 0 and 2 or 0)
local pulls = (#ARGV - 8 - 2 * blocks) / width
local model, features = KEYS[#KEYS - 1], KEYS[#KEYS]
local chosen, every_new = {}, true  -- the new pulls' blocks and features
local known = redis.call('HMGET', counters, 'd', 'w', 'paused', 'v', 'until', 'a')
local current = known[1] == ARGV[4] and (known[2] or '0') == ARGV[5]
local decisions = tonumber(known[1])

local refused = refusal_of(known[3], known[4], version, known[5])
if refused == nil and (known[6] or '0') ~= ARGV[6] then refused = 'moved' end
local refusal = ({paused = 2, unknown = 3, moved = 4, archived = 5})[refused] or 0

local statuses, earliers = {}, {}
local request = 3
for i = 1, pulls do
  local base = 8 + (i - 1) * width
  local arm, decision, propensity = ARGV[base + 1], ARGV[base + 4], ARGV[base + 5]
  local key = nil
  if ARGV[base + 7] == '1' then
    request = request + 1
    key = KEYS[request]
  end
  local earlier = key and not known[5] and redis.call('GET', key)
  if earlier then
    statuses[i], earliers[i], every_new = 1, earlier, false
  elseif refusal ~= 0 then
    statuses[i], earliers[i] = refusal, ''
  else
    decisions = redis.call('HINCRBY', counters, 'd', 1)
    redis.call('HINCRBY', counters, 'n:' .. arm, 1)
    local cell = arm .. ':' .. ARGV[base + 2] .. ':'
    redis.call('HINCRBY', cells, cell .. 'c', 1)
    redis.call('HINCRBY', cells, cell .. 'o', ARGV[base + 3])
    for j = 1, moments do
      add_float(cells, cell .. 'e' .. j, ARGV[base + 7 + j])
    end
    local action = ''
    if blocks > 0 then
      local vector = ARGV[base + 8 + moments]
      redis.call('HSET', features, features_field(decision), vector)
      add_float(cells, cell .. 'f', ARGV[base + 9 + moments])
      chosen[#chosen + 1] = {arm, vector}
      if key then action = '|' .. cjson.decode(ARGV[base + 6])['arm'] end  -- the action a retry is answered
    end
    if key then
      redis.call('SET', key, decision .. '|' .. arm .. '|' .. propensity .. action, 'EX', ttl)
    end
    redis.call('XADD', audit, '*', 'seq', decisions, 'r', ARGV[base + 6])
    statuses[i], earliers[i] = 0, ''
  end
end
if #chosen > 0 then
  if every_new then  -- the caller's sums of the same pulls: d·d additions per block, not d·d per pull
    for pair = 8 + pulls * width + 1, #ARGV, 2 do add_blob(model, 'g:' .. ARGV[pair], ARGV[pair + 1]) end
  else
    local grams = {}
    for _, pull in ipairs(chosen) do
      grams[pull[1]] = grams[pull[1]] or {}
      accumulate(grams[pull[1]], pull[2], 1, true)
    end
    for block, gram in pairs(grams) do add_doubles(model, 'g:' .. block, gram) end
  end
  redis.call('EXPIREAT', features, ARGV[8])
end
if refusal ~= 0 then return {statuses, earliers, {}} end
if current then return {statuses, earliers, decisions} end
return {statuses, earliers, redis.call('HGETALL', counters)}
