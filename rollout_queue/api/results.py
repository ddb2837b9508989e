"""What a facade method returns, and the one helper that composes facade calls across drivers.

A method returns ``Result[T]``: the value on a sync queue, an awaitable of it on an asyncio queue
(as redis-py's ``ResponseT``). Flows compose inside one driver; ``run_calls`` composes *calls* of
facade objects that may sit on different drivers (a fleet of queues on separate connections).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Generator, TypeVar, Union

T = TypeVar("T")

#: The value itself (sync driver) or an awaitable of it (asyncio driver).
Result = Union[T, Awaitable[T]]

#: A generator that yields zero-argument calls of facade methods and is sent each call's value.
Calls = Generator[Callable[[], Any], Any, T]


def run_calls(calls: Calls[T], is_async: bool) -> Result[T]:
    """Drive ``calls``: each yielded call runs and its value is sent back in (awaited when async)."""
    if is_async:
        return _run_async(calls)
    value: Any = None
    while True:
        try:
            call = calls.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value = call()


async def _run_async(calls: Calls[T]) -> T:
    value: Any = None
    while True:
        try:
            call = calls.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value = await call()
