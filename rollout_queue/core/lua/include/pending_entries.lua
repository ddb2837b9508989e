--[[
pending_entries: up to `budget` PEL entries of `owner` as records {id = entry ID, attempt = delivery
count}, oldest first.
Uses: K.src. Why: the batched transitions (end_attempts, requeue_entries) take these records; the
delivery count XPENDING reports is the attempt number a receipt names, so it travels with the id.
]]
local function pending_entries(owner, budget)
  local entries = {}
  for _, p in ipairs(redis.call('XPENDING', K.src, 'rollout', '-', '+', budget, owner)) do
    table.insert(entries, {id = p[1], attempt = tonumber(p[4])})
  end
  return entries
end
