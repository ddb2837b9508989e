"""Argument checkers of the public API: what a call accepts, refused with InvalidInput before any I/O.

Owns the one rule for each kind of scalar a caller hands the queue (counts, steps, versions,
seconds, flags, names, JSON metadata), so QueueConfig, the value types of models.py and the flows
of flows/ (shared by the sync and asyncio clients) refuse the same values with the same message.
Why a module of its own: every such value ends up as a Lua number (a double: integers are exact
only up to 2^53) or as a millisecond integer stored in Redis, and Python's lax conversions turn
bad values into something else without a word (``True`` is 1, ``int(1.5)`` is 1, a NaN timeout
becomes a 1 ms lease, ``-1`` s becomes the queue's default, ``10**400`` overflows deep in a C
conversion, NaN in metadata becomes ``null``). A checker either returns the value exactly (as a
plain int or float) or raises InvalidInput naming the argument; it never rounds or clamps.
Rules: no I/O, no imports beyond errors.py (models.py and config.py build on this module).
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import struct
from collections.abc import Mapping
from typing import Any

from rollout_queue.core.errors import InvalidInput

#: Largest integer a Lua number (a double) holds exactly: every count, step and ms value must fit.
MAX_SAFE_INT = 2**53 - 1
#: Longest duration in seconds (about 31.7 years): its milliseconds plus the server clock stay far
#: below 2^53, so no deadline a script computes is ever rounded or overflows.
MAX_SECONDS = 1e9
#: Deepest nesting of metadata checked (orjson itself refuses more than 255 levels).
_MAX_DEPTH = 255


@functools.lru_cache(maxsize=1024)
def packer(code: str, count: int) -> struct.Struct:
    """The compiled little-endian format of ``count`` values of struct ``code`` ("i": int32, "f":
    float32). ``Struct.pack(*values)`` checks and converts a tuple in one C loop, ~2.5x faster than
    ``array(code, values)`` (which goes through the iterator protocol item by item): the int32 check
    of token ids here and the codec's packing share it. Cached: compiling a format per call costs a
    third of a pack."""
    return struct.Struct(f"<{count}{code}")


def describe(value: Any) -> str:
    """A value for an error message: its type and a repr cut short (10**400 has 401 digits)."""
    try:
        text = repr(value)
    except Exception:  # an int past sys.get_int_max_str_digits() has no repr; user code's may raise
        text = f"<{value.bit_length()}-bit integer>" if isinstance(value, int) else "<unprintable>"
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _integers(lo: int, hi: int) -> str:
    if hi != MAX_SAFE_INT:
        return f"an integer in {lo}..{hi}"
    return "a positive integer (below 2^53)" if lo == 1 else f"an integer >= {lo} (below 2^53)"


def check_int(value: Any, what: str, lo: int = 0, hi: int = MAX_SAFE_INT) -> int:
    """``value`` as a plain int in ``lo..hi``. Bools, floats (even 2.0), strings and None are refused;
    any other integer type (numpy's) is accepted and converted."""
    try:
        if isinstance(value, (bool, float)):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise InvalidInput(f"{what} must be {_integers(lo, hi)}, got {describe(value)}") from None
    if not lo <= number <= hi:
        raise InvalidInput(f"{what} must be {_integers(lo, hi)}, got {describe(number)}")
    return number


def check_optional_int(value: Any, what: str, lo: int = 0, hi: int = MAX_SAFE_INT) -> int | None:
    """None, or check_int(value)."""
    return None if value is None else check_int(value, what, lo, hi)


def check_number(value: Any, what: str) -> float:
    """``value`` as a finite float: ints and floats (and other real types), never a bool, NaN, an
    infinity or an int too large for a double."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInput(f"{what} must be a finite number, got {describe(value)}")
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        raise InvalidInput(f"{what} must be a finite number, got {describe(value)}") from None
    if not math.isfinite(number):
        raise InvalidInput(f"{what} must be a finite number, got {describe(value)}")
    return number


def check_seconds(value: Any, what: str, allow_zero: bool = False) -> float:
    """A duration in seconds: a finite number > 0 (>= 0 with ``allow_zero``), at most MAX_SECONDS."""
    number = check_number(value, what)
    low = "0" if allow_zero else "more than 0"
    if number < 0 or (number == 0 and not allow_zero) or number > MAX_SECONDS:
        raise InvalidInput(f"{what} must be a number of seconds, {low} and at most {MAX_SECONDS:.0e}, "
                           f"got {describe(value)}")
    return number


def check_optional_seconds(value: Any, what: str) -> float | None:
    """None (the queue's default or no limit, as the argument documents), or check_seconds(value)."""
    return None if value is None else check_seconds(value, what)


def check_flag(value: Any, what: str) -> bool:
    """A real bool: ``partial="no"`` is truthy, so anything else is refused rather than guessed."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be True or False, got {describe(value)}")
    return value


def check_string(value: Any, what: str, max_len: int = 200, allow_empty: bool = False) -> str:
    """A str of at most ``max_len`` characters that encodes as UTF-8 (no lone surrogates)."""
    if not isinstance(value, str) or len(value) > max_len or (not value and not allow_empty):
        size = "0" if allow_empty else "1"
        raise InvalidInput(f"{what} must be a string of {size}..{max_len} characters, got {describe(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{what} is not valid UTF-8 text: {exc}") from exc
    return value


def check_json(value: Any, what: str) -> None:
    """Refuse the values orjson would store as something else: a NaN or an infinity (written as
    ``null``). Types orjson refuses outright (objects, int keys, ints beyond 64 bits) are refused by
    the encoder with InvalidInput; this walk only finds what it would silently change."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidInput(f"{what} holds {item!r}: JSON has no NaN or infinity (it would be stored as null)")
        elif isinstance(item, (str, int, bool)) or item is None:
            continue
        elif depth >= _MAX_DEPTH:
            raise InvalidInput(f"{what} is nested more than {_MAX_DEPTH} levels deep")
        elif isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)


def check_choice(value: Any, choices: tuple[str, ...], what: str) -> str:
    """One of ``choices``, exactly."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidInput(f"{what} must be one of {', '.join(choices)}, got {describe(value)}")
    return value


def check_items(values: Any, kind: type, what: str) -> list[Any]:
    """Every item of ``values`` (a list, tuple or any other iterable but a str, bytes or mapping) as
    a list, each an instance of ``kind``. A list also makes a generator safe to walk twice."""
    if isinstance(values, (str, bytes, bytearray, Mapping)) or (kind is not object and isinstance(values, kind)):
        raise InvalidInput(f"{what} must be a list of {kind.__name__}, got {type(values).__name__}")
    try:
        items = list(values)
    except TypeError:
        raise InvalidInput(f"{what} must be a list of {kind.__name__}, got {type(values).__name__}") from None
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise InvalidInput(f"{what}[{i}] must be a {kind.__name__}, got {describe(item)}")
    return items


def check_instance(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` if it is an instance of ``kind``."""
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise InvalidInput(f"{what} must be a {names}, got {describe(value)}")
    return value
