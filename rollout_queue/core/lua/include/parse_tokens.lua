-- @include bug
--[[
parse_tokens: a completion's declared token count (ARGV) as a number, or a ROLLOUTQ error.
Uses: nothing but its arguments. Why: the script never reads a payload, so the tokens a completion
holds (every sample's token ids, summed by the client) come in as one integer, counted in
counters.tokens_generated when the completion is adopted and kept beside its payload until it is
trained or thrown away (payloads.lua). A decimal integer in 0..2^31 - 1 (flows/worker.py
MAX_COMPLETION_TOKENS); anything else is a client bug, refused before the first write. A forged
count skews the token counters, never ownership.
]]
local MAX_TOKENS = 2147483647
local function parse_tokens(raw)
  if type(raw) ~= 'string' or not string.match(raw, '^%d+$') or tonumber(raw) > MAX_TOKENS then
    bug('bad tokens: ' .. tostring(raw) .. ' (a completion declares its token count, 0..2^31 - 1)')
  end
  return tonumber(raw)
end
