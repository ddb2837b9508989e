-- @include pel_entry
-- @include requeue_entry
--[[
requeue_lease: leased -> ready for every member of a lease, then close the lease record.
Uses: K.src, K.meta, K.ready, K.history, K.dlq, K.ledger, K.leases, K.results, K.wake_work; builds
the lease hash key from K.meta's prefix (same hash tag).
Why: rollback and expiry are not the group's fault, so they do not count toward max_attempts; the
completion is dropped and the pristine reservation is generated again (DESIGN, state machine).
]]
local function requeue_lease(lease_key, lease_id, members_csv, terminal, cfg, now)
  local n = 0
  for id in string.gmatch(members_csv or '', '[^,]+') do
    local owner, count = pel_entry(id)
    if owner == '@lease:' .. lease_id then
      redis.call('HDEL', K.results, id)
      requeue_entry(id, count, owner, terminal, terminal, false, cfg, now)
      n = n + 1
    end
  end
  redis.call('HINCRBY', K.meta, 'leased', -n)
  redis.call('HINCRBY', K.meta, terminal, n)
  redis.call('HSET', lease_key, 'state', terminal, 'closed_ms', now)
  redis.call('PEXPIRE', lease_key, cfg.lease_record_ttl_ms)
  redis.call('ZREM', K.leases, lease_id)
  redis.call('XGROUP', 'DELCONSUMER', K.src, 'rollout', '@lease:' .. lease_id)
  return n
end
