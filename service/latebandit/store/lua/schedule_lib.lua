-- requires: campaign_lib
-- Shared by the schedule scripts (prepended by store/redis.py to every script that starts with
-- "-- requires: schedule_lib"); mirrors service/latebandit/store/schedule.py.

-- Integers as full decimal strings: Lua's tostring keeps 14 digits, and µs timestamps have 16.
local function int(x) return string.format('%.0f', x) end

local function field_reader(key)
  return function(field) return tonumber(redis.call('HGET', key, field)) end
end

-- Close, in play order, the records whose feedback is complete (the watermark or the allowed lateness has
-- passed their end): each goes to the ``closed`` list for the next plan and leaves the store. Returns the
-- id of the last closed record.
local function close_ready(sched, segments, starts, closed, now, lateness)
  local num = field_reader(sched)
  local through, watermark = num('crid') or 0, num('wm') or 0
  for _ = 1, 1000 do
    local id = int(through + 1)
    local ends = tonumber(redis.call('HGET', segments, id .. ':x'))
    if not ends or not (watermark >= ends or now >= ends + lateness) then break end
    local f = redis.call('HMGET', segments, id .. ':j', id .. ':a', id .. ':c', id .. ':f', id .. ':y', id .. ':r')
    local slots = tonumber(f[5]) - tonumber(f[4])
    redis.call('RPUSH', closed, '{"segment":' .. f[1] .. ',"slots":' .. int(slots) .. ',"reward":' .. f[6] .. '}')
    if f[3] == '1' then
      redis.call('HINCRBY', sched, 'cs:' .. f[2], slots)
      add_float(sched, 'cr:' .. f[2], tonumber(f[6]))
    end
    redis.call('HDEL', segments, id .. ':j', id .. ':a', id .. ':c', id .. ':f', id .. ':s', id .. ':x', id .. ':y',
      id .. ':r')
    redis.call('ZREM', starts, id)
    through = through + 1
    redis.call('HSET', sched, 'crid', int(through), 'cuntil', int(ends))
  end
  return through
end

