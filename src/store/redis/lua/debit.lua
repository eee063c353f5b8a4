-- A debit on one item (KEYS[1]): the fast path (ARGV[2], the shard count, set) or the
-- consumption-only retry (ARGV[2] empty). ARGV[1]: now, epoch seconds. ARGV[3]: how many
-- field/value strings of an item to create follow ARGV[4] (0: none), ARGV[4] its `ttl`
-- (empty: never expires): where the key holds no item, that item is written as sent —
-- the seed of a `debit_or_create` with the debit already applied, its conditions
-- checked by the caller on the seed (`codec.rs`, `created`) — and nothing else is done.
-- Then 8 per debit: limit name, the least balance that covers it, the amount, its
-- negation, the `tc` past which adding the amount saturates, and the parameters cp, ra,
-- rp the fast path requires (empty: none). Returns {0} (no item, nothing written),
-- {0, image} (refused), {1, image}, or {2} (created as sent).
local key = KEYS[1]
local flat, f = fields(key)
local seeded = tonumber(ARGV[3])
local first = 5 + seeded
if not f then
  if seeded == 0 then return {0} end
  local item = {}
  for i = 5, first - 1 do item[#item + 1] = ARGV[i] end
  hset_all(key, item)
  if ARGV[4] ~= '' then expire_as(key, ARGV[4]) else expire_as(key, false) end
  return {2}
end
local fast = ARGV[2] ~= ''
local ok = true
if fast then
  if f['ttl'] and cmp(f['ttl'], ARGV[1]) <= 0 then ok = false end
  if f['sc'] ~= ARGV[2] then ok = false end
  local w = f['b:wcu:tk']
  if not w or cmp(w, '1000') < 0 then ok = false end
end
local n = (#ARGV - first + 1) / 8
for i = 0, n - 1 do
  if not ok then break end
  local a = first + i * 8
  local p = 'b:' .. ARGV[a] .. ':'
  local tk = f[p .. 'tk']
  if not tk or not f[p .. 'tc'] then
    ok = false
  elseif cmp(tk, ARGV[a + 1]) < 0 then
    ok = false
  elseif fast and ARGV[a + 5] ~= '' and (f[p .. 'cp'] ~= ARGV[a + 5] or f[p .. 'ra'] ~= ARGV[a + 6] or f[p .. 'rp'] ~= ARGV[a + 7]) then
    ok = false
  end
end
if not ok then return {0, flat} end
for i = 0, n - 1 do
  local a = first + i * 8
  local p = 'b:' .. ARGV[a] .. ':'
  redis.call('HINCRBY', key, p .. 'tk', ARGV[a + 3])
  add_saturating(key, p .. 'tc', f[p .. 'tc'], ARGV[a + 2], ARGV[a + 4], true)
end
if fast then
  redis.call('HINCRBY', key, 'b:wcu:tk', '-1000')
  add_saturating(key, 'b:wcu:tc', f['b:wcu:tc'], '1000', '9223372036854774807', true)
end
return {1, redis.call('HGETALL', key)}
