"""The public facade: one class per role, written once.

``RolloutQueue`` (and the ``Worker``, ``Lease`` and ``Hold`` it hands out) run every operation as
one flow (core/flows/, or scale/flows.py for several partitions) on a driver
(drivers/transport.py). The driver decides sync or asyncio, as redis-py's commands return whatever
their client returns: a method of a queue opened on ``redis.Redis`` returns its value, the same
method of a queue opened on ``redis.asyncio.Redis`` returns an awaitable of it. A queue of one
partition is the plain queue; of P > 1, one logical queue over P partitions (scale/layout.py). So
adding a transition is one script, one flow and one line here, once.
"""
