-- @include wake
--[[
release_executing_many: give back the executing capacity of `groups` attempts holding `samples`
samples in all, with one HINCRBY per counter.
Uses: K.counters, K.wake_work. Why: the batched form of release_executing (max_executing_samples reopens
at each attempt's terminal transition); a reaper batch sums its deltas instead of paying two
commands per entry. Blocked reservers are woken once.
]]
local function release_executing_many(groups, samples)
  if groups <= 0 then return end
  redis.call('HINCRBY', K.counters, 'executing_groups', -groups)
  -- Guarded: samples is 0 when every entry vanished, and Lua writes -0 as '-0', which HINCRBY refuses.
  if samples > 0 then redis.call('HINCRBY', K.counters, 'executing_samples', -samples) end
  wake(K.wake_work)
end
