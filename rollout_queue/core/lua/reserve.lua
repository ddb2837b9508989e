--[[
reserve: ready, then backlog -> executing for one worker; the attempt is the PEL delivery count.
KEYS:
  src        the reservations stream
  ready      requeued entry IDs by submission order
  buffer     completed entry IDs by arrival (for backpressure)
  bufver     completed entry IDs by (min_version, arrival): stale ones are evicted first
  workers    worker ids by last heartbeat
  reserves   worker id -> the last reserve's request id and entry IDs (for replay)
  holds      admission hold ids by deadline
  history    entry ID -> counted failures and recent attempt reasons
  ledger     entry ID -> last terminal or settlement
  parked     entry ID -> record of a group parked dead here (the reaper's settle_parked ends it)
  wake_work  wake stream for blocked reservers
  progress   worker id -> reported counts (a reaped worker's is deleted)
  reaped     capped stream of reaped workers
  retired    worker ids deregistered while their consumer may remain, by when
  counters   counters (apart from meta: the worker role writes these, never the config or version)
READS:
  meta       config and policy version (read only: the worker role may not write meta)
  leased     entry ID -> its lease (leased_guard: a leased group is moved only by its lease)
ARGV:
  worker_id   string, the PEL consumer name; may not start with @
  max_groups  count, at most this many groups
  max_samples count, at most this many samples in all (0: only the queue's bound)
  request_id  string, the client's id for this call; a retry with the same id replays the answer
  overcommit  0 or 1: the caller queues samples internally, so the oldest group larger than
              max_samples may be its first grant (DESIGN.md: groups larger than a caller's slots)
Returns:
  {status, version, version_published 0|1, wake_id, dead_lettered, {{entry_id, attempt, fields, progress_bytes}, ...}}
  status 'ok' when something was granted (or a replay), else why not: 'held', 'backpressure',
  'capacity', 'admission', 'retained_full', 'empty', 'oversized' (only groups larger than
  max_samples were there, left for another caller), 'retry' (garbage was dead-lettered: call
  again now); wake_id is set when nothing was granted. At most RESERVE_MAX_GROUPS groups and about
  RESERVE_MAX_BYTES of reservations per call, whatever max_groups asks (bounded script time).
  progress_bytes: its progress record's length (0: none), read by the client after the call.
Invariant:
  every granted entry is owned by worker_id in the PEL with delivery count = attempt; executing
  samples <= max_executing_samples, retained <= max_retained_groups, admitted <= (version +
  max_staleness + 1) * batch_groups; granted samples <= max_samples unless overcommit (then one
  group beyond it at most); malformed reservations met on the way are settled dead; stale
  buffered groups are evicted first (bounded), so backpressure never waits on stale groups.
]]
-- @include now_ms
-- @include load_config
-- @include reserve_args
-- @include reserve_replay
-- @include reap_some_worker
-- @include evict_stale_some
-- @include hold_active
-- @include reserve_budget
-- @include reserve_fit
-- @include reserve_ready
-- @include reserve_backlog
-- @include reserve_answer
-- @include attach_partials
local now = now_ms()
local cfg = load_config()
local worker, max_groups, max_samples = parse_reserve_args(A.worker_id, A.max_groups, A.max_samples, A.overcommit)
local version, published = cfg.version_eff, cfg.has_version and 1 or 0
redis.call('ZADD', K.workers, now, worker)
-- A retry of the same call (connection lost before the reply) replays the entries it granted that
-- the worker still owns, instead of granting more: a worker never holds work it is not executing.
local replay = reserve_replay(worker, A.request_id, version, published)
if replay then attach_partials(replay[6], cfg, false) return replay end

reap_some_worker(cfg, now, 16)
evict_stale_some(cfg, now, 32)
if hold_active(due_now(cfg, now)) then return reserve_answer(worker, A.request_id, 'held', nil, version, published) end
if redis.call('ZCARD', K.buffer) >= cfg.max_completed_groups then
  return reserve_answer(worker, A.request_id, 'backpressure', nil, version, published)
end

-- Requeued work first, in submission order; then the backlog.
local r, counters = reserve_budget(cfg, max_groups, max_samples, A.overcommit == '1')
local stop = reserve_ready(r, cfg, now, worker)
if stop == nil and not reserve_full(r) then stop = reserve_backlog(r, cfg, now, worker, counters) end
attach_partials(r.grants, cfg, true)
return reserve_answer(worker, A.request_id, stop, r, version, published)
