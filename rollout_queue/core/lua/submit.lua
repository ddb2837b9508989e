--[[
submit: new source groups -> backlog (one XADD each), idempotent by source_id.
KEYS:
  src        the reservations stream
  ids        hash source_id -> entry ID
  intake     counters of what was submitted (the only key a producer writes besides ids and src)
  wake_work  wake stream for blocked reservers
READS:
  meta       config (read only: the producer's ACL role may only read meta)
  counters   counters (read only: load_config checks they are integers)
ARGV:
  *groups    5 values per group: source_id, n, parents JSON, body (orjson), schema version
Returns:
  {'ok', new_count, entry_id, ...}           one entry ID per group, in order
  {'payload_too_large', index, bytes, limit} nothing written
Invariant:
  each source_id maps to exactly one entry ID; a source_id already submitted stores nothing.
]]
-- @include load_config
-- @include oversized_group
-- @include add_groups
local cfg = load_config()
local refused = oversized_group(A.groups, cfg.max_payload_bytes)
if refused then return refused end
local ids, new = add_groups(A.groups)
local out = {'ok', new}
for _, id in ipairs(ids) do table.insert(out, id) end
return out
