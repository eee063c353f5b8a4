-- Undoes one write of a commit spread over Cluster slots (`spread.rs`), exactly, when
-- nothing touched its item since: KEYS[1] the item, ARGV[1] a JSON object {"post":
-- [field, value, ...], "pre": [...]}, the item as the write left it and as it was before
-- (empty: there was none), ARGV[2] the operation id ('': none; `lib.lua`, `record`). When
-- the item still holds exactly `post` it is put back as `pre` (or deleted; then no
-- record is kept, and a second run finds no item and answers 0: the claim's give-back
-- that follows finds no item either); returns 1. Otherwise returns 0 and writes nothing.
-- Run again after it put the item back, it answers 1 and writes nothing.
local key = KEYS[1]
local undo = cjson.decode(ARGV[1])
local flat, f = fields(key)
if done_before(f, ARGV[2]) then return 1 end
if not f or #flat ~= #undo.post then return 0 end
for i = 1, #undo.post, 2 do
  if f[undo.post[i]] ~= undo.post[i + 1] then return 0 end
end
redis.call('DEL', key)
if #undo.pre > 0 then
  hset_all(key, undo.pre)
  local ttl = nil
  for i = 1, #undo.pre, 2 do
    if undo.pre[i] == 'ttl' then ttl = undo.pre[i + 1] end
  end
  expire_as(key, ttl)
  record(key, ARGV[2], '1', undo.pre)
end
return 1
