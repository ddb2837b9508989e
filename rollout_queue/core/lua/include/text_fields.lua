--[[
text_fields: the config fields stored as text, each with the values it may hold; every other config
field is a decimal integer. Uses: nothing. Why: load_config refuses a stored value outside these and
config_set a new one: one table, so the two scripts cannot disagree (QueueConfig.TEXT_FIELDS is the
client's statement of the same, checked against this one in tests/unit/test_lua_includes.py).
]]
local TEXT_FIELDS = {buffer_order = {fifo = true, lifo = true},
  staleness_mode = {drop = true, continue = true, pace = true}}
