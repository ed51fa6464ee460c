-- requires: campaign_lib, linear_lib
-- Record a batch of pulls (a group commit of the decisions one worker made meanwhile), each atomically with
-- its audit entry; a retried request_id gets its earlier decision.
-- KEYS: counters, cells, audit, then one request key per pull that has a request_id, in pull order; for a
-- contextual campaign then its ``decided`` string and the features hash of the batch's bucket (one: made at one
-- moment).
-- ARGV: policy version, request ttl, moments per pull J, the decision count and write stamp ('w') of the
-- caller's cached counters (-1 for none), the caller's arms version (the counters' 'a', absent: 0; another
-- one is refused as 'moved': its arms were chosen among another arm set, change_arms.lua), 1 for a contextual
-- campaign (else 0), when (epoch s) its features may expire, then per pull 7 + J values: arm, bucket, offset
-- µs, decision id, propensity, audit record, has request key (0/1), moments e1..eJ, and for a contextual
-- campaign 2 more: its features (float64 blob), its footprint.
-- A contextual campaign's new pulls are appended to ``decided`` (block, then features: Σ AAᵀ grows by them
-- there, not here, where adding d·d doubles per call cost Redis 60 µs at d = 20 and 250 at d = 50).
-- Returns {statuses, earlier decisions, counters, decided's length in bytes (0: nothing appended)}, one status
-- and one earlier decision ('' unless repeated) per pull: 0 new, 1 repeated, 2 paused, 3 unknown, 4 moved (the
-- campaign is at another policy version than the caller's: it must reload its configuration), 5 archived. A
-- request_id's earlier decision is returned before any other refusal, so a retried request is answered the
-- same whatever happened to the campaign since, unless it was archived: an archived campaign decides nothing,
-- retried or not, whichever worker asks. The counters are the decision count after the batch when the
-- caller's were current (no decision and no other write since: it adds the batch's new pulls itself), else
-- all of them as HGETALL; none ({}) on a refusal.
local counters, cells, audit = KEYS[1], KEYS[2], KEYS[3]
local version, ttl, moments = ARGV[1], ARGV[2], tonumber(ARGV[3])
local contextual = ARGV[7] == '1'
local width = 7 + moments + (contextual and 2 or 0)
local pulls = (#ARGV - 8) / width
local decided, features = KEYS[#KEYS - 1], KEYS[#KEYS]
local appended = {}  -- the new pulls' entries of ``decided``: block, features
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
    statuses[i], earliers[i] = 1, earlier
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
    if contextual then
      local vector = ARGV[base + 8 + moments]
      redis.call('HSET', features, features_field(decision), vector)
      add_float(cells, cell .. 'f', ARGV[base + 9 + moments])
      appended[#appended + 1] = struct.pack('<d', tonumber(arm)) .. vector
      if key then action = '|' .. cjson.decode(ARGV[base + 6])['arm'] end  -- the action a retry is answered
    end
    if key then
      redis.call('SET', key, decision .. '|' .. arm .. '|' .. propensity .. action, 'EX', ttl)
    end
    redis.call('XADD', audit, '*', 'seq', decisions, 'r', ARGV[base + 6])
    statuses[i], earliers[i] = 0, ''
  end
end
local logged = 0
if #appended > 0 then
  logged = redis.call('APPEND', decided, table.concat(appended))
  redis.call('EXPIREAT', features, ARGV[8])
end
if refusal ~= 0 then return {statuses, earliers, {}, logged} end
if current then return {statuses, earliers, decisions, logged} end
return {statuses, earliers, redis.call('HGETALL', counters), logged}
