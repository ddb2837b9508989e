--[[
heartbeat: refresh a worker's liveness; read the policy version and admission state it must follow.
KEYS:
  meta       config, policy version
  workers    worker ids by last heartbeat
  holds      admission hold ids by deadline
ARGV:
  worker_id  the worker
Returns:
  {'ok', version, version_published 0|1, weights_uri, held 0|1, server_ms}
Invariant:
  the worker's score in workers is the server time of its last heartbeat; the reaper treats it as
  lost only after worker_timeout without one.
]]
-- @include bug
-- @include now_ms
-- @include load_config
-- @include hold_active
local now = now_ms()
local cfg = load_config()
if A.worker_id == '' or string.sub(A.worker_id, 1, 1) == '@' then bug('bad worker id') end
redis.call('ZADD', K.workers, now, A.worker_id)
local uri = redis.call('HGET', K.meta, 'weights_uri') or ''
return {'ok', cfg.version_eff, cfg.has_version and 1 or 0, uri, hold_active(due_now(cfg, now)) and 1 or 0, now}
