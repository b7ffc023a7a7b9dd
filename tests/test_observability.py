"""`recall up` and the Redis and PostgreSQL exporters with a real Prometheus scraping them and evaluating
deploy/prometheus/alerts.yml: every series the dashboard, the alert rules, the prometheus-adapter
rule, the HPA and the operations docs name is exported, with the labels and label values they
use; the dashboard's panels return data; presence alerts stay quiet on a fresh stack; the
unexpected-error alerts fire on the first real failure."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import (
    BIN,
    INGEST_KEY,
    JWT_SECRET,
    call_recall,
    conversation_payload,
    free_port,
    indexed_chunks,
    mint,
    post_conversation,
    postgres_cluster,
    wait_until,
)

REPO = Path(__file__).resolve().parents[1]
PROMETHEUS = shutil.which("prometheus")


@pytest.fixture
def stack_up(tmp_path):
    """The real `recall up` (embedded Redis, three services) on free ports."""
    env = {k: v for k, v in os.environ.items() if k != "RECALL_REDIS_URL"}
    env.update({"RECALL_DATA_DIR": str(tmp_path / "data"), "RECALL_EMBEDDED_REDIS_PORT": str(free_port()),
                "RECALL_INGEST_PORT": str(free_port()), "RECALL_INDEXER_PORT": str(free_port()),
                "RECALL_RECALL_PORT": str(free_port()), "RECALL_INGEST_KEY": INGEST_KEY, "RECALL_JWT_SECRET": JWT_SECRET,
                "RECALL_INDEX_DEBOUNCE_S": "0.2", "FASTMCP_LOG_ENABLED": "false"})
    log = open(tmp_path / "up.log", "wb")
    proc = subprocess.Popen([str(BIN / "recall"), "up"], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: b"Ctrl-C stops everything" in (tmp_path / "up.log").read_bytes() or proc.poll() is not None, 120)
        assert proc.poll() is None, (tmp_path / "up.log").read_text()
        yield env, (tmp_path / "up.log"), proc
    finally:
        stopping = time.monotonic()
        proc.terminate()
        try:  # a part that outlives its grace (25 + 5 s; then as long for the indexer) is killed by recall up itself
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"recall up did not stop within 90 s of SIGTERM:\n{(tmp_path / 'up.log').read_text()[-3000:]}")
        if time.monotonic() - stopping > 10:  # once over 60 s in CI, never here: say which part was slow
            warnings.warn(f"recall up took {time.monotonic() - stopping:.0f} s to stop; its log's end:\n"
                          f"{(tmp_path / 'up.log').read_text()[-1500:]}")


def test_recall_up_prints_how_to_use_it_and_demo_works(stack_up):
    env, log, _ = stack_up
    banner = log.read_text()
    assert f"http://127.0.0.1:{env['RECALL_INGEST_PORT']}/turns" in banner
    assert f"http://127.0.0.1:{env['RECALL_RECALL_PORT']}/mcp" in banner
    assert "curl -s -X POST" in banner and "dev token for demo-user" in banner
    demo = subprocess.run([str(BIN / "recall"), "demo"], env=env, capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "1069.5 units/day at 18 months" in demo.stdout and "MT-4471" in demo.stdout


REDIS_EXPORTER = shutil.which("prometheus-redis-exporter") or shutil.which("redis_exporter")
POSTGRES_EXPORTER = shutil.which("prometheus-postgres-exporter") or shutil.which("postgres_exporter")
needs_postgres_exporter = pytest.mark.skipif(
    POSTGRES_EXPORTER is None,
    reason="the PostgreSQL exporter is not installed (Debian package prometheus-postgres-exporter); make tools installs it as root")
# The jobs as the Kubernetes ServiceMonitors name them (the Service names) and compose names them.
JOBS = {"recall": "RECALL_RECALL_PORT", "recall-indexer": "RECALL_INDEXER_PORT", "recall-ingest": "RECALL_INGEST_PORT"}
# Names in backticks in the docs that look like metrics and are not.
NOT_METRICS = {"recall_my_conversations", "recall_cpu_bench"}
METRIC = r"(?:recall|redis|pg|process)_[a-z0-9_]*[a-z0-9]|up"
DOCS = ("docs/operations.md", "docs/capacity.md", "docs/architecture.md", "README.md")


# postgres_exporter answers a scrape of a PostgreSQL that refuses connections after 1.0 s (its
# connection attempt), so the 1 s timeout of a 1 s interval failed that scrape (up 0, pg_up gone): 3 of 4 runs here.
SLOW_SCRAPES = {"recall-postgres": {"scrape_interval": "3s", "scrape_timeout": "3s"}}


def _prometheus(tmp_path: Path, targets: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(REPO / "deploy" / "prometheus" / "alerts.yml")],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}], **SLOW_SCRAPES.get(job, {})}
                           for job, target in targets.items()],
    }
    (tmp_path / "prom.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prom.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    assert wait_until(lambda: _ok(f"{url}/-/ready"), 60), "prometheus did not start"
    return proc, url


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _with_all_selected(expr: str, dashboard: dict) -> str:
    """The expression as Grafana sends it with every template variable at "All"."""
    for variable in dashboard["templating"]["list"]:
        expr = expr.replace(f"${variable['name']}", variable["allValue"])
    return expr


def _query(url: str, expr: str) -> dict:
    return httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()


def _targets_up(url: str) -> int:
    result = _query(url, "count(up == 1)")["data"]["result"]
    return int(result[0]["value"][1]) if result else 0


def _rules(url: str) -> list[dict]:
    return [r for g in httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"] for r in g["rules"]]


def _series(url: str, name: str) -> list[dict]:
    return httpx.get(f"{url}/api/v1/series", params={"match[]": name}, timeout=10).json()["data"]


# ---- what the dashboard, the rules, the autoscaler and the docs refer to ----------------------------
def promql_refs(expr: str) -> list[tuple[str, dict[str, tuple[str, str]], set[str]]]:
    """(metric, {label: (operator, value)}, labels grouped by) for every series selector of expr.
    The grouping labels of an expression must exist on the series it aggregates."""
    grouped = {label.strip() for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
               for label in group.split(",") if label.strip()}
    refs = []
    for name, selector in re.findall(rf"\b({METRIC})\b\s*(\{{[^}}]*\}})?", expr):
        matchers = {m[0]: (m[1], m[2]) for m in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', selector)}
        refs.append((name, matchers, grouped))
    return refs


def doc_refs(text: str) -> list[tuple[str, dict[str, tuple[str, str]], set[str]]]:
    """Metric references in backticks: `name`, `name{label}`, `name{label="value"}`."""
    refs = []
    for name, inside in re.findall(rf"`({METRIC})(?:\{{([^}}`]*)\}})?`", text):
        if name in NOT_METRICS:
            continue
        items = [i.strip() for i in inside.split(",") if i.strip()]
        matchers = {m[0]: (m[1], m[2]) for i in items for m in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', i)}
        matchers |= {i: ("", "") for i in items if re.fullmatch(r"\w+", i)}  # `name{label}`: the label exists
        refs.append((name, matchers, set()))
    return refs


def deploy_exprs() -> dict[str, str]:
    """Every PromQL expression the deployment ships, by where it is used."""
    dashboard = json.loads((REPO / "deploy" / "k8s" / "monitoring" / "dashboards" / "recall.json").read_text())
    exprs = {f"dashboard {p['title']} {t['refId']}": _with_all_selected(t["expr"], dashboard)
             for p in dashboard["panels"] for t in p["targets"]}
    for variable in dashboard["templating"]["list"]:
        query = _with_all_selected(variable["query"]["query"], dashboard)
        exprs[f"dashboard variable {variable['name']}"] = re.fullmatch(r"label_values\((.*), (\w+)\)", query).group(1)
    for group in yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            exprs[f"rule {rule.get('alert') or rule.get('record')}"] = rule["expr"]
    adapter = yaml.safe_load((REPO / "deploy" / "k8s" / "monitoring" / "prometheus-adapter-rules.yaml").read_text())
    for rule in yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"]:
        exprs[f"prometheus-adapter {rule['name']['as']}"] = rule["metricsQuery"].replace("<<.LabelMatchers>>", "")
    for hpa in yaml.safe_load_all((REPO / "deploy" / "k8s" / "base" / "hpa.yaml").read_text()):
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "External":
                exprs[f"HPA {hpa['metadata']['name']}"] = metric["external"]["metric"]["name"]
    return exprs


def alert_test_refs() -> dict[str, list]:
    """The series the promtool unit tests (alerts_test.yml) feed the alerts: each must be one the
    services export, with the labels given (a unit test on an invented series or label proves
    nothing about production). Label values are the tests' own: only the labels are checked."""
    tests = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts_test.yml").read_text())["tests"]
    refs: dict[str, list] = {}
    for test in tests:
        for item in test["input_series"]:
            name, labels = re.fullmatch(r"(\w+)(?:\{(.*)\})?", item["series"]).groups()
            matchers = {label: ("", "") for label in re.findall(r'(\w+)="', labels or "")}
            refs.setdefault(f"alerts_test.yml {test['name']}", []).append((name, matchers, set()))
    return refs


