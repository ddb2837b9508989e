-- @include bug
--[[
oversized_group: the first group of a flat submit list whose payload exceeds max_payload_bytes.
Uses: nothing but its arguments (g: 5 values per group, as submit and produce take them).
Why: a refusal must come before the first write, so every caller that adds groups checks them all
first; returns nil, or {'payload_too_large', index, bytes, limit} ready to return as the reply.
]]
local function oversized_group(g, limit)
  if #g % 5 ~= 0 then bug('groups take 5 values each, got ' .. #g) end
  for i = 1, #g, 5 do
    local size = #g[i] + #g[i + 2] + #g[i + 3]
    if size > limit then return {'payload_too_large', (i - 1) / 5, size, limit} end
  end
  return nil
end
