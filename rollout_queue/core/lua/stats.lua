--[[
stats: read-only snapshot of the queue's counters and index sizes, consistent at one instant.
KEYS:
  src        the reservations stream
  meta       config, policy version and counters
  ready      requeued entry IDs
  buffer     completed entry IDs by arrival
  bufver     completed entry IDs by (min_version, arrival)
  workers    worker ids by last heartbeat
  leases     lease ids by deadline
  holds      admission hold ids by deadline
  dlq        dead letters
  commits    one line per committed lease
  ledger     entry ID -> last terminal or settlement
  ids        hash source_id -> entry ID
  intake     counters of what was submitted
ARGV:
  (none)
Returns:
  {'ok', {meta name, value, ...}, server_ms, stream length, ready, buffer, workers alive, workers
   silent, active leases, active holds, dlq length, commits length, buffer min versions {v, ...},
   ledger lines, source_ids, outages seen by the queue clock, submitted}
Invariant:
  none (read-only); counts come from one atomic script so they agree with each other.
]]
-- @include now_ms
-- @include load_config
local now = now_ms(true)
local cfg = load_config()
local due = due_now(cfg, now)
local cutoff = due - cfg.worker_timeout_ms
local versions = {}
local scores = redis.call('ZRANGE', K.bufver, 0, -1, 'WITHSCORES')
for i = 2, #scores, 2 do table.insert(versions, math.floor(tonumber(scores[i]) / 4294967296)) end
return {'ok', redis.call('HGETALL', K.meta), now, redis.call('XLEN', K.src), redis.call('ZCARD', K.ready),
  redis.call('ZCARD', K.buffer), redis.call('ZCOUNT', K.workers, cutoff, '+inf'),
  redis.call('ZCOUNT', K.workers, '-inf', '(' .. cutoff), redis.call('ZCOUNT', K.leases, 1, '+inf'),
  redis.call('ZCOUNT', K.holds, '(' .. due, '+inf'), redis.call('XLEN', K.dlq), redis.call('XLEN', K.commits),
  versions, redis.call('HLEN', K.ledger), redis.call('HLEN', K.ids),
  tonumber(redis.call('HGET', clock_key(), 'outages')) or 0,
  tonumber(redis.call('HGET', K.intake, 'submitted')) or 0}
