"""The submission scheduler of one worker: how much to ask ``reserve`` for, and when (sans-IO).

DESIGN, "Submission scheduler". Both policies are one state machine with one accounting rule and
one question, ``request()``; a policy only decides *when a sample slot is released*:

- ``group``: a worker holds at most ``max_groups`` groups. A group's slots are released together,
  when the group becomes terminal, so a new group is reserved only after one ends.
- ``sample``: a worker keeps at most ``max_samples`` samples executing. Each finished sample
  releases its slot at once, which keeps the engine busy while one long-tailed sample holds its
  group open. A new group is reserved as soon as it fits ``max_samples`` plus ``max_waiting``
  samples that wait inside the engine for a slot. The default, ``2n - 1``, reserves the next group
  while ``n - 1`` samples still wait, so its round trip can end before a slot frees with nothing
  waiting, even when all of a group's samples end in the same step (``n - 1`` reserves only once a
  slot is already free: the engine bench measured a median of 29 of 32 vLLM slots busy per step,
  31 with ``2n - 1``). With ``max_waiting=0`` a group waits for ``n`` free slots, and the engine's
  slots are at most about ``1 - (n - 1) / (2 S)`` busy (89% with S = 32, n = 8;
  docs/PERFORMANCE.md, "The scheduler").

Rules this module keeps:
1. No I/O, no clock, no asyncio: the runtime reports events (reserved, sample done, group
   terminal) and asks ``request()``; tests drive it by hand.
2. Reserve batching: a request asks for every free group (up to ``max_batch``) in one call, capped
   by the free samples, so an idle worker with many slots fills them in one round trip. The queue's
   reserve script stops granting at ``max_samples``, so a batch never overshoots the slots.
3. No empty asks: the sample policy asks only when a group of ``n`` fits its room (free slots plus
   ``max_waiting``), where ``n`` is the size of the last group reserved (the best guess of the next
   one); a call that could only be refused is never made, so a busy worker never spins on ``reserve``.
4. The counts can never go negative or leak: ``busy_samples`` always equals the slots held by the
   groups in ``held`` (checked by ``check()``; the tests call it after every step), and it never
   exceeds ``max_samples + max_waiting`` but for rule 5.
5. Oversized groups (docs/DESIGN.md, "Groups larger than a caller's slots"): the sample policy asks
   with ``overcommit``, so the queue may grant one group larger than the room as the first grant of
   a call (the engine queues its extra samples). ``busy_samples`` then exceeds the room until those
   samples finish, and nothing more is asked meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Literal

Policy = Literal["group", "sample"]
POLICIES: tuple[str, ...] = ("group", "sample")


def check_max_waiting(policy: str, max_waiting: int | None) -> None:
    """Raise ValueError unless ``max_waiting`` is None or an integer >= 0, and 0 or None for the
    group policy (WorkerOptions checks it on construction, the scheduler again when built alone)."""
    if max_waiting is not None and (not isinstance(max_waiting, int) or isinstance(max_waiting, bool)
                                    or max_waiting < 0):
        raise ValueError(f"max_waiting must be a non-negative integer or None, got {max_waiting!r}")
    if policy == "group" and max_waiting:
        raise ValueError("max_waiting is for the sample policy (the group policy holds whole groups)")


@dataclass(frozen=True)
class ReserveRequest:
    """What to pass to ``reserve``: at most ``max_groups`` groups and ``max_samples`` samples
    (0: no per-call sample cap, only the queue's)."""

    max_groups: int
    max_samples: int
    overcommit: bool = False


@dataclass
class _Held:
    n: int
    running: int  # samples of this group not yet finished
    oversized: bool = False  # granted beyond the room (overcommit)


class SubmissionScheduler:
    """Slot accounting for the ``group`` and ``sample`` policies (see the module docstring)."""

    def __init__(self, policy: Policy, *, max_samples: int | None = None, max_groups: int | None = None,
                 max_batch: int = 64, max_waiting: int | None = None) -> None:
        """``max_samples=None``: no sample cap (group policy only); ``max_groups=None``: no group cap
        (sample policy only); ``max_waiting`` (sample policy only): samples beyond ``max_samples``
        the engine may hold waiting for a slot, ``None`` for one group less one sample (the least
        that keeps every slot busy), 0 to reserve only into free slots. Raises ValueError when the
        chosen policy has nothing to bound it."""
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if policy == "group" and not max_groups:
            raise ValueError("the group policy needs max_groups >= 1")
        if policy == "sample" and not max_samples:
            raise ValueError("the sample policy needs max_samples >= 1")
        for name, value in (("max_samples", max_samples), ("max_groups", max_groups), ("max_batch", max_batch)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        check_max_waiting(policy, max_waiting)
        self.policy: Policy = policy
        self.max_samples, self.max_groups, self.max_batch = max_samples, max_groups, max_batch
        self.max_waiting = max_waiting
        self.held: dict[Hashable, _Held] = {}
        self.busy_samples = 0
        self.n_hint = 1
        self.peak_groups = 0
        self.peak_samples = 0

    @property
    def free_groups(self) -> int | None:
        return None if self.max_groups is None else self.max_groups - len(self.held)

    @property
    def free_samples(self) -> int | None:
        return None if self.max_samples is None else self.max_samples - self.busy_samples

    @property
    def waiting_allowed(self) -> int:
        """Samples the engine may hold beyond ``max_samples`` now: ``max_waiting``, or by default
        two groups less one sample (a group's size as last seen, capped by the slots)."""
        if self.policy == "group" or self.max_samples is None:
            return 0
        if self.max_waiting is not None:
            return self.max_waiting
        if self.peak_groups == 0:
            return 0  # no group reserved yet: nothing is known of their size
        return 2 * min(self.n_hint, self.max_samples) - 1

    @property
    def room(self) -> int | None:
        """Samples that may be reserved now: the free slots plus what may wait (None: no cap)."""
        free_s = self.free_samples
        return None if free_s is None else free_s + self.waiting_allowed

    def request(self) -> ReserveRequest | None:
        """How much to reserve now, or None when there is no room (wait for a slot to free)."""
        free_g, room = self.free_groups, self.room
        if free_g is not None and free_g < 1:
            return None
        # n_hint is capped by the slots: after an oversized group (n > max_samples) the next ask comes
        # once the room holds max_samples, never "when n fit", which could never happen.
        if room is not None and self.max_samples is not None and room < min(self.n_hint, self.max_samples):
            return None
        groups = self.max_batch
        for cap in (free_g, room):  # a group has at least one sample, so the room caps groups too
            if cap is not None:
                groups = min(groups, cap)
        return ReserveRequest(max_groups=groups, max_samples=room or 0, overcommit=self.policy == "sample")

    def on_reserved(self, key: Hashable, n: int) -> None:
        """A group of ``n`` parent slots was granted; all its samples start now."""
        if key in self.held:
            raise ValueError(f"group {key!r} is already held")
        if n < 1:
            raise ValueError(f"a group has at least one parent slot, got n={n}")
        room = self.room
        oversized = room is not None and n > room
        self.held[key] = _Held(n, n, oversized)
        self.busy_samples += n
        self.n_hint = n
        self.peak_groups = max(self.peak_groups, len(self.held))
        self.peak_samples = max(self.peak_samples, self.busy_samples)

    def on_sample_done(self, key: Hashable) -> bool:
        """One sample of group ``key`` finished (or was aborted). True when that freed a slot."""
        held = self.held.get(key)
        if held is None or held.running < 1:
            raise ValueError(f"no running sample of group {key!r}")
        held.running -= 1
        if self.policy == "sample":
            self.busy_samples -= 1
            return True
        return False

    def on_group_terminal(self, key: Hashable) -> None:
        """Group ``key`` ended (completed, failed, filtered, aborted or dropped): release its slots.
        Unknown keys are ignored, so the runtime may report a terminal from every exit path."""
        held = self.held.pop(key, None)
        if held is None:
            return
        # group policy: every slot is still held; sample policy: only those of unfinished samples.
        self.busy_samples -= held.n if self.policy == "group" else held.running

    def check(self) -> None:
        """Raise AssertionError if the accounting is inconsistent (for tests)."""
        expected = sum(h.n if self.policy == "group" else h.running for h in self.held.values())
        assert self.busy_samples == expected, (self.busy_samples, expected)
        assert all(0 <= h.running <= h.n for h in self.held.values())
        if self.max_groups is not None:
            assert len(self.held) <= self.max_groups
        if self.max_samples is not None and not any(h.oversized for h in self.held.values()):
            # The most that may ever wait (the hint moves with each group, so not the room of now).
            most_waiting = 2 * self.max_samples - 1 if self.max_waiting is None else self.max_waiting
            assert self.busy_samples <= self.max_samples + most_waiting
