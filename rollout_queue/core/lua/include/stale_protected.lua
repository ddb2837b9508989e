-- @include hmget_many
-- @include call_batched
--[[
stale_protected: the fairness rule of the staleness modes. stale_protected(ids, cfg) is the set (id ->
true) of those of `ids` already evicted for staleness cfg.max_stale_evictions times or more (0: the
rule is off, none is); count_stale(ids) counts one more such eviction for each.
Uses: K.history (entry id -> JSON; the count is its "s" field, beside "f", the counted failures).
Why: DESIGN, Staleness modes: a long rollout spans more versions than the bound, completes stale and
would be evicted and generated again for ever while short work keeps the trainer fed. After k
evictions its next completion is judged at the version it completes under (its bound widens to fit)
and its progress is kept, so it is trained. One HMGET; the count is read with a pattern (a JSON
string's quote is always escaped, so '"s":' only matches the key) and written by decoding only the
records that exist.
]]
local function stale_count_of(raw)
  return raw and tonumber(string.match(raw, '"s":(%d+)')) or 0
end
local function stale_protected(ids, cfg)
  local out = {}
  if cfg.max_stale_evictions <= 0 or #ids == 0 then return out end
  for i, raw in ipairs(hmget_many(K.history, ids)) do
    if stale_count_of(raw) >= cfg.max_stale_evictions then out[ids[i]] = true end
  end
  return out
end
local function count_stale(ids)
  if #ids == 0 then return end
  local writes = {}
  for i, raw in ipairs(hmget_many(K.history, ids)) do
    local value = nil
    if not raw then
      value = '{"s":1,"f":0,"h":[]}'
    else
      local ok, h = pcall(cjson.decode, raw)
      if ok and type(h) == 'table' then
        h.s = stale_count_of(raw) + 1
        local encoded_ok, encoded = pcall(cjson.encode, h)
        if encoded_ok then value = encoded end
      end  -- garbage: left as it is (the rule only ever widens a bound)
    end
    if value then
      table.insert(writes, ids[i])
      table.insert(writes, value)
    end
  end
  if #writes > 0 then call_batched({'HSET', K.history}, writes) end
end
