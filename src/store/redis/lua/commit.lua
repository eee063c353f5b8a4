-- Several writes, all or nothing, on items that one script may touch together (a
-- standalone server, or keys of one Cluster slot). KEYS[i] is the i-th write's item;
-- ARGV[1] a JSON array of the writes, every number a string:
--   {"create": [field, value, ...], "ttl": t?}
--   {"update": {"erf", "rf", "ttl"?, "sc"?: [read, new], "limits": [...]}}, each limit
--     {"n", "add": {"lo", "hi", "tk", "tc", "turn", "up"}} or
--     {"n", "set": [field, value, ...], "rtc"?}
--   {"debit": [[name, need, amount, negated, turn], ...], "ttl": t?}
-- ARGV[2] 'images' (else ''): a commit answers every item as it was and as it left it
-- ({1, before, after, before, after, ...}), to undo a commit spread over Cluster slots
-- (`spread.rs`). ARGV[3]: the operation id ('': none; `lib.lua`, `record`), recorded on
-- the first item when the commit writes: a second run answers {3} (with 'images', {3,
-- after, after, ...}: each item as it is now) and writes nothing.
-- Returns {1} (committed) or {0, i, image, j, image, ...}: each refused write's 0-based
-- position and its item as it is (an empty array: no item), or {2, i, bytes}: write i
-- would leave an item of that many bytes, more than DynamoDB stores (`mx`), and nothing
-- is written. That one condition is measured on the items written (each update carries
-- `kb`, its key's own bytes) and, when it fails, every item is put back as it was,
-- expiry included, before the script returns: no one sees the difference.
local op = ARGV[3] or ''
if op ~= '' and redis.call('HEXISTS', KEYS[1], 'x:' .. op) == 1 then
  local out = {3}
  if ARGV[2] == 'images' then
    for i = 1, #KEYS do out[#out + 1] = redis.call('HGETALL', KEYS[i]) end
  end
  return out
end
local writes = cjson.decode(ARGV[1])
local current = {}
local before = {}
local refused = {}
for i, w in ipairs(writes) do
  local flat, f = fields(KEYS[i])
  current[i] = f
  before[i] = flat
  local ok = true
  if w.create then
    ok = not f
  elseif w.update then
    local u = w.update
    if not f or f['rf'] ~= u.erf then
      ok = false
    elseif u.ttl and ((not f['ttl']) or cmp(u.ttl, f['ttl']) < 0) then
      -- The stored expiry is never moved earlier (none stored: never expires, the latest).
      ok = false
    elseif u.sc and f['sc'] ~= u.sc[1] then
      ok = false
    else
      for _, l in ipairs(u.limits) do
        local p = 'b:' .. l.n .. ':'
        if l.add then
          local tk = f[p .. 'tk']
          if not tk or not f[p .. 'tc'] or cmp(tk, l.add.lo) < 0 or cmp(tk, l.add.hi) > 0 then
            ok = false
          end
        elseif (f[p .. 'tc'] or false) ~= (l.rtc or false) then
          ok = false
        end
        if not ok then break end
      end
    end
  elseif w.debit then
    if not f then
      ok = false
    else
      for _, d in ipairs(w.debit) do
        local p = 'b:' .. d[1] .. ':'
        local tk = f[p .. 'tk']
        if not tk or not f[p .. 'tc'] or cmp(tk, d[2]) < 0 then
          ok = false
          break
        end
      end
    end
  end
  if not ok then
    refused[#refused + 1] = i - 1
    refused[#refused + 1] = flat
  end
end
if #refused > 0 then
  table.insert(refused, 1, 0)
  return refused
end
-- Each key's expiry, to put back should an update leave an item too large (below): its
-- time left (`PTTL`, ms; negative: none), put back by `PEXPIRE`. Not `PEXPIRETIME`, which
-- Redis 6 lacks; Redis 7 freezes the clock for a script, so the two read the same
-- instant, and on 6 the expiry comes back at most the script's own run time later.
local expiry = {}
for _, w in ipairs(writes) do
  if w.update then
    for i = 1, #writes do expiry[i] = redis.call('PTTL', KEYS[i]) end
    break
  end
end
for i, w in ipairs(writes) do
  local key = KEYS[i]
  local f = current[i]
  if w.create then
    hset_all(key, w.create)
    expire_as(key, w.ttl)
  elseif w.update then
    local u = w.update
    for _, l in ipairs(u.limits) do
      local p = 'b:' .. l.n .. ':'
      if l.add then
        redis.call('HINCRBY', key, p .. 'tk', l.add.tk)
        add_saturating(key, p .. 'tc', f[p .. 'tc'], l.add.tc, l.add.turn, l.add.up)
      else
        hset_all(key, l.set)
      end
    end
    redis.call('HSET', key, 'rf', u.rf)
    -- A raised count records when (`sa`, the write's `rf`: `BucketItem::count_raised_at`).
    if u.sc then redis.call('HSET', key, 'sc', u.sc[2], 'sa', u.rf) end
    expire_as(key, u.ttl)
  else
    for _, d in ipairs(w.debit) do
      local p = 'b:' .. d[1] .. ':'
      redis.call('HINCRBY', key, p .. 'tk', d[4])
      add_saturating(key, p .. 'tc', f[p .. 'tc'], d[3], d[5], true)
    end
    if w.ttl then expire_as(key, w.ttl) end
  end
end
for i, w in ipairs(writes) do
  if w.update then
    local bytes = item_bytes(KEYS[i], tonumber(w.update.kb))
    if bytes > tonumber(w.update.mx) then
      for j = 1, #writes do
        redis.call('DEL', KEYS[j])
        if #before[j] > 0 then
          hset_all(KEYS[j], before[j])
          if expiry[j] > 0 then redis.call('PEXPIRE', KEYS[j], expiry[j]) end
        end
      end
      return {2, i - 1, bytes}
    end
  end
end
record(KEYS[1], op, '1', before[1])
if ARGV[2] == 'images' then
  local out = {1}
  for i = 1, #writes do
    out[#out + 1] = before[i]
    out[#out + 1] = redis.call('HGETALL', KEYS[i])
  end
  return out
end
return {1}
