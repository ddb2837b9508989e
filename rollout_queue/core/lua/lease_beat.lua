--[[
lease_beat: leased -> leased: the holder of an active lease is alive; stamp its record with the queue
time and move the lease's due time (its `leases` score) to the earlier of its deadline and
trainer_silence after now.
KEYS:
  meta       config
  leases     lease ids by when they fall due (lease_due: the deadline, or sooner for a silent holder)
  The lease record rollout:{q}:lease:<lease_id> is built from meta's prefix (same hash tag).
READS:
  counters   counters (read only: load_config checks they are integers)
ARGV:
  lease_id   the lease
  token      its fencing token
Returns:
  {'ok', deadline_ms, due_ms, silence_ms}
                                the lease's deadline, when the reaper takes it if no beat follows,
                                and the stored trainer_silence (0: off), which paces the beats
  {'lease_lost', state}         state: 'unknown', 'token', 'committed', 'rolled_back', 'expired' (also
                                when the deadline has passed); nothing written: stop beating
Invariant:
  only the holder of an active, unexpired lease stamps it (beat_ms); its `leases` score is then
  min(deadline, beat_ms + trainer_silence), so a holder that stops beating is rolled back by the
  reaper (expire_lease) trainer_silence after its last beat, and a lease that never beat keeps its
  deadline. The deadline itself never moves here (extend moves it).
]]
-- @include now_ms
-- @include load_config
-- @include lease_record
-- @include lease_due
local now = now_ms()
local cfg = load_config()
local lease_key = string.sub(K.meta, 1, -5) .. 'lease:' .. A.lease_id
local L, refusal = lease_fenced(lease_key, A.token)
if not L then return refusal end
if L.state ~= 'active' then return {'lease_lost', L.state} end
if L.deadline < due_now(cfg, now) then return {'lease_lost', 'expired'} end
local due = lease_due(cfg, L.deadline, now)
redis.call('HSET', lease_key, 'beat_ms', now)
redis.call('ZADD', K.leases, due, A.lease_id)
return {'ok', L.deadline, due, cfg.trainer_silence_ms or 0}
