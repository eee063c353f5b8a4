-- Debits on several items of one server, sent together (`batch.rs`): KEYS[i] is the i-th
-- item, and its arguments follow their count in ARGV (count, then the arguments as
-- `debit.lua` takes them). Each debit is what `debit.lua` would do alone, and answers
-- what it would: the i-th element of the answer. One debit's failure (another type under
-- its key, a value not ours, a write refused for memory) is its own element, {-1, the
-- error's text with its code}, and the others stand. (Not an error reply inside the
-- array: the client turns any of those into a failure of the whole call.)
local out = {}
local o = 0
for i = 1, #KEYS do
  local count = tonumber(ARGV[o + 1])
  local done, answer = pcall(debit, KEYS[i], ARGV, o + 1, count)
  if done then
    out[i] = answer
  elseif type(answer) == 'table' and answer.err then
    out[i] = {-1, answer.err}
  elseif type(answer) == 'string' and string.match(answer, '^%u+ ') then
    -- Redis's own error (WRONGTYPE, OOM, READONLY…), its code kept for the caller.
    out[i] = {-1, answer}
  else
    out[i] = {-1, 'ERR user_script: ' .. tostring(answer)}
  end
  o = o + 1 + count
end
return out
