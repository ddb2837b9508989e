--[[
read_completion_counters / write_completion_counters: the counters a completion moves (arrivals,
completed_total, executing_groups, executing_samples, tokens_generated), read once and written once per call.
Uses: K.counters. Why: one HMGET and one HSET per script call instead of four HINCRBYs per completion;
read and write happen inside one script, so this is as atomic as HINCRBY. The arrival numbers (buffer
order) come from the first read: no other helper writes arrivals. end_attempt (a malformed completion)
moves executing_* through HINCRBY: the caller then marks the batch dirty, and the write reads the
counters again first, so no increment is lost. load_config has already refused non-integer counters.
]]
local COMPLETION_COUNTERS = {'arrivals', 'completed_total', 'executing_groups', 'executing_samples',
  'tokens_generated'}
local function read_completion_counters(b)
  local v = redis.call('HMGET', K.counters, unpack(COMPLETION_COUNTERS))
  b.base, b.dirty = {}, false
  for i, name in ipairs(COMPLETION_COUNTERS) do b.base[name] = tonumber(v[i]) or 0 end
  return b.base
end
local function write_completion_counters(b)
  local moved = false
  for _, name in ipairs(COMPLETION_COUNTERS) do moved = moved or b.delta[name] ~= 0 end
  if not moved then return end
  local base = b.base
  if not base or b.dirty then base = read_completion_counters(b) end
  local args = {'HSET', K.counters}
  for _, name in ipairs(COMPLETION_COUNTERS) do
    if b.delta[name] ~= 0 then
      base[name] = base[name] + b.delta[name]
      b.delta[name] = 0
      table.insert(args, name)
      table.insert(args, string.format('%d', base[name]))  -- never '1e+15' or '-0'
    end
  end
  redis.call(unpack(args))
end
