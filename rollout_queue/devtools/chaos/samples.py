"""What was trained, token by token: versions it could have run under, no token twice, no record left.

Partial rollouts (DESIGN, "Partial rollouts") let an attempt continue what an earlier one left: a
progress record (tokens, behaviour logprobs, per-token versions as ``segments``) that the next
attempt, on any worker, extends. Three ways that can go wrong without losing or training a group
twice, so the other checks cannot see them:

1. **Versions** (``check_versions``): a trained sample claims versions it never ran under (a
   continuation stamped with the new worker's version, a prefix's segments dropped, a version
   nobody published). The rule, from what the harness observes (every publisher logs
   ``publish_record`` *before* it records a version; every shipped worker logs ``start`` with the
   version it adopted and ``weights_applied`` at each update, with their times):

   - the segments (``[(0, version)]`` when a sample has none) start at offset 0, rise strictly in
     offset below the sample's token count (so they cover its tokens), never decrease in version,
     start at the sample's ``version``, and name only versions in its ``versions`` when it lists them;
   - every version is 0 (the weights every worker starts with) or one a publisher logged
     ``publish_record`` for no later than the attempt's completion was acknowledged (else the lease
     that trained it);
   - a shipped worker's sample: every version is one that a shipped worker which held an attempt
     of this entry (up to the trained one) had loaded at some moment from 1 s before it logged the
     reservation to the lease: the version it last adopted or applied before then, and each it
     applied after; a test-engine worker's sample (it runs no partials): exactly the version its
     reservation logged.

2. **Tokens trained twice within a sample** (``check_tokens``): a continuation that repeats its
   prefix (or drops part of it). The check is exact because both engines of a run are functions
   of what they were given: a test-engine sample is ``test_engine_generate`` of (prompt, slot,
   attempt), and a shipped worker's trajectory is, turn by turn, the scripted engine's output for
   (weights URI of the turn's version, prompt and every token before the turn, the turn's seed),
   with the chaos environment's observation ``<oK>`` after model turn K. The checker rebuilds each
   model turn with the engine's own ``tokens_for`` and each observation, so a repeated or missing
   prefix, a turn longer than ``max_tokens``, more turns than the group allows, or a turn stamped
   with a version other than the one that generated it fails the run.

3. **A progress record left after its group settled** (``check_leftover``): at the end every
   group is committed, dead-lettered or filtered, and ``complete`` and every parking drop the
   record, so the ``partial`` hash must hold no entry that settled. A record the adversary may have
   written (it ran a command on ``partial`` or ``partial:head``) is reported, not failed.

The trainer logs each leased group's samples (``trained``: ``sample_record``); the harness reads the
``partial:head`` hash into the truth. It only reads.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from rollout_queue.core.models import Sample
    from rollout_queue.devtools.chaos.checker import Checker

#: The shipped workers' sampling (fleet.shipped_options): the scripted engine gives ENGINE_TOKENS per
#: request, a model turn is capped at MAX_TOKENS, a trajectory at TRAJECTORY_TOKENS after its prompt.
ENGINE_TOKENS, MAX_TOKENS, TRAJECTORY_TOKENS = 6, 8, 256
#: A shipped worker may log its reservation this long after Redis granted it (its weights may have
#: changed meanwhile): the versions it had loaded are taken from this long before the record.
RESERVE_SLACK_S = 1.0


def sample_record(s: "Sample") -> dict[str, Any]:
    """One trained sample as the trainer logs it: what the checks here replay."""
    return {"slot": s.slot, "tokens": list(s.token_ids), "version": s.version, "versions": list(s.versions),
            "segments": [list(p) for p in s.segments], "turns": [[t.role, t.n_tokens, t.version] for t in s.turns],
            "finish": s.finish_reason}


def index_of(sid: str) -> int | None:
    """Group ``i`` of ``chaos-<seed>-<i>`` (roles.source_id); None for any other id."""
    tail = sid.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def segment_errors(s: dict[str, Any]) -> list[str]:
    """Why a sample's per-token versions are not well formed (rule 1's first point); [] when they are."""
    n, version = len(s["tokens"]), int(s["version"])
    segs = [(int(o), int(v)) for o, v in s["segments"]] or ([(0, version)] if n else [])
    out = []
    for i, (offset, v) in enumerate(segs):
        if (offset != 0) if i == 0 else not segs[i - 1][0] < offset < n:
            out.append(f"segment {i} starts at token {offset}: offsets must rise from 0 below {n} tokens")
        if i and v < segs[i - 1][1]:
            out.append(f"segment {i} goes back from version {segs[i - 1][1]} to {v}")
    if segs and segs[0][1] != version:
        out.append(f"its first segment's version {segs[0][1]} is not its version {version}")
    if s.get("versions") and not {v for _, v in segs} <= set(s["versions"]):
        out.append(f"segments name versions {sorted({v for _, v in segs} - set(s['versions']))} "
                   f"outside its versions {s['versions']}")
    return out


class Loads:
    """Which version each shipped worker had loaded when: its ``start`` and ``weights_applied`` records."""

    def __init__(self, records: Sequence[dict[str, Any]]) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)
        self.versions: dict[str, list[int]] = defaultdict(list)
        for rec in sorted(records, key=lambda r: r["t"]):
            if rec.get("version") is not None and rec.get("worker"):
                self.times[rec["worker"]].append(rec["t"])
                self.versions[rec["worker"]].append(int(rec["version"]))

    def during(self, worker: str, start: float, end: float) -> set[int] | None:
        """Every version ``worker`` had loaded in [start, end]; None when it logged no load before ``end``."""
        times = self.times.get(worker)
        if not times or times[0] > end:
            return None
        lo = max(0, bisect.bisect_right(times, start) - 1)
        hi = bisect.bisect_right(times, end)
        return set(self.versions[worker][lo:hi])


def check_samples(c: "Checker") -> None:
    """Rules 1 and 2 over every ``trained`` record of the run."""
    from rollout_queue.devtools.chaos.roles import prompt_of

    h, r = c.h, c.report
    published: dict[int, float] = {}
    for rec in h.by_op["publish_record"]:
        v = int(rec["version"])
        published[v] = min(published.get(v, rec["t"]), rec["t"])
    loads = Loads([rec for rec in h.ops("start", "weights_applied") if rec.get("shipped")])
    shipped_attempts: dict[str, list[tuple[int, str, float]]] = defaultdict(list)  # eid -> (attempt, worker, t)
    test_version: dict[tuple[str, int], int] = {}
    for rec in h.by_op["reserve_ok"]:
        for grant in rec["grants"]:
            if rec.get("shipped"):
                shipped_attempts[grant[0]].append((int(grant[1]), rec["worker"], rec["t"]))
            elif rec.get("version") is not None:
                test_version[(grant[0], int(grant[1]))] = int(rec["version"])
    completed = {(rec["eid"], rec["attempt"]): rec["t"] for rec in h.by_op["complete_ok"]}
    replay = _Replay(c.spec.seed)
    stats = {"samples": 0, "trajectories": 0, "multi_version": 0, "tokens": 0}
    for lease in h.by_op["trained"]:
        for eid, attempt, sid, samples in lease["groups"]:
            i = index_of(sid)
            prompt = prompt_of(c.spec.seed, i) if i is not None else None
            done_t = min(completed.get((eid, attempt), lease["t"]), lease["t"])
            by_shipped = [a for a in shipped_attempts.get(eid, []) if a[0] <= attempt]
            for s in samples:
                stats["samples"] += 1
                stats["tokens"] += len(s["tokens"])
                stats["trajectories"] += bool(s["turns"])
                what = f"trained sample {eid} (group {sid}) attempt {attempt} slot {s['slot']}"
                for why in segment_errors(s):
                    r.violate(f"{what} has per-token versions it could not have run under: {why}")
                versions = {int(v) for _, v in s["segments"]} or {int(s["version"])}
                stats["multi_version"] += len(versions) > 1
                for v in sorted(versions):
                    if v and (v not in published or published[v] > done_t):
                        when = "never published" if v not in published else f"only published at {published[v]:.3f}"
                        r.violate(f"{what} claims version {v}, which was {when} (its attempt completed by "
                                  f"{done_t:.3f})")
                if s["turns"] or (by_shipped and (eid, attempt) not in test_version):
                    _check_shipped_loads(c, what, versions, by_shipped, loads, lease["t"])
                elif (eid, attempt) in test_version and versions != {test_version[(eid, attempt)]}:
                    r.violate(f"{what} claims versions {sorted(versions)}; its test-engine attempt was reserved "
                              f"at version {test_version[(eid, attempt)]}")
                mismatch = None if prompt is None else replay.mismatch(prompt, sid, attempt, s, i or 0)
                if mismatch:
                    r.violate(f"{what}: {mismatch}")
    r.samples = stats


def _check_shipped_loads(c: "Checker", what: str, versions: set[int], attempts: list[tuple[int, str, float]],
                         loads: Loads, end: float) -> None:
    allowed: set[int] = set()
    for _, worker, t in attempts:
        seen = loads.during(worker, t - RESERVE_SLACK_S, end)
        if seen is None:
            return  # a worker whose loads were never logged (killed before its start line): nothing to hold it to
        allowed |= seen
    if attempts and not versions <= allowed:
        c.report.violate(f"{what} claims versions {sorted(versions - allowed)} that no shipped worker holding an "
                         f"attempt of it had loaded (they had {sorted(allowed)})")


class _Replay:
    """Rebuilds what the engines generate (rule 2), with their own functions."""

    def __init__(self, seed: int) -> None:
        from rollout_queue.workers.engines.scripted import ScriptedEngine

        self.seed = seed
        self.engine = ScriptedEngine("", tokens=ENGINE_TOKENS)

    def mismatch(self, prompt: str, sid: str, attempt: int, s: dict[str, Any], i: int) -> str | None:
        """Why ``s`` is not exactly what its engine generated (None: it is)."""
        return self._trajectory(prompt, sid, s, i) if s["turns"] else self._single(prompt, attempt, s)

    def _single(self, prompt: str, attempt: int, s: dict[str, Any]) -> str | None:
        """A test-engine sample: ``test_engine_generate`` of (prompt, slot, attempt), whole."""
        from rollout_queue import Receipt, Reservation, SourceGroup
        from rollout_queue.demo.walkthrough import test_engine_generate

        probe = Reservation(Receipt("0-0", attempt, "chaos-check"), SourceGroup("x", prompt, n=1), 0)
        want = list(test_engine_generate(probe, int(s["slot"])).token_ids)
        if s["tokens"] == want:
            return None
        return _twice(s["tokens"], want) or "its tokens are not the test engine's for its attempt"

    def _trajectory(self, prompt: str, sid: str, s: dict[str, Any], i: int) -> str | None:
        """A shipped worker's trajectory: model turn K is the scripted engine's output after everything
        before it under its own version's weights; observation K is ``<oK>``; at most the group's turns."""
        from rollout_queue.devtools.chaos.roles import weights_uri
        from rollout_queue.workers.attempt import sampling_for
        from rollout_queue.workers.engines.base import SamplingConfig
        from rollout_queue.workers.trajectory import _turn_params

        eng, tokens = self.engine, s["tokens"]
        base = sampling_for(SamplingConfig(max_tokens=MAX_TOKENS, seed=self.seed), sid, int(s["slot"]))
        context, at, model = eng.encode(prompt), 0, 0
        for role, n, version in s["turns"]:
            span = tokens[at:at + n]
            if role == "model":
                if n > MAX_TOKENS:
                    return f"model turn {model} has {n} tokens, more than max_tokens {MAX_TOKENS} (a prefix repeated?)"
                eng.weights_uri = weights_uri(version) if version else ""
                params = _turn_params(base, model, TRAJECTORY_TOKENS - at)
                want = list(eng.tokens_for("", eng.decode(context), params))
                if span != want:
                    return (_twice(tokens, tokens[:at] + want) or
                            f"model turn {model} is not the scripted engine's output after its prefix under "
                            f"version {version}")
                model += 1
            else:
                want = list(eng.encode_continuation(f"<o{model - 1}>"))
                if span != want:
                    return (_twice(tokens, tokens[:at] + want)
                            or f"observation {span} after model turn {model - 1} is not <o{model - 1}>")
            context += span
            at += n
        turns = 1 + i % 3
        if model > turns:
            return f"token(s) trained twice: {model} model turns in a group whose environment allows {turns}"
        return None


def _twice(have: list[int], want: list[int]) -> str | None:
    """Names a repeated prefix: ``have`` holds some non-empty run of its own tokens twice in a row
    at a point where ``want`` (what the engine would give) differs."""
    cut = next((k for k, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
    for length in range(1, cut + 1):
        if have[cut - length:cut] == have[cut:cut + length]:
            return f"tokens {cut - length}..{cut - 1} trained twice (repeated at {cut}: a continuation repeated its prefix)"
    if len(have) > len(want) and have[:len(want)] == want:
        return f"{len(have) - len(want)} token(s) beyond what the engine generated"
    return None


def check_leftover(c: "Checker") -> None:
    """Rule 3: no progress record of a group that settled."""
    t, r = c.truth, c.report
    committed = {eid for line in t.commits for eid in filter(None, line.get("ids", "").split(","))}
    dead = {line["entry_id"] for line in t.dlq}
    filtered = {eid for eid, value in t.ledger.items() if value.split("|")[1:2] == ["filtered"]}
    forged = any(rec["outcome"] == "ran" and rec["key"] in ("partial", "partial_head")
                 for rec in c.h.by_op.get("adv_cmd", ()))
    meta = t.meta
    r.partials = {k: int(meta.get(f"partial_{k}", 0) or 0) if str(meta.get(f"partial_{k}", 0) or 0).lstrip("-").isdigit()
                  else meta.get(f"partial_{k}") for k in ("saved", "continued", "stale", "bytes")}
    r.partials["left"] = len(t.partial_heads)
    for eid, head in sorted(t.partial_heads.items()):
        how = ("committed" if eid in committed else "dead-lettered" if eid in dead
               else "filtered" if eid in filtered else None)
        if how is None:
            continue  # unsettled: check_stuck fails the run on the group itself
        if forged:
            r.partials["forged_left"] = r.partials.get("forged_left", 0) + 1
            continue
        r.violate(f"progress record of {eid} ({c.h.sid_of.get(eid, '?')}) left after its group was {how}: "
                  f"head {head!r}")
