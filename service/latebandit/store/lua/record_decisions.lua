-- requires: campaign_lib
-- Record a batch of pulls (a group commit of the decisions one worker made meanwhile), each atomically with
-- its audit entry; a retried request_id gets its earlier decision.
-- KEYS: counters, cells, audit, then one request key per pull that has a request_id, in pull order.
-- ARGV: policy version, request ttl, moments per pull J, the decision count and write stamp ('w') of the
-- caller's cached counters (-1 for none), the caller's arms version (the counters' 'a', absent: 0; another
-- one is refused as 'moved': its arms were chosen among another arm set, change_arms.lua), then per pull 7 + J
-- values: arm, bucket, offset µs, decision id,
-- propensity, audit record, has request key (0/1), moments e1..eJ.
-- Returns {statuses, earlier decisions, counters}, one status and one earlier decision ('' unless repeated)
-- per pull: 0 new, 1 repeated, 2 paused, 3 unknown, 4 moved (the campaign is at another policy version than
-- the caller's: it must reload its configuration), 5 archived. A request_id's earlier decision is returned before any
-- other refusal, so a retried request is answered the same whatever happened to the campaign since, unless it
-- was archived: an archived campaign decides nothing, retried or not, whichever worker asks. The counters
-- are the decision count after the batch when the caller's were current (no decision and no other write
-- since: it adds the batch's new pulls itself), else all of them as HGETALL; none ({}) on a refusal.
local counters, cells, audit = KEYS[1], KEYS[2], KEYS[3]
local version, ttl, moments = ARGV[1], ARGV[2], tonumber(ARGV[3])
local width = 7 + moments
local known = redis.call('HMGET', counters, 'd', 'w', 'paused', 'v', 'until', 'a')
local current = known[1] == ARGV[4] and (known[2] or '0') == ARGV[5]
local decisions = tonumber(known[1])

local refused = refusal_of(known[3], known[4], version, known[5])
if refused == nil and (known[6] or '0') ~= ARGV[6] then refused = 'moved' end
local refusal = ({paused = 2, unknown = 3, moved = 4, archived = 5})[refused] or 0

local statuses, earliers = {}, {}
local request = 3
for i = 1, (#ARGV - 6) / width do
  local base = 6 + (i - 1) * width
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
    if key then
      redis.call('SET', key, decision .. '|' .. arm .. '|' .. propensity, 'EX', ttl)
    end
    redis.call('XADD', audit, '*', 'seq', decisions, 'r', ARGV[base + 6])
    statuses[i], earliers[i] = 0, ''
  end
end
if refusal ~= 0 then return {statuses, earliers, {}} end
if current then return {statuses, earliers, decisions} end
return {statuses, earliers, redis.call('HGETALL', counters)}
