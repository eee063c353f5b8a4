-- shardgate's Redis store: what every script shares. Numbers travel and are stored as
-- canonical decimal strings (as Redis's HINCRBY writes them) and are compared here as
-- strings, exactly: Lua's numbers are doubles, and balances reach 2^62. Sums are made by
-- HINCRBY (exact 64-bit) after the caller checked they stay in range. Every condition of
-- a script is checked before its first write, so a refused call writes nothing (the one
-- exception, an item's size after a commit's update, is measured once written, and undone
-- in the same script when too large: `commit.lua`).

-- The library functions the debit path calls, as locals (a global is two lookups).
local byte, format, find, concat = string.byte, string.format, string.find, table.concat

-- -1, 0 or 1 as a < b, a == b, a > b, for canonical decimal integers of any length.
local function cmp(a, b)
  local na = byte(a, 1) == 45
  local nb = byte(b, 1) == 45
  if na ~= nb then
    if na then return -1 else return 1 end
  end
  local r
  if #a ~= #b then
    if #a < #b then r = -1 else r = 1 end
  elseif a == b then
    return 0
  elseif a < b then
    r = -1
  else
    r = 1
  end
  if na then return -r end
  return r
end

local I64_MAX = '9223372036854775807'
local I64_MIN = '-9223372036854775808'

-- The item's fields by name ({} and false when there is no item).
local function fields(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then return flat, false end
  local f = {}
  for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
  return flat, f
end

-- Adds `delta` to an integer field, saturating at the i64 bounds as the other stores do:
-- `turn` is the value past which the sum would leave i64 (computed by the caller), `up`
-- whether delta is positive.
local function add_saturating(key, field, current, delta, turn, up)
  if up and cmp(current, turn) > 0 then
    redis.call('HSET', key, field, I64_MAX)
  elseif (not up) and cmp(current, turn) < 0 then
    redis.call('HSET', key, field, I64_MIN)
  else
    redis.call('HINCRBY', key, field, delta)
  end
end

-- Subtracts `amount` from `field`'s balance and adds it to `tc` beside it (`p`: the
-- limit's field prefix, `f`: the item's fields as found, kept current here so that a
-- later write to the same limit starts from this one), saturating `tc` past `turn`.
-- Integers of at most 15 characters are exact as Lua's doubles, and so are their sums
-- (below 2^53): those are computed here and queued on `sets` for one HSET, instead of
-- two HINCRBY calls each (measured: about 0.4 µs of a debit's ~10 in Redis). Longer ones
-- take the exact path.
local function take(key, f, sets, p, amount, negated, turn)
  local ktk, ktc = p .. 'tk', p .. 'tc'
  local tk, tc = f[ktk], f[ktc]
  if #tk <= 15 and #tc <= 15 and #amount <= 15 then
    local n = tonumber(amount)
    tk = format('%d', tk - n)
    tc = format('%d', tc + n)
    local s = #sets
    sets[s + 1] = ktk
    sets[s + 2] = tk
    sets[s + 3] = ktc
    sets[s + 4] = tc
  else
    -- What is queued goes first: this path reads back what Redis holds.
    if #sets > 0 then
      redis.call('HSET', key, unpack(sets))
      for i = #sets, 1, -1 do sets[i] = nil end
    end
    redis.call('HINCRBY', key, ktk, negated)
    add_saturating(key, ktc, tc, amount, turn, true)
    tk = redis.call('HGET', key, ktk)
    tc = redis.call('HGET', key, ktc)
  end
  f[ktk] = tk
  f[ktc] = tc
end

-- Operations that run once. A script the client may send again after a lost connection
-- (the Cluster client does; the store does for these) carries an operation id, `op`
-- ('': none). When it writes, it records on its item the field `x:{op}` = '{ms}:{answer}'
-- (Redis's clock, and what it answered, without spaces: images are joined by spaces),
-- and a run that finds the record answers what the first run did and writes nothing.
-- Records older than OP_KEEP_MS (far past any resend: a call's deadline is seconds) are
-- dropped by the next record on the item, and an item keeps at most OP_MAX (the oldest
-- go first). Readers of an item skip `x:` fields; they are not the item's.
local OP_KEEP_MS = 120000
local OP_MAX = 16

-- What an earlier run of `op` answered on the item whose fields are `f` (nil: none).
local function done_before(f, op)
  if op == '' or not f then return nil end
  local record = f['x:' .. op]
  if not record then return nil end
  return string.match(record, '^%d+:(.*)$') or ''
end

-- Whether a field is an operation's record.
local function is_record(field)
  return byte(field, 1) == 120 and byte(field, 2) == 58
end

-- Records that `op` ran on `key` and answered `answer`; `flat`: the item's fields as the
-- script found them (the records to prune).
local function record(key, op, answer, flat)
  if op == '' then return end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local kept = {}
  for i = 1, #flat, 2 do
    if is_record(flat[i]) then
      local at = tonumber(string.match(flat[i + 1], '^(%d+)')) or 0
      if now - at > OP_KEEP_MS then
        redis.call('HDEL', key, flat[i])
      else
        kept[#kept + 1] = {at, flat[i]}
      end
    end
  end
  if #kept >= OP_MAX then
    table.sort(kept, function(a, b) return a[1] < b[1] end)
    for i = 1, #kept - OP_MAX + 1 do redis.call('HDEL', key, kept[i][2]) end
  end
  redis.call('HSET', key, 'x:' .. op, format('%d', now) .. ':' .. answer)
end

-- The bytes DynamoDB counts for a number given as a canonical decimal string: one per two
-- significant digits, plus one (`store/key.rs`, `number_bytes`).
local function number_bytes(v)
  local digits = v:gsub('^-', ''):gsub('0+$', '')
  if digits == '' then return 2 end
  return math.floor((#digits + 1) / 2) + 1
end

-- The bytes DynamoDB would count for the item at `key` (`store/key.rs`, `item_bytes`):
-- `kb` for the key's own attributes, then each field's name as DynamoDB spells it and
-- its value (a limit's `b:{name}:tk` is `b_{name}_tk` there, counted one byte longer).
local function item_bytes(key, kb)
  local flat = redis.call('HGETALL', key)
  local bytes = kb
  for i = 1, #flat, 2 do
    local field = flat[i]
    if is_record(field) then
      -- An operation's record: not the item's, not DynamoDB's.
    elseif field == 'rf' then
      bytes = bytes + 2
    elseif field == 'sc' then
      bytes = bytes + 11
    elseif field == 'ttl' then
      bytes = bytes + 3
    elseif field == 'sa' then
      bytes = bytes + 2
    else
      bytes = bytes + #field + 1
    end
    if not is_record(field) then bytes = bytes + number_bytes(flat[i + 1]) end
  end
  return bytes
end

-- HSET of a flat field/value list, in chunks (Lua's unpack has a bounded stack).
local function hset_all(key, list)
  for i = 1, #list, 200 do
    redis.call('HSET', key, unpack(list, i, math.min(i + 199, #list)))
  end
end

-- The item's `ttl` field (epoch seconds; none: never expires) and the key's own expiry,
-- which follows it: at `ttl` an item is full again, the same as no item, so Redis may
-- drop it. Never before Redis's own clock plus a grace, though: a server whose clock runs
-- ahead of Redis's (or a `ttl` already past when written) must still find the item
-- until it is surely full by every clock, as DynamoDB's sweeper leaves expired items a
-- while. Both only ever move later (the callers' conditions see to the field; Redis's
-- clock only moves on).
-- A `ttl` past LATEST_EXPIRY (a debt so deep it repays in millennia) leaves the key
-- without an expiry, as Redis refuses one that far (and Lua's doubles would round it).
local EXPIRY_GRACE = 60
local LATEST_EXPIRY = '100000000000'
-- Redis's clock, read once per script: a batch of debits creating many items asks once.
local clock = false
-- The key's own expiry for an item whose `ttl` field is `ttl` (see above); `fresh`: the
-- key was just made, so it has no expiry to take away.
local function expire_key(key, ttl, fresh)
  if ttl and cmp(ttl, LATEST_EXPIRY) > 0 then
    if not fresh then redis.call('PERSIST', key) end
  elseif ttl then
    if not clock then clock = tonumber(redis.call('TIME')[1]) end
    local at = tonumber(ttl)
    if at < clock then at = clock end
    redis.call('EXPIREAT', key, string.format('%d', at + EXPIRY_GRACE))
  elseif not fresh then
    redis.call('PERSIST', key)
  end
end
local function expire_as(key, ttl)
  if ttl then
    redis.call('HSET', key, 'ttl', ttl)
  else
    redis.call('HDEL', key, 'ttl')
  end
  expire_key(key, ttl, false)
end

-- An image for a debit's answer: the item's field and value strings as one string,
-- joined by single spaces — one reply string to write and for the client to parse, not
-- one per field (measured: parsing the replies was about 6% of a server's time on
-- distinct buckets). As the list itself when a field's name holds a space (no rule names
-- a limit so; the contract allows it), which the client reads as well. Values are not
-- looked at: every one is an integer a script wrote (a writer of other values could as
-- well write any balance). Operations' records are left out (a hot shard whose leases
-- come back holds up to OP_MAX of them, and every debit's answer would carry them).
local function image(flat)
  local records = false
  for i = 1, #flat, 2 do
    if find(flat[i], ' ', 1, true) then return flat end
    if byte(flat[i], 1) == 120 and byte(flat[i], 2) == 58 then records = true end
  end
  if records then
    local kept = {}
    for i = 1, #flat, 2 do
      if not is_record(flat[i]) then
        kept[#kept + 1] = flat[i]
        kept[#kept + 1] = flat[i + 1]
      end
    end
    flat = kept
  end
  return concat(flat, ' ')
end

-- A debit on one item, `key`: its arguments are A[o + 1] … A[o + count] (`count` of
-- them), laid out as `debit.lua` describes. Returns that script's answer.
local function debit(key, A, o, count)
  local flat, f = fields(key)
  if not f then
    if A[o + 3] == '' then return {0} end
    local item = {}
    for word in string.gmatch(A[o + 3], '[^ ]+') do item[#item + 1] = word end
    local ttl = A[o + 4] ~= '' and A[o + 4]
    if ttl then
      item[#item + 1] = 'ttl'
      item[#item + 1] = ttl
    end
    hset_all(key, item)
    expire_key(key, ttl, true)
    return {2}
  end
  local fast = A[o + 2] ~= ''
  local ok = true
  if fast then
    if f['ttl'] and cmp(f['ttl'], A[o + 1]) <= 0 then ok = false end
    if f['sc'] ~= A[o + 2] then ok = false end
    local w = f['b:wcu:tk']
    if not w or cmp(w, '1000') < 0 then ok = false end
  end
  local first = o + 5
  local n = (count - 4) / 8
  -- Each limit's field prefix, made once for the checks and the writes.
  local prefixes = {}
  for i = 0, n - 1 do
    if not ok then break end
    local a = first + i * 8
    local p = 'b:' .. A[a] .. ':'
    prefixes[i + 1] = p
    local tk = f[p .. 'tk']
    if not tk or not f[p .. 'tc'] then
      ok = false
    elseif cmp(tk, A[a + 1]) < 0 then
      ok = false
    elseif fast and A[a + 5] ~= '' and (f[p .. 'cp'] ~= A[a + 5] or f[p .. 'ra'] ~= A[a + 6] or f[p .. 'rp'] ~= A[a + 7]) then
      ok = false
    end
  end
  if not ok then return {0, image(flat)} end
  local sets = {}
  for i = 0, n - 1 do
    local a = first + i * 8
    take(key, f, sets, prefixes[i + 1], A[a + 2], A[a + 3], A[a + 4])
  end
  if fast then
    take(key, f, sets, 'b:wcu:', '1000', '-1000', '9223372036854774807')
  end
  if #sets > 0 then redis.call('HSET', key, unpack(sets)) end
  return {1, image(flat)}
end
