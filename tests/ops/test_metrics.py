"""The Prometheus exporter over HTTP against the known state, a failed scrape, and process metrics."""

from __future__ import annotations

import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from rollout_queue import Progress
from rollout_queue.core.histograms import SECOND_BUCKETS, TOKEN_BUCKETS
from rollout_queue.ops import metrics
from rollout_queue.ops.views import QueueView
from tests.ops.conftest import ALIVE, PROGRESS, SAMPLE_SECONDS, SAMPLE_TOKENS, SILENT, Cli, KnownState


def samples_of(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def test_the_exporter_binds_loopback_unless_told(shared_state: KnownState) -> None:
    """The series name queues, workers and trainers: by default nothing off this host can scrape them."""
    import argparse

    from rollout_queue.cli.status import register

    view = QueueView.from_url(shared_state.url, shared_state.queue)
    server, _ = metrics.serve(view, 0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        view.close()
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["metrics"]).addr == "127.0.0.1"


def test_exporter_serves_the_queue_over_http(shared_state: KnownState) -> None:
    shared_state.refresh()
    view = QueueView.from_url(shared_state.url, shared_state.queue)
    server, thread = metrics.serve(view, 0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as response:
            found = samples_of(response.read().decode())
    finally:
        server.shutdown()
        view.close()
    q = shared_state.queue
    for state, n in {"backlog": 2, "ready": 1, "executing": 2, "completed": 1, "leased": 1, "committed": 1,
                     "filtered": 0, "dead": 1}.items():
        assert value(found, "rollout_queue_groups", queue=q, state=state) == n, state
    assert value(found, "rollout_queue_up", queue=q) == 1
    assert value(found, "rollout_queue_policy_version", queue=q) == 3
    assert 0 <= value(found, "rollout_queue_seconds_since_last_commit", queue=q) < 600  # g1 was committed
    assert value(found, "rollout_queue_workers", queue=q, status="alive") == 1
    assert value(found, "rollout_queue_workers", queue=q, status="silent") == 1
    assert value(found, "rollout_queue_leases_active", queue=q) == 1
    assert 0 < value(found, "rollout_queue_lease_seconds_to_deadline", queue=q) <= 600
    assert value(found, "rollout_queue_buffer_staleness_versions_bucket", queue=q, le="0.0") == 0
    assert value(found, "rollout_queue_buffer_staleness_versions_bucket", queue=q, le="1.0") == 1
    assert value(found, "rollout_queue_pel_attempts_bucket", queue=q, le="1.0") == 5
    assert value(found, "rollout_queue_executing_attempt_age_seconds_gcount", queue=q) == 2
    assert value(found, "rollout_queue_submitted_total", queue=q) == 9
    assert value(found, "rollout_queue_attempts_ended_total", queue=q, terminal="failed") == 3
    assert value(found, "rollout_queue_evictions_total", queue=q, reason="stale") == 0
    for state in ("backlog", "ready", "executing", "completed", "leased"):
        assert value(found, "rollout_queue_oldest_wait_seconds", queue=q, state=state) > 0, state
    assert value(found, "rollout_queue_admission_held_seconds", queue=q) == 0
    assert value(found, "rollout_queue_worker_completed_groups_total", queue=q, worker=ALIVE) == PROGRESS.groups
    assert value(found, "rollout_queue_worker_generated_tokens_total", queue=q, worker=ALIVE) == PROGRESS.tokens
    assert ("rollout_queue_worker_completed_groups_total", frozenset({("queue", q), ("worker", SILENT)})) not in found
    assert value(found, "rollout_queue_workers_reaped_total", queue=q) == 1


def test_countdowns_never_vanish_and_holds_show_their_age(known_state: KnownState) -> None:
    """No lease: the countdown reads +Inf (an alert on "< 60" stays quiet, the series stays); an
    empty state waits 0 s; a standing hold's age grows."""
    st = known_state
    st.lease.rollback()
    hold = st.q.hold(timeout_s=60, holder="trainer-0")
    view = QueueView.from_url(st.url, st.queue)
    try:
        found = samples_of(generate_latest(metrics.registry_for(view)).decode())
    finally:
        view.close()
    assert value(found, "rollout_queue_lease_seconds_to_deadline", queue=st.queue) == float("inf")
    assert value(found, "rollout_queue_oldest_wait_seconds", queue=st.queue, state="leased") == 0
    assert value(found, "rollout_queue_admission_held_seconds", queue=st.queue) >= 0
    assert value(found, "rollout_queue_admission_holds", queue=st.queue) == 1
    hold.release()


def test_a_failed_scrape_says_up_0(shared_state: KnownState, cli: Cli) -> None:
    view = QueueView.from_url(shared_state.url, "no-such-queue")
    found = samples_of(generate_latest(metrics.registry_for(view)).decode())
    assert found == {("rollout_queue_up", frozenset({("queue", "no-such-queue")})): 0.0}
    code, out, _ = cli(shared_state.url, shared_state.queue, "metrics", "--once")
    assert code == 0 and value(samples_of(out), "rollout_queue_groups", queue=shared_state.queue, state="dead") == 1
    assert cli(shared_state.url, "no-such-queue", "metrics", "--once")[0] == 4


def test_process_metrics_of_workers_and_trainers() -> None:
    pm = metrics.ProcessMetrics("q")
    pm.completed(tokens=120, samples=4, seconds=2.5)
    with pm.lease_wait_timer():
        pass
    found = samples_of(generate_latest(pm.registry).decode())
    assert value(found, "rollout_queue_worker_tokens_total", queue="q") == 120
    assert value(found, "rollout_queue_worker_samples_total", queue="q") == 4
    assert value(found, "rollout_queue_worker_attempt_seconds_count", queue="q") == 1
    assert value(found, "rollout_queue_trainer_lease_wait_seconds_count", queue="q") == 1


def test_per_worker_liveness_and_monotonic_commits_and_dead_letters(known_state: KnownState) -> None:
    """Per-worker heartbeat age and load; commits and dead letters as counters that a restore or a DLQ
    requeue (which lower the committed and dead gauges) never make go back."""
    st, q = known_state, known_state.queue
    view = QueueView.from_url(st.url, q)
    try:
        found = samples_of(metrics.exposition(view))
        assert value(found, "rollout_queue_worker_heartbeat_age_seconds", queue=q, worker=ALIVE) < 0.5
        assert value(found, "rollout_queue_worker_heartbeat_age_seconds", queue=q, worker=SILENT) > 0.5
        assert value(found, "rollout_queue_worker_executing_groups", queue=q, worker=ALIVE) == 1
        assert value(found, "rollout_queue_worker_executing_groups", queue=q, worker=SILENT) == 1
        assert value(found, "rollout_queue_commits_total", queue=q) == 1
        assert value(found, "rollout_queue_dead_letters_total", queue=q) == 1
        st.lease.commit(step=1)  # type: ignore[attr-defined]
        assert value(samples_of(metrics.exposition(view)), "rollout_queue_commits_total", queue=q) == 2
        st.q.requeue_dead_letter(st.dlq_id)
        assert st.q.restore(0) == 1  # g2, committed at step 1 (the fixture's first commit had no step)
        found = samples_of(metrics.exposition(view))
        assert value(found, "rollout_queue_groups", queue=q, state="dead") == 0
        assert value(found, "rollout_queue_groups", queue=q, state="committed") == 1
        assert value(found, "rollout_queue_restored_total", queue=q) == 1
        assert value(found, "rollout_queue_commits_total", queue=q) == 2
        assert value(found, "rollout_queue_dead_letters_total", queue=q) == 1
    finally:
        view.close()


def test_tokens_generated_trained_and_discarded_by_reason(known_state: KnownState) -> None:
    """Issue 30: where generated tokens went, as counters: generated / trained is the waste ratio, and
    discarded carries a reason label (every reason served, 0 until it happens)."""
    st, q = known_state, known_state.queue
    view = QueueView.from_url(st.url, q)
    try:
        found = samples_of(metrics.exposition(view))  # three groups of 2 samples x 3 tokens completed
        assert value(found, "rollout_queue_tokens_generated_total", queue=q) == 18
        assert value(found, "rollout_queue_tokens_trained_total", queue=q) == 6
        assert value(found, "rollout_queue_tokens_discarded_total", queue=q, reason="rolled_back") == 0
        assert st.lease.rollback() == 1  # type: ignore[attr-defined]
        found = samples_of(metrics.exposition(view))
        assert value(found, "rollout_queue_tokens_discarded_total", queue=q, reason="rolled_back") == 6
        assert value(found, "rollout_queue_tokens_discarded_total", queue=q, reason="stale") == 0
        assert value(found, "rollout_queue_tokens_continued_total", queue=q) == 0
    finally:
        view.close()


def test_sample_lengths_and_durations_are_histograms_over_the_registered_workers(known_state: KnownState) -> None:
    """host-a's counts (the only worker that reports any) as cumulative ``le`` buckets and a count, no
    ``_sum`` (workers count buckets, not totals); a second worker adds to them, and a worker that
    closes takes its counts out again."""
    st, q = known_state, known_state.queue
    view = QueueView.from_url(st.url, q)
    try:
        text = metrics.exposition(view)
        types = {f.name: f.type for f in text_string_to_metric_families(text)}
        assert types["rollout_queue_sample_tokens"] == types["rollout_queue_sample_seconds"] == "histogram"
        found = samples_of(text)
        for name, edges, counts in (("rollout_queue_sample_tokens", TOKEN_BUCKETS, SAMPLE_TOKENS),
                                    ("rollout_queue_sample_seconds", SECOND_BUCKETS, SAMPLE_SECONDS)):
            buckets = [value(found, f"{name}_bucket", queue=q, le=floatToGoString(e)) for e in edges]
            assert buckets == [float(sum(counts[:i + 1])) for i in range(len(edges))], name
            assert value(found, f"{name}_bucket", queue=q, le="+Inf") == value(found, f"{name}_count", queue=q) == 20
            assert not any(n == f"{name}_sum" for n, _ in found), name
        assert value(found, "rollout_queue_sample_tokens_bucket", queue=q, le="256.0") == 12
        assert value(found, "rollout_queue_sample_seconds_bucket", queue=q, le="600.0") == 19  # one above 600 s
        st.q.worker("host-c:gpu2").heartbeat(Progress(1, 10, 1000, (5,) + (0,) * 12, (0,) * 13))
        found = samples_of(metrics.exposition(view))
        assert value(found, "rollout_queue_sample_tokens_bucket", queue=q, le="16.0") == 5
        assert value(found, "rollout_queue_sample_tokens_count", queue=q) == 25
        assert value(found, "rollout_queue_sample_seconds_count", queue=q) == 20  # it reported all zeros
        st.workers[ALIVE].close()
        found = samples_of(metrics.exposition(view))
        assert value(found, "rollout_queue_sample_tokens_count", queue=q) == 5
        assert value(found, "rollout_queue_sample_seconds_bucket", queue=q, le="+Inf") == 0
    finally:
        view.close()
