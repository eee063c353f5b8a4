-- A debit on one item (KEYS[1]): the fast path (ARGV[2], the shard count, set) or the
-- consumption-only retry (ARGV[2] empty). ARGV[1]: now, epoch seconds. ARGV[3]: the item
-- to create where the key holds none, its field/value strings joined by single spaces
-- ('': none), ARGV[4] its `ttl` (empty: never expires). Such an item is written as sent —
-- the seed of a `debit_or_create` with the debit already applied, its conditions checked
-- by the caller on the seed (`codec.rs`, `created`) — and nothing else is done. One
-- string, split only here where it is used: most debits find their item, and each
-- argument costs Redis a string to parse and Lua one to intern.
-- Then 8 per debit: limit name, the least balance that covers it, the amount, its
-- negation, the `tc` past which adding the amount saturates, and the parameters cp, ra,
-- rp the fast path requires (empty: none). Returns {0} (no item, nothing written),
-- {0, image} (refused), {1, image} (applied; the image as it was BEFORE the debit, which
-- the caller applies itself, `codec.rs`, `debited` — cheaper than reading the hash back),
-- or {2} (created as sent).
local key = KEYS[1]
local flat, f = fields(key)
if not f then
  if ARGV[3] == '' then return {0} end
  local item = {}
  for word in string.gmatch(ARGV[3], '[^ ]+') do item[#item + 1] = word end
  hset_all(key, item)
  if ARGV[4] ~= '' then expire_as(key, ARGV[4]) else expire_as(key, false) end
  return {2}
end
local first = 5
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
local sets = {}
for i = 0, n - 1 do
  local a = first + i * 8
  take(key, f, sets, 'b:' .. ARGV[a] .. ':', ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
end
if fast then
  take(key, f, sets, 'b:wcu:', '1000', '-1000', '9223372036854774807')
end
if #sets > 0 then redis.call('HSET', key, unpack(sets)) end
return {1, flat}
