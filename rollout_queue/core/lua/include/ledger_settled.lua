--[[
ledger_settled: the ledger line of a settled entry, 's|<settlement>|<attempt>|<worker>|<detail>'
(settlement 'committed' with detail '<lease id>|<step>', 'filtered' or 'dead' with detail the reason).
ledger_settled_of reads one back: (settlement, attempt, worker, detail), or nil for any other line;
is_settled says whether a line is a settled one at all.
Why: DESIGN rule 5, a settlement repeated with the same receipt answers the same, so the line a
settlement writes is the line its replay compares: both are built here and nowhere else (the owned
line 'a|...' is ledger.lua's). `worker` never holds '|' (reserve refuses such ids), so the fields split.
]]
local function ledger_settled(settlement, attempt, worker, detail)
  return 's|' .. settlement .. '|' .. attempt .. '|' .. worker .. '|' .. detail
end

local function ledger_settled_of(line)
  return string.match(line, '^s|([^|]*)|(%d+)|([^|]*)|(.*)$')
end

local function is_settled(line)
  return string.sub(line, 1, 2) == 's|'
end
