--[[
bug: raise a Redis error reply prefixed ROLLOUTQ.
Why: refusals are data (a status word); an error reply means a bug or corrupt state, and the prefix
lets the client map it to a typed exception (STYLE: reserve error_reply for bugs).
]]
local function bug(msg)
  error({err = 'ROLLOUTQ ' .. msg})
end
