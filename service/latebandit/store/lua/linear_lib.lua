-- Shared by the scripts that keep a contextual campaign's decisions' features or add to its model's b
-- (prepended by store/redis.py to every script whose first line "-- requires: ..." names linear_lib): its sums
-- are blobs of little-endian float64 (NumPy's '<f8', store/redis.py's ``parse_model``), added element by
-- element in IEEE doubles, as the embedded store adds.

local CHUNK = 200  -- doubles per struct call: unpack's stack is bounded

-- The name a contextual decision's features are kept under: its id after the last '.', its signature
-- (store/base.py's ``features_field``). Found by plain searches: the pattern '[^.]*$', which Lua retries from
-- every position of the id, costs Redis time that grows with the square of the id's length (docs/benchmarks.md).
local function features_field(decision)
  local from, dot = 1, string.find(decision, '.', 1, true)
  while dot do
    from = dot + 1
    dot = string.find(decision, '.', from, true)
  end
  return string.sub(decision, from)
end

local formats = {}  -- struct's format of n little-endian doubles, by n, made once

local function format_of(n)
  local format = formats[n]
  if not format then
    format = '<' .. string.rep('d', n)
    formats[n] = format
  end
  return format
end

-- The doubles of ``blob`` as a table: one unpack when they fit in one (a conversion's features), whose
-- values become the table itself.
local function doubles(blob)
  local count = #blob / 8
  if count <= CHUNK then
    local values = {struct.unpack(format_of(count), blob)}
    values[count + 1] = nil  -- unpack's last value: the position after the blob
    return values
  end
  local values = {}
  for first = 1, count, CHUNK do
    local size = math.min(CHUNK, count - first + 1)
    local part = {struct.unpack(format_of(size), blob, (first - 1) * 8 + 1)}
    for i = 1, size do values[first + i - 1] = part[i] end
  end
  return values
end

local function blob_of(values)
  local parts = {}
  for first = 1, #values, CHUNK do
    local last = math.min(first + CHUNK - 1, #values)
    parts[#parts + 1] = struct.pack(format_of(last - first + 1), unpack(values, first, last))
  end
  return table.concat(parts)
end

-- Add ``values`` (a table of doubles) to the blob in ``field`` of ``key`` (absent: zeros).
local function add_doubles(key, field, values)
  local stored = redis.call('HGET', key, field)
  local total = stored and doubles(stored) or {}
  for i = 1, #values do total[i] = (total[i] or 0) + values[i] end
  redis.call('HSET', key, field, blob_of(total))
end

-- Into ``into`` (a table of doubles, absent entries zero), add ``scale`` times the values of ``blob``: what a
-- counted conversion adds to its block's b.
local function add_scaled(into, blob, scale)
  local a = doubles(blob)
  for i = 1, #a do into[i] = (into[i] or 0) + scale * a[i] end
end
