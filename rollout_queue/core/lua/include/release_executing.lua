-- @include wake
--[[
release_executing: give back the executing capacity of one attempt (its group's n samples).
Uses: K.counters, K.wake_work. Why: max_executing_samples reopens at the attempt's terminal transition
and nowhere else (DESIGN, Capacity); blocked reservers are woken.
]]
local function release_executing(n)
  redis.call('HINCRBY', K.counters, 'executing_groups', -1)
  -- Guarded: n is 0 when the entry vanished, and Lua writes -0 as '-0', which HINCRBY refuses.
  if n > 0 then redis.call('HINCRBY', K.counters, 'executing_samples', -n) end
  wake(K.wake_work)
end
