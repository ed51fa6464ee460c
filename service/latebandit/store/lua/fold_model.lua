-- Fold the first decisions of a contextual campaign's ``decided`` string into its model's Σ AAᵀ: the caller read
-- the model and ``decided`` in one transaction and added them up (NumPy, off the request path); the grams it
-- sends are the model's plus the first ARGV[3] bytes of ``decided``, which go. Decisions appended since its read
-- stay. Nothing is written unless the state is still the one read: the same policy version (a change starts a
-- fresh model) and the same fold (another worker's fold, or a rebuild, writes a new one), of a campaign that
-- still exists.
-- KEYS: counters, model, decided. ARGV: the caller's policy version, the fold read ('' for none), the bytes
-- folded, the new fold, then pairs: block, its Σ AAᵀ (float64 blob). Returns 1 folded, 0 not (the state moved on: nothing to undo).
local counters, model, decided = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', counters) == 0 then return 0 end  -- deleted (purged): a fold must not bring keys back
if (redis.call('HGET', counters, 'v') or '1') ~= ARGV[1] or (redis.call('HGET', model, 'fold') or '') ~= ARGV[2] then
  return 0
end
for pair = 5, #ARGV, 2 do redis.call('HSET', model, 'g:' .. ARGV[pair], ARGV[pair + 1]) end
redis.call('HSET', model, 'fold', ARGV[4])
local rest = redis.call('GETRANGE', decided, ARGV[3], -1)
if rest == '' then redis.call('DEL', decided) else redis.call('SET', decided, rest) end
return 1
