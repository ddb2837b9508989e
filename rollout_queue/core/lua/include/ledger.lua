--[[
ledger_set / ledger_is: the last terminal of each entry in K.ledger; ledger_attempt builds the line
of an owned entry, 'a|<attempt>|<worker>|<terminal>', and ledger_attempt_of reads one back:
(attempt, worker, terminal), or nil for any other line. Once settled the line is
's|<settlement>|<attempt>|<worker>|<detail>', built and read by ledger_settled.lua only.
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
local function ledger_attempt_of(line)
  return string.match(line, '^a|(%d+)|([^|]*)|(.*)$')
end
