-- @include bug
--[[
ready_score: the K.ready score of an entry, from its stream ID.
Why: requeued work keeps its place (DESIGN, Buffer and staleness): ready is ordered by original
submission, so the score is ms * 2048 + seq (seq capped at 2047), exact in a double until 2100.
]]
local function ready_score(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if not ms then bug('bad entry id in ready_score: ' .. tostring(id)) end
  return string.format('%.17g', tonumber(ms) * 2048 + math.min(tonumber(seq), 2047))
end