def test_reference_extraction_finds_selectors_matchers_and_grouping():
    [(name, matchers, grouped)] = promql_refs(
        'histogram_quantile(0.95, sum by (le, outcome) (rate(recall_tool_latency_seconds_bucket{outcome=~"hit|empty"}[5m])))')
    assert (name, matchers, grouped) == ("recall_tool_latency_seconds_bucket", {"outcome": ("=~", "hit|empty")}, {"le", "outcome"})
    assert [r[0] for r in promql_refs("redis_memory_used_bytes / (redis_memory_max_bytes > 0)")] == \
        ["redis_memory_used_bytes", "redis_memory_max_bytes"]
    assert doc_refs("watch `recall_busy_total{reason=\"queue_full\"}`, `recall_reembed_progress_ratio{user_hash}` "
                    "and `recall_my_conversations`") == [("recall_busy_total", {"reason": ("=", "queue_full")}, set()),
                                                         ("recall_reembed_progress_ratio", {"user_hash": ("", "")}, set())]


def mismatches(refs: dict[str, list], series_of, declared: set[str]) -> list[str]:
    """Each reference checked against the live series: the metric exists, every label it matches
    on or groups by is on its series, and every literal value it matches (= or an alternation of
    =~) occurs. A metric declared but without a series yet (a per-tenant gauge) passes on its name."""
    problems = []
    for where, items in refs.items():
        for name, matchers, grouped in items:
            series = series_of(name) or series_of(f"{name}_count")
            if not series:
                if name not in declared:
                    problems.append(f"{where}: {name} is exported by nothing")
                continue
            labels = set().union(*(s.keys() for s in series))
            problems += [f"{where}: {name} has no label {label!r} (it has {sorted(labels - {'__name__'})})"
                         for label in set(matchers) - labels]
            # A grouping label may come from another series of the same expression.
            others = set().union(*(s.keys() for other, _, _ in items if other != name for s in series_of(other) or [{}]))
            problems += [f"{where}: `by ({label})` but no series of it has {label!r}" for label in grouped - labels - others]
            for label, (op, value) in matchers.items():
                wanted = value.split("|") if op == "=~" and re.fullmatch(r"[\w-]+(\|[\w-]+)*", value) else \
                    [value] if op == "=" else []
                seen = {s.get(label) for s in series}
                problems += [f"{where}: {name}{{{label}=\"{v}\"}} matches no series (values: {sorted(x for x in seen if x)})"
                             for v in wanted if v not in seen]
    return problems


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian package prometheus); make test installs it where it can")
@pytest.mark.skipif(REDIS_EXPORTER is None, reason="the Redis exporter is not installed (Debian package prometheus-redis-exporter); make tools installs it as root")
@needs_postgres_exporter
async def test_every_series_the_dashboard_rules_autoscaler_and_docs_use_is_exported_with_its_labels(stack_up, postgres_url,
                                                                                                   tmp_path):
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    from shared.child_process import stop

    env, _, _ = stack_up
    # The embedded Redis takes the password `recall up` made; its URL is in recall-up.json.
    redis_url = json.loads((Path(env["RECALL_DATA_DIR"]) / "recall-up.json").read_text())["redis_url"]
    exporter_port = free_port()
    exporter = subprocess.Popen([REDIS_EXPORTER, "-redis.addr", redis_url,
                                 "-web.listen-address", f"127.0.0.1:{exporter_port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pg_exporter, pg_exporter_at = _start_postgres_exporter(postgres_url)
    targets = {job: f"127.0.0.1:{env[var]}" for job, var in JOBS.items()} | {"recall-redis": f"127.0.0.1:{exporter_port}",
                                                                           "recall-postgres": pg_exporter_at}
    prom, url = _prometheus(tmp_path, targets)
    try:
        # Freshly started, before any traffic: every target is scraped and no presence alert is
        # even pending (a metric that has no series until its first event would be "absent").
        assert wait_until(lambda: _targets_up(url) == len(targets), 30), _query(url, "up")
        time.sleep(3)
        presence = {"RecallTargetDown", "RecallIndexerMetricsAbsent", "RecallServiceMetricsAbsent",
                    "RecallIngestMetricsAbsent", "RecallRedisDown", "RecallPostgresDown", "RecallPostgresMetricsAbsent"}
        loaded = _rules(url)
        assert presence <= {r["name"] for r in loaded}
        assert not [(r["name"], r["state"]) for r in loaded if r["name"] in presence and r["state"] != "inactive"]

        post_conversation(env, "alice", "a1", ["What did we decide on N-11?", "Proceed once MT-4471 closes."])
        assert wait_until(lambda: indexed_chunks(env, "alice") == 2, 30)
        for q in ("N-11", "MT-4471", ""):
            await call_recall(env, mint("alice"), q)
        await call_recall(env, mint("nobody"), "N-11")
        ingest = f"http://127.0.0.1:{env['RECALL_INGEST_PORT']}"
        assert httpx.post(f"{ingest}/turns", json={}, headers={"x-ingest-key": "wrong"}).status_code == 401
        async with Client(f"http://127.0.0.1:{env['RECALL_RECALL_PORT']}/mcp",
                          auth=BearerAuth(mint("alice", realms={"acme": "member"}))) as client:
            created = await client.call_tool("register_realm_entity", {"realm_id": "acme", "entity_id": "contract-7",
                                                                       "title": "Integration contract"})
            assert json.loads(created.content[0].text)["created"] is True
        # Redis at its maxmemory (noeviction, as deployed): ingest refuses the write with 503, and
        # the Redis memory alert goes pending on the real exporter's numbers.
        import redis

        r = redis.Redis.from_url(redis_url)
        r.config_set("maxmemory", "1")
        try:
            full = httpx.post(f"{ingest}/turns", headers={"x-ingest-key": INGEST_KEY},
                              json=conversation_payload("bob", "b1", ["Is the N-11 upgrade scheduled?"]))
            assert full.status_code == 503 and full.json()["fields"][0]["field"] == "redis", full.text
            assert wait_until(lambda: {r["name"]: r["state"] for r in _rules(url)}["RecallRedisMemoryHigh"] == "pending", 15)
        finally:
            r.config_set("maxmemory", "0")
            r.close()
        receipt = httpx.delete(f"{ingest}/users/alice", headers={"x-ingest-key": INGEST_KEY}).json()["receipt"]
        assert wait_until(lambda: httpx.get(f"{ingest}/deletions/{receipt}", headers={"x-ingest-key": INGEST_KEY})
                          .json()["status"] == "done", 30)
        # Unexpected failures, for real: a receipt record damaged in Redis (ingest answers 500) and
        # a table gone from the artifacts database (a realm tool fails). Both alerts fire on the
        # first one: their series were exported at 0 before it, so increase() sees it.
        from shared.stream_schema import deletion_key

        with redis.Redis.from_url(redis_url) as damaged:
            damaged.hset(deletion_key(receipt), "record", "{}")
        assert httpx.get(f"{ingest}/deletions/{receipt}", headers={"x-ingest-key": INGEST_KEY}).status_code == 500
        with sqlite3.connect(Path(env["RECALL_DATA_DIR"]) / "artifacts.sqlite3") as db:
            db.execute("DROP TABLE realm_entities")
        async with Client(f"http://127.0.0.1:{env['RECALL_RECALL_PORT']}/mcp",
                          auth=BearerAuth(mint("alice", realms={"acme": "member"}))) as client:
            failed = await client.call_tool("register_realm_entity", {"realm_id": "acme", "entity_id": "contract-8",
                                                                      "title": "Support contract"}, raise_on_error=False)
            assert failed.is_error and "internal error" in failed.content[0].text
        unexpected = {"RecallIngestUnexpectedErrors", "RecallServiceUnexpectedErrors"}
        assert wait_until(lambda: {r["name"] for r in _rules(url) if r["state"] == "firing"} >= unexpected, 15), \
            [(r["name"], r["state"]) for r in _rules(url) if r["name"] in unexpected]
        time.sleep(4)  # rate() needs two scrapes after the traffic

        # The traffic reached the metrics (a counter that never moves would pass every check below).
        for expr in ('recall_realm_calls_total{surface="mcp",outcome="ok"}', 'recall_forgotten_total{kind="forget_user",reason="request"}',
                     'recall_ingest_requests_total{status="401"}', 'recall_tool_latency_seconds_count{outcome="hit"}',
                     'recall_tool_latency_seconds_count{outcome="no_memory"}', "recall_ingest_to_searchable_seconds_count"):
            assert wait_until(lambda: any(float(r["value"][1]) > 0 for r in _query(url, f"sum({expr})")["data"]["result"]), 10), expr

        exprs = deploy_exprs()
        for where, expr in exprs.items():
            res = _query(url, expr)
            assert res["status"] == "success", (where, expr, res)
            if where.startswith(("dashboard", "prometheus-adapter", "HPA")):
                assert res["data"]["result"], f"no data for {where}: {expr}"

        declared = set()
        for var in JOBS.values():
            declared |= set(re.findall(r"^# TYPE (\S+)", httpx.get(f"http://127.0.0.1:{env[var]}/metrics").text, re.M))
        refs = {where: promql_refs(expr) for where, expr in exprs.items()}
        refs |= {doc: doc_refs((REPO / doc).read_text()) for doc in DOCS} | alert_test_refs()
        assert sum(len(r) for r in refs.values()) > 80
        cache: dict[str, list[dict]] = {}
        problems = mismatches(refs, lambda name: cache.setdefault(name, _series(url, name)), declared)
        assert not problems, "\n".join(problems)

        loaded = _rules(url)
        assert {r["name"] for r in loaded} == {w.removeprefix("rule ") for w in exprs if w.startswith("rule ")}
        assert all(r["health"] in ("ok", "unknown") for r in loaded), [(r["name"], r.get("lastError")) for r in loaded]
        assert not [(r["name"], r["state"]) for r in loaded if r["name"] in presence and r["state"] != "inactive"]
    finally:
        prom.terminate()
        prom.wait(30)
        stop(exporter, 10)
        stop(pg_exporter, 10)


def test_sigterm_stops_every_part_of_recall_up(stack_up):
    import psutil

    _, log, proc = stack_up
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 4, "redis-server, ingest, indexer and the recall service"
    proc.terminate()
    assert proc.wait(60) == 0, log.read_text()[-2000:]
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"


async def test_realm_calls_failing_on_an_unreachable_database_are_counted_for_the_alert(services, service_env):
    """RecallRealmDatabaseUnavailable watches recall_realm_calls_total{outcome="database_unavailable"}:
    with PostgreSQL unreachable, an MCP realm tool and the AgentMemory HTTP API both fail soft
    and are counted there; conversation recall still answers."""
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    from tests.conftest import recall_url

    down = f"postgresql://recall:unused-password-0123@127.0.0.1:{free_port()}/recall"  # nothing listens there
    services("serve", RECALL_ARTIFACTS_DB_URL=down)
    token = mint("alice", realms={"acme": "member"})
    async with Client(f"{recall_url(service_env)}/mcp", auth=BearerAuth(token)) as client:
        failed = await client.call_tool("register_realm_entity", {"realm_id": "acme", "entity_id": "contract-7",
                                                                  "title": "Integration contract"}, raise_on_error=False)
        assert failed.is_error and "database is unavailable" in failed.content[0].text
        recalled = await client.call_tool("recall_my_conversations", {"query": "N-11"})
        assert "No earlier conversations" in recalled.content[0].text
    resp = httpx.get(f"{recall_url(service_env)}/realms/acme/memory", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert resp.status_code == 503, resp.text

    metrics = httpx.get(f"{recall_url(service_env)}/metrics").text
    counted = {}
    for labels, value in re.findall(r"^recall_realm_calls_total\{([^}]*)\} (\S+)$", metrics, re.M):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        counted[(pairs["surface"], pairs["outcome"])] = float(value)
    assert counted[("mcp", "database_unavailable")] == 1 and counted[("http", "database_unavailable")] == 1, counted
    assert counted[("mcp", "ok")] == 0 and counted[("http", "ok")] == 0


# ---- PostgreSQL: the exporter the deployment runs beside it, scraped by a real Prometheus ------------


def _start_postgres_exporter(database_url: str) -> tuple[subprocess.Popen, str]:
    """prometheus-community's postgres_exporter on a free port, configured as deploy/ configures it."""
    port = free_port()
    proc = subprocess.Popen([POSTGRES_EXPORTER, f"--web.listen-address=127.0.0.1:{port}"],
                            env={**os.environ, "DATA_SOURCE_NAME": f"{database_url}?sslmode=disable"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_until(lambda: _ok(f"http://127.0.0.1:{port}/metrics") or proc.poll() is not None, 30)
    assert proc.poll() is None, "postgres_exporter exited"
    return proc, f"127.0.0.1:{port}"


@pytest.fixture
def own_postgres() -> Iterator[tuple[str, Callable[[], None]]]:
    """A PostgreSQL cluster of this test alone, and a way to stop it."""
    with postgres_cluster() as cluster:
        yield cluster


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian package prometheus); make tools installs it as root")
@needs_postgres_exporter
def test_postgresql_going_down_turns_pg_up_to_0_and_the_alert_pending_and_a_lost_exporter_is_noticed(own_postgres, tmp_path):
    """The real exporter against a real PostgreSQL, scraped by a real Prometheus evaluating
    deploy/prometheus/alerts.yml: the dashboard's PostgreSQL row has data, no PostgreSQL alert is
    pending while all is well; PostgreSQL stopped makes RecallPostgresDown pending, the exporter
    gone makes RecallPostgresMetricsAbsent pending."""
    import psycopg

    from shared.child_process import stop

    database_url, stop_postgres = own_postgres
    dashboard = json.loads((REPO / "deploy" / "k8s" / "monitoring" / "dashboards" / "recall.json").read_text())
    panels = [p for p in dashboard["panels"] if "pg_" in " ".join(t["expr"] for t in p["targets"])]
    states = lambda url: {r["name"]: r["state"] for r in _rules(url) if r["name"].startswith("RecallPostgres")}  # noqa: E731
    exporter, exporter_at = _start_postgres_exporter(database_url)
    prom, url = _prometheus(tmp_path, {"recall-postgres": exporter_at})
    try:
        assert wait_until(lambda: _query(url, "pg_up")["data"]["result"], 30), _query(url, "up")
        assert _query(url, "pg_up")["data"]["result"][0]["value"][1] == "1"
        with psycopg.connect(database_url, autocommit=True) as conn:  # traffic for the transaction rate
            for _ in range(20):
                conn.execute("SELECT 1")
        time.sleep(7)  # rate() needs two scrapes (3 s apart) after the traffic
        assert len(panels) == 3
        for panel in panels:
            for target in panel["targets"]:
                assert _query(url, _with_all_selected(target["expr"], dashboard))["data"]["result"], target["expr"]
        assert states(url) == {"RecallPostgresDown": "inactive", "RecallPostgresMetricsAbsent": "inactive"}

        stop_postgres()
        assert wait_until(lambda: _query(url, "pg_up == 0")["data"]["result"], 30), _query(url, "pg_up")
        assert wait_until(lambda: states(url)["RecallPostgresDown"] == "pending", 15), states(url)
        assert states(url)["RecallPostgresMetricsAbsent"] == "inactive", "the exporter still answers"

        stop(exporter, 10)
        assert wait_until(lambda: states(url)["RecallPostgresMetricsAbsent"] == "pending", 30), states(url)
    finally:
        prom.terminate()
        prom.wait(30)
        stop(exporter, 10)
