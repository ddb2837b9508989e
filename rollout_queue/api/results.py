"""What a facade method returns, and the one helper that composes facade calls across drivers.

A method returns ``Result[T]``: the value on a sync queue, an awaitable of it on an asyncio queue
(as redis-py's ``ResponseT``). Flows compose inside one driver; ``run_calls`` composes *calls* of
facade objects that may sit on different drivers (a fleet of queues on separate connections).

Static types: ``Result[T]`` is ``T`` to a type checker, so the facade classes as written are the
sync surface, exact for sync callers. The asyncio surface (``AsyncRolloutQueue``, ``AsyncWorker``,
``AsyncLease``, ...) is api/aio.pyi, generated from these same annotations with every
``Result[T]`` read as ``Awaitable[T]`` (devtools/async_stub.py; tests/unit/test_typing.py fails
when it is stale). So ``Result`` marks exactly the results the driver decides, and nothing about
a method is written twice. Only the drivers' ``run`` (and ``run_calls`` here) return what their
annotation does not say on an asyncio queue; everything typed above them is exact.
"""

from __future__ import annotations

from typing import Annotated, Any, Awaitable, Callable, Generator, TypeVar, cast

T = TypeVar("T")

#: The value itself (sync driver) or an awaitable of it (asyncio driver); ``T`` to a type checker,
#: ``Awaitable[T]`` in the generated asyncio stubs (api/aio.pyi).
Result = Annotated[T, "the driver's result: T on a sync queue, Awaitable[T] on an asyncio one"]

#: A generator that yields zero-argument calls of facade methods and is sent each call's value.
Calls = Generator[Callable[[], Any], Any, T]


def run_calls(calls: Calls[T], is_async: bool) -> Result[T]:
    """Drive ``calls``: each yielded call runs and its value is sent back in (awaited when async)."""
    if is_async:
        # The asyncio surface types this as Awaitable[T] (api/aio.pyi); the sync one as T.
        return cast(T, _run_async(calls))
    value: Any = None
    while True:
        try:
            call = calls.send(value)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value = call()


async def _run_async(calls: Calls[T]) -> T:
    value: Any = None
    while True:
        try:
            call = calls.send(value)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value = await cast(Awaitable[Any], call())
