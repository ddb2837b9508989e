--[[
now_ms: the queue clock in milliseconds: the server's TIME minus the time the server was down.
due_now: the instant deadlines are judged against (worker silence, lease and hold expiry).
Uses: the hash rollout:{q}:clock (built from K.meta's prefix, same hash tag; not queue state, so a
refusal that only moved the clock still "wrote nothing"): ms (the last queue time a script saw,
written at most every CLOCK_STEP_MS), offset (server time - queue time), run (the server's run_id
when ms was written), resumed (queue time at the end of the last outage), outages (how many);
the reaper's re-index sweep keeps its cursor there too (reindex.lua).
Why: DESIGN rule 6, time comes from Redis TIME, never from client clocks; and time the server was
down must not count against workers, leases or holds (issue 12 item 5). A restart or a failover
changes the server's run_id: the first script that sees a new run_id (or a clock that went
backwards) continues the queue clock from its last ms plus one step instead of jumping over the
outage. Plus one step, because ms is written at most every CLOCK_STEP_MS: a script may have seen (and
stored a deadline from) a queue time up to a step past it, and the queue clock never goes back (a
lease extended just before a restart must not get an earlier deadline from the next extend). After an
outage every client gets OUTAGE_GRACE worker timeouts to reconnect before anything it owns is
taken away (due_now), because clients come back one by one on their own retry back-off. Only a
changed run_id counts as an outage, never a quiet queue, so the grace is granted once per restart
and cannot postpone reaping for ever. The clock is recorded with redis.pcall by every caller: the
roles that must not move it (the operator; the worker, whose credential could otherwise set every
deadline of the queue: issue 29 item 7) hold the hash read-only, compute the same time, and leave
recording it to the next script of a role that may (trainer, reaper, admin, producer). A stored
value that is no sane clock (not an integer, an offset beyond the server's own time: written by
hand) is ignored, as on a first use. `read_only` is kept for the callers that say so.
]]
local CLOCK_STEP_MS = 100
local OUTAGE_GRACE = 2
local clock = nil
local function clock_key()
  return string.sub(K.meta, 1, -5) .. 'clock'
end
-- A stored clock field: a decimal integer of at most 15 digits (exact in a Lua double), else nil.
local function clock_int(raw)
  if not raw or not string.match(raw, '^%-?%d+$') or #raw > 16 then return nil end
  return tonumber(raw)
end
local function server_run_id()
  return string.match(redis.call('INFO', 'SERVER'), 'run_id:(%w+)') or ''
end
local function now_ms(read_only)
  if clock then return clock.now end
  local t = redis.call('TIME')
  local raw = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local key = clock_key()
  local c = redis.call('HMGET', key, 'ms', 'offset', 'run', 'resumed', 'outages')
  local last, offset = clock_int(c[1]), clock_int(c[2]) or 0
  if offset < 0 or offset > raw then last, offset = nil, 0 end  -- no sane clock: start afresh
  c[4], c[5] = clock_int(c[4]), clock_int(c[5])
  local q = raw - offset
  clock = {now = q, resumed = c[4], raw = raw}
  if last and q >= last and q - last < CLOCK_STEP_MS then return q end
  -- A gap of a step or more (or a first use, or a clock that went back): is it the same server?
  local run = server_run_id()
  local writes = {}
  if not last then
    writes = {'ms', q, 'offset', offset, 'run', run}
  elseif run ~= c[3] or q < last then
    -- Restarted, failed over, or stepped back: the queue clock goes on from where it stopped,
    -- which is less than a step past the last ms written.
    q = last + CLOCK_STEP_MS
    writes = {'ms', q, 'offset', raw - q, 'run', run}
    if run ~= c[3] then
      clock.resumed = q
      table.insert(writes, 'resumed')
      table.insert(writes, q)
      table.insert(writes, 'outages')
      table.insert(writes, (c[5] or 0) + 1)
    end
  else
    writes = {'ms', q}
  end
  clock.now = q
  redis.pcall('HSET', key, unpack(writes))  -- a role that may not write it: the next writer records it
  return q
end
--[[
stream_ms: the server's own TIME in ms (call now_ms first): what the IDs a stream gives with '*' are
made of. The settled stream's retention is judged by it, not by the queue clock, so that a record
written just before an outage and one written just after it compare in one clock.
]]
local function stream_ms()
  return clock.raw
end
local function due_now(cfg, now)
  local r = clock and clock.resumed
  if r and now < r + OUTAGE_GRACE * cfg.worker_timeout_ms then return math.min(now, r) end
  return now
end
--[[
silent_counted: whether reaping a worker whose last heartbeat was `seen` counts toward max_attempts.
A worker that was alive when the last outage began (its last heartbeat is within worker_timeout
before it; the stored ms lags a heartbeat by at most CLOCK_STEP_MS) and never came back most likely gave up on the outage (its retry window ran out): not its group's fault.
]]
local function silent_counted(cfg, seen)
  local r = clock and clock.resumed
  return not (r and seen and seen >= r - cfg.worker_timeout_ms and seen <= r + CLOCK_STEP_MS)
end
