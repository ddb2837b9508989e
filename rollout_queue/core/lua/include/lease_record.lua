--[[
lease_record: a lease hash's fields, or nil when there is no such lease.
Why: commit, rollback, extend and expiry all fence on the same fields (token, state, deadline).
A deadline that is not a finite number (a record edited by hand) counts as passed: the lease is expired.
]]
local function finite_or_zero(x)
  if x == nil or x ~= x or x == math.huge or x == -math.huge then return 0 end
  return x
end
local function lease_record(lease_key)
  local v = redis.call('HMGET', lease_key, 'token', 'state', 'deadline', 'members', 'trainer', 'commit_id', 'step')
  if not v[1] then return nil end
  return {token = v[1], state = v[2], deadline = finite_or_zero(tonumber(v[3])), members = v[4], trainer = v[5],
    commit_id = v[6], step = v[7]}
end
-- lease_fenced: the record at `lease_key` when `token` holds it; else nil and the refusal every fenced
-- call answers ({'lease_lost', 'unknown' | 'token'}). The caller builds the key (spelt at the call, so
-- ops/script_access.py sees which key its commands name).
local function lease_fenced(lease_key, token)
  local L = lease_record(lease_key)
  if not L then return nil, {'lease_lost', 'unknown'} end
  if L.token ~= token then return nil, {'lease_lost', 'token'} end
  return L, nil
end
