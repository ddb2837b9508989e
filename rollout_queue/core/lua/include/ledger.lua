--[[
ledger_set / ledger_get: the last terminal of each entry in K.ledger.
Values: 'a|<attempt>|<worker>|<terminal>' while the reservation is owned, then
's|<settlement>|<attempt>|<worker>|<detail>' once settled.
Why: DESIGN rule 5, a settlement repeated with the same receipt (a client retrying after a
connection error) must return the same answer; the PEL alone cannot say who ended an attempt.
]]
local function ledger_set(id, value)
  redis.call('HSET', K.ledger, id, value)
end
local function ledger_is(id, value)
  return redis.call('HGET', K.ledger, id) == value
end
local function ledger_attempt(attempt, worker, terminal)
  return 'a|' .. attempt .. '|' .. worker .. '|' .. terminal
end
