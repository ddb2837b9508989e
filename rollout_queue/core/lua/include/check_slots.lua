--[[
check_slots: why a completion's outputs do not fit its group (DESIGN rule 3), or nil when they do.
Uses: nothing but its arguments: `slots` is the comma-separated parent slot of every output, `n` the
group's parent count. Why: every output names a parent slot of this group and every slot has at least
one output (one-to-many is fine); complete and complete_many refuse exactly the same completions.
]]
local function check_slots(slots, n)
  local seen, covered = {}, 0
  for s in string.gmatch(slots, '[^,]+') do
    local slot = tonumber(s)
    if not slot or slot < 0 or slot >= n or slot ~= math.floor(slot) then
      return 'output names slot ' .. s .. ' outside 0..' .. (n - 1)
    end
    if not seen[slot] then seen[slot] = true covered = covered + 1 end
  end
  if covered < n then return (n - covered) .. ' of ' .. n .. ' slots have no output' end
  return nil
end
