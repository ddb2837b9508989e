-- @include bug
--[[
parse_receipt: ARGV entry_id, attempt, worker_id as checked values.
Why: a bad receipt is a client bug (the Python Receipt type validates first), never a refusal.
]]
local function parse_receipt(id, attempt, worker)
  if not string.match(id or '', '^%d+%-%d+$') then bug('bad entry id: ' .. tostring(id)) end
  local a = tonumber(attempt)
  if not a or a < 1 then bug('bad attempt: ' .. tostring(attempt)) end
  if worker == nil or worker == '' or string.sub(worker, 1, 1) == '@' then bug('bad worker id') end
  return id, a, worker
end
