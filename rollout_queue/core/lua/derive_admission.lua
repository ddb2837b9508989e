--[[
derive_admission: give admission control to a queue whose config left it to its trainer.
KEYS:
  meta          config and policy version
  counters      counters (apart from meta: the worker role writes these, never the config or version)
ARGV:
  library       the caller's script library version (must equal the stored one)
  batch_groups  integer >= 1: the groups the trainer commits per published version (this
                partition's share of them on a partitioned queue)
Returns:
  {'ok', batch_groups stored now (-1 unset, 0 off, n), 1 if this call set it else 0}
  {'config_mismatch', 'library', stored, given}          another library version owns the queue
Invariant:
  batch_groups changes here only from -1 (left unset: QueueConfig's DERIVED) to the number given,
  once; a number or 0 (None: admission control explicitly off) stored by the queue's creator or by
  `config set` is never changed, so a trainer can neither loosen nor override an operator's bound.
]]
-- @include bug
-- @include load_config
local cfg = load_config()
if cfg.library ~= A.library then return {'config_mismatch', 'library', cfg.library, A.library} end
local n = tonumber(A.batch_groups)
if not n or n < 1 or n ~= math.floor(n) or n >= 9007199254740992 then
  bug('bad batch_groups: ' .. tostring(A.batch_groups))
end
if cfg.batch_groups ~= -1 then return {'ok', cfg.batch_groups, 0} end
redis.call('HSET', K.meta, 'batch_groups', A.batch_groups)
redis.call('HINCRBY', K.counters, 'config_changes', 1)
return {'ok', n, 1}
