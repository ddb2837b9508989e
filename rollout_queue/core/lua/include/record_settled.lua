--[[
record_settled: note that groups were settled now, for prune.lua to forget them after the retention.
`pairs_` is flat: entry ID, source_id, entry ID, source_id, ... (source_id '' when unknown).
Uses: K.settled (a stream: one entry per chunk of at most SETTLED_CHUNK groups, its fields the
entry IDs and its values their source_ids; the stream ID is the settle time). Nothing is recorded
when cfg.settled_retention_ms is nil (settled_retention_s = None: keep every line forever).
Why: the ledger line and the ids mapping of a settled group are only needed for a while (a retried
settlement, a producer resubmitting a batch); without a record of when each group settled they
could never be removed. A stream is ordered by time by construction (prune reads from its head),
takes ~30 B per group (a sorted set ~110 B) and is one command per chunk, so a commit of 32 groups
adds one XADD. The source_id rides along because the stream entry of a committed or filtered group is
deleted at settlement, and prune must find the ids field to delete.
A record is written only when the group leaves every owner for good (committed without a kept copy,
filtered, a kept copy dropped by checkpoint, a dead letter purged or requeued): an owned, kept or
dead-lettered group is never recorded, so prune can never forget what restore or a replay needs.
]]
-- prune.lua takes whole chunks and refuses a per-call bound below this (flows.BATCH is 32 too).
local SETTLED_CHUNK = 32
local function record_settled(cfg, pairs_)
  if not cfg.settled_retention_ms then return end
  for start = 1, #pairs_, 2 * SETTLED_CHUNK do
    local args = {'XADD', K.settled, '*'}
    for i = start, math.min(#pairs_, start + 2 * SETTLED_CHUNK - 1) do table.insert(args, pairs_[i]) end
    redis.call(unpack(args))
  end
end
