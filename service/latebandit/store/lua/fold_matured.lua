-- requires: campaign_lib
-- Fold matured histogram cells into the arms' matured counters; a cell already folded is skipped.
-- KEYS: counters, cells. ARGV: number of moments J, then arm, bucket pairs.
local counters, cells = KEYS[1], KEYS[2]
local moments = tonumber(ARGV[1])
local folded = false
for i = 2, #ARGV - 1, 2 do
  local cell = ARGV[i] .. ':' .. ARGV[i + 1] .. ':'
  local count = redis.call('HGET', cells, cell .. 'c')
  if count then
    redis.call('HINCRBY', counters, 'm:' .. ARGV[i], count)
    folded = true
    local fields = {cell .. 'c', cell .. 'o', cell .. 'v', cell .. 'f'}
    for j = 1, moments do fields[#fields + 1] = cell .. 'e' .. j end
    redis.call('HDEL', cells, unpack(fields))
  end
end
if folded then stamp_counters(counters) end
return 1
