-- Undoes one write of a commit spread over Cluster slots (`spread.rs`), exactly, when
-- nothing touched its item since: KEYS[1] the item, ARGV[1] a JSON object {"post":
-- [field, value, ...], "pre": [...]}, the item as the write left it and as it was before
-- (empty: there was none). When the item still holds exactly `post` it is put back as
-- `pre` (or deleted); returns 1. Otherwise returns 0 and writes nothing.
local key = KEYS[1]
local undo = cjson.decode(ARGV[1])
local flat, f = fields(key)
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
end
return 1
