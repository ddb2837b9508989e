"""QueueConfig: the per-queue bounds and policies, stored once in the queue's meta hash.

The scripts read these from Redis on every call (never from ARGV), so this module only validates
values and converts them to and from their stored form. It does no I/O.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, fields
from typing import Final, Literal, Mapping

from rollout_queue.core.checks import check_int, check_optional_int, check_optional_seconds, check_seconds, describe
from rollout_queue.core.errors import InvalidInput

BufferOrder = Literal["fifo", "lifo"]
#: What the queue does with work that went past the staleness bound (DESIGN: Staleness modes).
StalenessMode = Literal["drop", "continue", "pace"]
#: Fields stored as text (every other one is a decimal integer): field -> its allowed values.
TEXT_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {"buffer_order": ("fifo", "lifo"),
                                                     "staleness_mode": ("drop", "continue", "pace")}


class Derived(enum.Enum):
    """``QueueConfig.batch_groups`` left to the trainer (DERIVED, the default).

    ``batch_groups`` has three meanings, and None ("no admission control") cannot also mean "not
    set": an explicit None is an opt-out that must survive every later open. So the default is
    this sentinel. It is stored as -1 (admission off until a trainer sizes it); a trainer-side
    helper (TrainingStream, RankedStream, the TRL adapters) then sets it once to the groups it
    commits per published version (``RolloutQueue.derive_admission``), and a number or None given
    explicitly is never changed by them. Opening an existing queue with batch_groups left DERIVED
    adopts whatever is stored (derived, set or off), so a resumed trainer whose config does not
    name it never meets ConfigMismatch. Falsy, like None: admission control is off while unset."""

    DERIVED = "derived"

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "DERIVED"

    __str__ = __repr__


#: The default of ``QueueConfig.batch_groups``: sized by the trainer (see Derived).
DERIVED: Final = Derived.DERIVED
#: A beating lease holder beats this many times per ``trainer_silence_s``: three beats may be lost (a
#: slow round trip, a GC pause, a blip in the connection) before the fourth's silence is judged.
BEATS_PER_SILENCE: Final = 4
#: The shortest trainer_silence_s: its beats (4 per bound) stay a negligible load on Redis.
MIN_TRAINER_SILENCE_S: Final = 1.0
#: batch_groups as stored: -1 unset (DERIVED), 0 off (None), n >= 1 set.
_STORED_DERIVED, _STORED_OFF = -1, 0


@dataclass(frozen=True)
class QueueConfig:
    """Bounds and policies of one queue (DESIGN: Capacity, Buffer and staleness, Failure handling).

    ``max_staleness=None`` is strictly on-policy: a completion generated before the current policy
    version is requeued at lease time. ``batch_groups``: admission control, at most (version +
    max_staleness + 1) * batch_groups groups admitted less those committed; ``None`` disables it,
    ``DERIVED`` (the default) leaves it to the trainer-side helpers, which size it from their lease
    size and publish cadence (Derived; off until they do).
    ``settled_retention_s`` is how long a settled group's ledger line and source_id mapping are
    kept (the window in which a repeated settlement replays and a resubmitted source_id is
    deduplicated); the reaper prunes them after it. ``None`` keeps them for the queue's life.
    """

    max_executing_samples: int = 4096
    max_retained_groups: int = 100_000
    max_completed_groups: int = 1024
    max_staleness: int | None = None
    batch_groups: int | None | Derived = DERIVED
    buffer_order: BufferOrder = "fifo"
    lease_timeout_s: float = 600.0
    worker_timeout_s: float = 60.0
    max_attempts: int = 3
    max_payload_bytes: int = 64 * 2**20
    hold_timeout_s: float = 600.0
    commits_maxlen: int = 100_000
    lease_record_ttl_s: float = 86_400.0
    settled_retention_s: float | None = 86_400.0
    #: Largest progress record (partial rollouts) one group may keep, in bytes; 0: none is kept,
    #: every aborted attempt restarts from its prompt. A record over it is refused (PartialTooLarge)
    #: and the attempt is aborted without it.
    max_partial_bytes: int = 4 * 2**20
    #: How long a lease whose holder has beaten (Lease's background beat, every
    #: ``trainer_silence_s / BEATS_PER_SILENCE``) may stay silent before the reaper rolls it back,
    #: well before its deadline: a dead trainer's groups come back in this bound instead of
    #: ``lease_timeout_s``. A lease that never beat (an older client, a lease taken with ``beat=False``)
    #: keeps the deadline rule alone. ``None``: beats are recorded, silence is never judged.
    trainer_silence_s: float | None = 60.0
    #: What goes stale, and what is kept (DESIGN: Staleness modes). ``drop``: a group is judged by
    #: its oldest token, and a stale one (a completed group or an unfinished attempt's progress) is
    #: generated again from its prompt. ``continue``: a group is judged by its newest tokens (the
    #: newest of its samples' last segments): tokens past the bound are the trainer's to mask or
    #: importance-correct, progress is never dropped for staleness, and only a group none of whose
    #: samples has a token within the bound is evicted. ``pace``: nothing finished is evicted for
    #: staleness and no progress dropped; admission control (``batch_groups``) paces generation,
    #: and ``admission_waits`` counts how often a reserve found it closed.
    staleness_mode: StalenessMode = "continue"
    #: Fairness: a group evicted for staleness this many times is not evicted for staleness again:
    #: its next completion is judged at the version it completes under (its bound widens to fit)
    #: and its progress is kept, so the longest rollouts are never starved by the short ones.
    #: 0: no such rule (a group may be evicted for ever).
    max_stale_evictions: int = 2

    def __post_init__(self) -> None:
        """Refuse any value the scripts could not enforce exactly: a bool (``True`` would be stored as
        "True" and brick the queue), a float where an integer is meant, NaN, an infinity, a negative
        or a value past what a stored millisecond integer and Lua's doubles (2^53) hold. Raises
        InvalidInput (a ValueError) naming the field; values are kept exactly (numpy ints become int)."""
        for name in _POSITIVE_INTS:
            self._set(name, check_int(getattr(self, name), f"QueueConfig.{name}", 1))
        self._set("max_staleness", check_optional_int(self.max_staleness, "QueueConfig.max_staleness (or None)", 0))
        if self.batch_groups is not DERIVED:
            self._set("batch_groups", check_optional_int(self.batch_groups,
                                                         "QueueConfig.batch_groups (or None, or DERIVED)", 1))
        self._set("max_partial_bytes", check_int(self.max_partial_bytes, "QueueConfig.max_partial_bytes", 0))
        self._set("max_stale_evictions", check_int(self.max_stale_evictions, "QueueConfig.max_stale_evictions", 0))
        for name in _SECONDS:
            self._set(name, check_seconds(getattr(self, name), f"QueueConfig.{name}"))
        self._set("settled_retention_s", check_optional_seconds(
            self.settled_retention_s, "QueueConfig.settled_retention_s (or None: keep forever)"))
        silence = check_optional_seconds(self.trainer_silence_s, "QueueConfig.trainer_silence_s (or None: off)")
        if silence is not None and silence < MIN_TRAINER_SILENCE_S:
            raise InvalidInput(f"QueueConfig.trainer_silence_s must be at least {MIN_TRAINER_SILENCE_S} s (a lease "
                               f"beats every trainer_silence_s / {BEATS_PER_SILENCE}), got {silence!r}")
        self._set("trainer_silence_s", silence)
        if self.staleness_mode == "pace" and self.batch_groups is None:
            raise InvalidInput("QueueConfig.staleness_mode='pace' paces generation by admission control: it needs "
                               "batch_groups (a number, or DERIVED for the trainer to size it), not None")
        for name, allowed in TEXT_FIELDS.items():
            if getattr(self, name) not in allowed:
                raise InvalidInput(f"QueueConfig.{name} must be {' or '.join(repr(a) for a in allowed)}, "
                                   f"got {describe(getattr(self, name))}")

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def to_meta(self) -> dict[str, str]:
        """The stored form: what the scripts read from the meta hash (ms, -1 / 0 for None)."""
        return {
            "max_executing_samples": str(self.max_executing_samples),
            "max_retained_groups": str(self.max_retained_groups),
            "max_completed_groups": str(self.max_completed_groups),
            "max_staleness": str(-1 if self.max_staleness is None else self.max_staleness),
            "batch_groups": str(stored_batch_groups(self.batch_groups)),
            "buffer_order": self.buffer_order,
            "staleness_mode": self.staleness_mode,
            "max_stale_evictions": str(self.max_stale_evictions),
            "lease_timeout_ms": str(_ms(self.lease_timeout_s)),
            "worker_timeout_ms": str(_ms(self.worker_timeout_s)),
            "max_attempts": str(self.max_attempts),
            "max_payload_bytes": str(self.max_payload_bytes),
            "hold_timeout_ms": str(_ms(self.hold_timeout_s)),
            "commits_maxlen": str(self.commits_maxlen),
            "lease_record_ttl_ms": str(_ms(self.lease_record_ttl_s)),
            "settled_retention_ms": str(0 if self.settled_retention_s is None else _ms(self.settled_retention_s)),
            "max_partial_bytes": str(self.max_partial_bytes),
            "trainer_silence_ms": str(0 if self.trainer_silence_s is None else _ms(self.trainer_silence_s)),
        }

    @property
    def beat_interval_s(self) -> float | None:
        """How often a lease's holder beats (None: silence is not judged, so no beat is needed)."""
        return None if self.trainer_silence_s is None else self.trainer_silence_s / BEATS_PER_SILENCE

    @classmethod
    def from_meta(cls, meta: Mapping[str, str]) -> "QueueConfig":
        """Rebuild a config from the stored form (the inverse of to_meta). Raises InvalidInput naming
        every field whose stored value is missing or garbage (written by hand, or by an older build)."""
        values, corrupt = cls.stored_fields(meta)
        if corrupt:
            raise InvalidInput(corrupt_message(corrupt))
        return cls(**values)  # type: ignore[arg-type]  # every field decoded: validated in __post_init__

    @classmethod
    def stored_fields(cls, meta: Mapping[str, str]) -> tuple[dict[str, object], dict[str, str]]:
        """(each valid field decoded from the stored form, each field whose stored value is garbage or
        out of range -> 'stored_name=raw'). Lenient, so that ``config show`` can show and ``config
        set`` can repair a corrupt config instead of failing on it."""
        values: dict[str, object] = {}
        corrupt: dict[str, str] = {}
        for f in fields(cls):
            stored = _STORED.get(f.name, f.name)
            try:
                values[f.name] = _decode(f.name, meta.get(stored))
            except ValueError:
                corrupt[f.name] = f"{stored}={meta.get(stored)!r}"
        try:
            cls(**values)  # type: ignore[arg-type]
        except InvalidInput:  # some value decodes but is out of range: find which, one at a time
            for name, value in list(values.items()):
                try:
                    cls(**{name: value})  # type: ignore[arg-type]
                except InvalidInput:
                    stored = _STORED.get(name, name)
                    corrupt[name] = f"{stored}={meta.get(stored)!r}"
                    del values[name]
        return values, corrupt

    def replace(self, **changes: object) -> "QueueConfig":
        """A copy with some fields changed (validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise InvalidInput(f"unknown QueueConfig fields: {sorted(unknown)}")
        return type(self)(**{**asdict(self), **changes})


def stored_batch_groups(value: int | None | Derived) -> int:
    """batch_groups in its stored form: -1 for DERIVED, 0 for None (off), else the number."""
    return _STORED_DERIVED if value is DERIVED else _STORED_OFF if value is None else int(value)


def _ms(seconds: float) -> int:
    return max(1, int(round(seconds * 1000)))


_POSITIVE_INTS = ("max_executing_samples", "max_retained_groups", "max_completed_groups", "max_attempts",
                  "max_payload_bytes", "commits_maxlen")
_SECONDS = ("lease_timeout_s", "worker_timeout_s", "hold_timeout_s", "lease_record_ttl_s")
#: field -> its name in meta, where the stored form differs (seconds are stored as ms).
_STORED = {"lease_timeout_s": "lease_timeout_ms", "worker_timeout_s": "worker_timeout_ms",
           "hold_timeout_s": "hold_timeout_ms", "lease_record_ttl_s": "lease_record_ttl_ms",
           "settled_retention_s": "settled_retention_ms", "trainer_silence_s": "trainer_silence_ms"}
#: The stored form of an integer, exactly as to_meta writes it (and load_config.lua accepts).
_DECIMAL = re.compile(r"-?[0-9]{1,16}")


def _decode(name: str, raw: str | None) -> object:
    """One field from its stored text; ValueError if it is missing or garbage."""
    if name in TEXT_FIELDS:
        if raw not in TEXT_FIELDS[name]:
            raise ValueError(raw)
        return raw
    if not isinstance(raw, str) or not _DECIMAL.fullmatch(raw):
        raise ValueError(raw)
    number = int(raw)
    if name == "max_staleness":
        return None if number < 0 else number
    if name == "batch_groups":
        return DERIVED if number == _STORED_DERIVED else None if number == _STORED_OFF else number
    if name in ("settled_retention_s", "trainer_silence_s"):
        return None if number == 0 else number / 1000
    return number / 1000 if name in _STORED else number


def corrupt_message(corrupt: Mapping[str, str]) -> str:
    """What to tell an operator about a stored config with garbage in it, and how to repair it."""
    names = sorted(corrupt)
    return (f"the queue's stored config is corrupt ({'; '.join(corrupt[n] for n in names)}): every script "
            f"refuses to run until it is repaired with `rollout-queue config set {' '.join(n + '=VALUE' for n in names)} "
            "--yes` ('none' for an optional bound)")
