--[[
call_batched: one Redis command over many items, e.g. XACK src rollout id1 id2 ...
Uses: nothing but its arguments. Why: a per-member command costs a full command dispatch inside the
script; batching cuts commit from ~6.5 to well under 1 command per group (benchmarks/README.md).
Items go in chunks of 1000 so unpack() stays far below Lua's C-stack limit (~8000 values).
]]
local function call_batched(head, items)
  local chunk = 1000
  for start = 1, #items, chunk do
    local args = {}
    for _, h in ipairs(head) do table.insert(args, h) end
    for i = start, math.min(#items, start + chunk - 1) do table.insert(args, items[i]) end
    redis.call(unpack(args))
  end
end
