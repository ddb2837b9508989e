-- @include bug
--[[
check_partial: validate a progress record's arguments before any write. Returns nil (go on) or the
refusal reply {'partial_too_large', size, limit} (the record is over cfg.max_partial_bytes, 0: no
record is ever kept); a token count or version that is not a decimal integer, or an empty record,
is a caller bug (ROLLOUTQ error).
Uses: nothing but its arguments. Why: DESIGN rule "validate before the first write": save_partial
and abort refuse a record over the bound whole, so a refusal leaves every key as it was, and the
bound holds for every client whatever it sends (the flows check it before sending, PartialTooLarge).
]]
local function check_partial(tokens, min_version, record, cfg)
  if not string.match(tokens, '^%d+$') or tonumber(tokens) < 1 then bug('bad progress token count: ' .. tokens) end
  if not string.match(min_version, '^%d+$') then bug('bad progress min_version: ' .. min_version) end
  if #record == 0 then bug('empty progress record') end
  if #record > cfg.max_partial_bytes then return {'partial_too_large', #record, cfg.max_partial_bytes} end
  return nil
end
