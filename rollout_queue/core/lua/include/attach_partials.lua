-- @include partial_keys
-- @include drop_partials
-- @include hmget_many
-- @include stale_protected
--[[
attach_partials: for each reserve grant {entry_id, attempt, fields}, set its 4th element to the
byte length of the entry's progress record (0: none), which the client then reads with one HMGET
(flows.reserve): the record never passes through this script. With `fresh` (a new grant, not a
replay), in staleness_mode 'drop', a record whose oldest version is already past the staleness
bound (cfg.version - min_version > bound, once a version is published; max_staleness None: bound 0)
is dropped, its tokens counted in partial_stale and the drop counted as an eviction for staleness
(count_stale), unless the fairness rule protects the entry (stale_protected); every record handed
out adds its tokens to partial_continued.
Uses: K.meta, K.counters, K.history. Why: in 'drop' a prefix that is stale when it is handed out
would make a group the lease evicts as stale (DESIGN: Staleness modes); dropped here, the attempt
starts from the prompt instead of looping. 'continue' and 'pace' keep every prefix: the group is
judged by its newest tokens, or not at all, and the old ones are the trainer's to correct. A
replay writes nothing (reserve_replay), so it only attaches.
]]
local function attach_partials(grants, cfg, fresh)
  for _, g in ipairs(grants) do g[4] = 0 end
  if #grants == 0 or redis.call('HLEN', PARTIAL_HEAD_KEY) == 0 then return end
  local ids = {}
  for i, g in ipairs(grants) do ids[i] = g[1] end
  local heads = hmget_many(PARTIAL_HEAD_KEY, ids)
  local stale, stale_tokens, continued, counted = {}, 0, 0, {}
  local judged = fresh and cfg.has_version and cfg.staleness_mode == 'drop'
  local protected = judged and stale_protected(ids, cfg) or {}
  for i, raw in ipairs(heads) do
    local h = partial_head(raw)
    if h and judged and cfg.version - h.min_version > cfg.staleness_bound and not protected[ids[i]] then
      table.insert(stale, ids[i])
      table.insert(counted, ids[i])
      stale_tokens = stale_tokens + h.tokens
    elseif h then
      grants[i][4] = h.bytes
      continued = continued + h.tokens
    elseif raw and fresh then
      table.insert(stale, ids[i])  -- a garbage head: forget the record, start from the prompt
    end
  end
  if not fresh then return end
  if #stale > 0 then drop_partials(stale) end
  count_stale(counted)
  if stale_tokens > 0 then redis.call('HINCRBY', K.counters, 'partial_stale', stale_tokens) end
  if continued > 0 then redis.call('HINCRBY', K.counters, 'partial_continued', continued) end
end
