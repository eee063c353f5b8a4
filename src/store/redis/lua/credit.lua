-- A credit on one item (KEYS[1]) under its guard: ARGV[1] the refill baseline `rf` the
-- item must hold (empty: any), ARGV[2] the shard count it must hold, ARGV[3] the
-- operation id ('': none; see `lib.lua`, `record`). Then 8 per credit: limit name, the
-- largest balance it may land on (its ceiling less the amount), the amount, its negation,
-- the `tc` below which taking the amount off saturates, and the parameters cp, ra, rp
-- the limit must still have. Returns the 0-based positions of the credits applied; run
-- again with the same operation id, what the first run returned, nothing written.
local key = KEYS[1]
local flat, f = fields(key)
if not f then return {} end
local earlier = done_before(f, ARGV[3])
if earlier then
  local applied = {}
  for i in string.gmatch(earlier, '%d+') do applied[#applied + 1] = tonumber(i) end
  return applied
end
if (ARGV[1] ~= '' and f['rf'] ~= ARGV[1]) or f['sc'] ~= ARGV[2] then return {} end
local applied = {}
local n = (#ARGV - 3) / 8
for i = 0, n - 1 do
  local a = 4 + i * 8
  local p = 'b:' .. ARGV[a] .. ':'
  local tk = f[p .. 'tk']
  if tk and f[p .. 'tc'] and f[p .. 'cp'] == ARGV[a + 5] and f[p .. 'ra'] == ARGV[a + 6]
      and f[p .. 'rp'] == ARGV[a + 7] and cmp(tk, ARGV[a + 1]) <= 0 then
    redis.call('HINCRBY', key, p .. 'tk', ARGV[a + 2])
    add_saturating(key, p .. 'tc', f[p .. 'tc'], ARGV[a + 3], ARGV[a + 4], false)
    -- Read back as Redis wrote them (a Lua number would lose digits): a second credit
    -- of the same limit sees the first.
    f[p .. 'tk'] = redis.call('HGET', key, p .. 'tk')
    f[p .. 'tc'] = redis.call('HGET', key, p .. 'tc')
    applied[#applied + 1] = i
  end
end
if #applied > 0 then record(key, ARGV[3], table.concat(applied, ','), flat) end
return applied
