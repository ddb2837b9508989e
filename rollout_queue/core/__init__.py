"""The sans-IO core: keys, config, models, errors, codec, reply parsing, the Lua scripts and the flows.

Nothing here does I/O or imports redis (tests/unit/test_layout.py checks it): a flow yields
the commands it needs and a driver (rollout_queue.drivers) sends them.
"""
