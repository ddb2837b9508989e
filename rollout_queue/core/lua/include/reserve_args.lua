-- @include bug
--[[
parse_reserve_args: reserve's ARGV worker_id, max_groups, max_samples and overcommit as checked
values: (worker, max_groups, max_samples); overcommit is only checked ('0' or '1').
Why: a bad value is a client bug (flows.reserve validates first), never a refusal. The worker id is
a PEL consumer name and a field of the reserves line ('<request id>|<entry IDs>'), so it may not be
empty, start with @ (the queue's own owners) or contain '|'.
]]
local function parse_reserve_args(worker, max_groups, max_samples, overcommit)
  if worker == '' or string.sub(worker, 1, 1) == '@' or string.find(worker, '|', 1, true) then
    bug('bad worker id: ' .. worker)
  end
  local groups, samples = tonumber(max_groups), tonumber(max_samples)
  if not groups or groups < 1 or groups ~= math.floor(groups) or not samples
      or samples < 0 or samples ~= math.floor(samples) then
    bug('bad max_groups/max_samples')
  end
  if overcommit ~= '0' and overcommit ~= '1' then bug('bad overcommit: ' .. tostring(overcommit)) end
  return worker, groups, samples
end
