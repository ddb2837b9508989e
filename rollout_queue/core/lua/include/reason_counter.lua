--[[
reason_counter: the meta field that counts one filter reason: 'filtered_reason:<token>'.
The token is the reason lowercased, each run of characters other than a-z and 0-9 made one '_',
'_' trimmed at both ends, cut to REASON_TOKEN_LEN characters ('other' when nothing is left).
At most MAX_REASON_COUNTERS distinct tokens get a counter of their own, the first ones seen;
every later new token counts as 'other'. 'filtered_reasons' counts the named counters.
Uses: K.counters. Call it where the script writes (it creates the counter's slot on first use).
Why: a reason is free text ("all rewards equal", a model's own words); a counter per distinct text
would grow meta, `stats` and every Prometheus scrape without bound. Deciding the slot inside the
script keeps the bound across every process that filters.
]]
local MAX_REASON_COUNTERS = 32
local REASON_TOKEN_LEN = 48
local function reason_counter(reason)
  local token = string.gsub(string.lower(reason), '[^a-z0-9]+', '_')
  token = string.gsub(string.sub(string.gsub(token, '^_+', ''), 1, REASON_TOKEN_LEN), '_+$', '')
  if token == '' then token = 'other' end
  local field = 'filtered_reason:' .. token
  if token == 'other' or redis.call('HEXISTS', K.counters, field) == 1 then return field end
  if (tonumber(redis.call('HGET', K.counters, 'filtered_reasons')) or 0) >= MAX_REASON_COUNTERS then
    return 'filtered_reason:other'
  end
  redis.call('HINCRBY', K.counters, 'filtered_reasons', 1)
  return field
end
