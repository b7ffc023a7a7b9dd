"""`recall up` with a real Prometheus scraping it: every PromQL expression of the dashboard
and the alert rules parses against the exported metrics, and the dashboard's return data."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import (
    BIN,
    INGEST_KEY,
    JWT_SECRET,
    call_recall,
    free_port,
    indexed_chunks,
    mint,
    post_conversation,
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
        proc.terminate()
        proc.wait(60)


def test_recall_up_prints_how_to_use_it_and_demo_works(stack_up):
    env, log, _ = stack_up
    banner = log.read_text()
    assert f"http://127.0.0.1:{env['RECALL_INGEST_PORT']}/turns" in banner
    assert f"http://127.0.0.1:{env['RECALL_RECALL_PORT']}/mcp" in banner
    assert "curl -s -X POST" in banner and "dev token for demo-user" in banner
    demo = subprocess.run([str(BIN / "recall"), "demo"], env=env, capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "1069.5 units/day at 18 months" in demo.stdout and "MT-4471" in demo.stdout


def _prometheus(tmp_path: Path, env: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(REPO / "deploy" / "prometheus" / "alerts.yml")],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{env[var]}"]}]}
                           for job, var in (("recall", "RECALL_RECALL_PORT"), ("recall-indexer", "RECALL_INDEXER_PORT"),
                                            ("recall-ingest", "RECALL_INGEST_PORT"))],
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


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian package prometheus); make test installs it where it can")
async def test_dashboard_and_alert_expressions_work_against_the_real_metrics(stack_up, tmp_path):
    env, _, _ = stack_up
    prom, url = _prometheus(tmp_path, env)
    try:
        post_conversation(env, "alice", "a1", ["What did we decide on N-11?", "Proceed once MT-4471 closes."])
        assert wait_until(lambda: indexed_chunks(env, "alice") == 2, 30)
        for q in ("N-11", "MT-4471", ""):
            await call_recall(env, mint("alice"), q)
        await call_recall(env, mint("nobody"), "N-11")
        httpx.post(f"http://127.0.0.1:{env['RECALL_INGEST_PORT']}/turns", json={}, headers={"x-ingest-key": "wrong"})
        assert wait_until(lambda: _query(url, 'count(up{job=~"recall.*"} == 1)')["data"]["result"][0]["value"][1] == "3"
                          if _query(url, 'count(up{job=~"recall.*"} == 1)')["data"]["result"] else False, 30)
        time.sleep(4)  # rate() over [5m] needs two scrapes after the traffic

        dashboard = json.loads((REPO / "deploy" / "grafana" / "recall.json").read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = _with_all_selected(target["expr"], dashboard)
                res = _query(url, expr)
                assert res["status"] == "success", (panel["title"], expr, res)
                assert res["data"]["result"], f"no data for {panel['title']}: {expr}"
        for variable in dashboard["templating"]["list"]:
            query = _with_all_selected(variable["query"]["query"], dashboard)
            series = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
            assert series and _query(url, series.group(1))["data"]["result"], (variable["name"], query)

        exported = set(httpx.get(f"{url}/api/v1/label/__name__/values").json()["data"])
        rules = [r for g in yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"] for r in g["rules"]]
        for rule in rules:
            res = _query(url, rule["expr"])
            assert res["status"] == "success", (rule["alert"], res)
            for name in re.findall(r"\b(recall_[a-z_]+?)(?:_bucket|_count|_sum)?\b", rule["expr"]):
                assert any(m.startswith(name) for m in exported), f"{rule['alert']} uses {name}, which nothing exports"
        loaded = [r for g in httpx.get(f"{url}/api/v1/rules").json()["data"]["groups"] for r in g["rules"]]
        assert {r["name"] for r in loaded} == {r["alert"] for r in rules}
        assert all(r["health"] in ("ok", "unknown") for r in loaded), [(r["name"], r.get("lastError")) for r in loaded]
        # With every part up, none of the presence alerts is pending or firing.
        quiet = {"RecallTargetDown", "RecallIndexerMetricsAbsent", "RecallServiceMetricsAbsent", "RecallIngestMetricsAbsent"}
        assert not [r["name"] for r in loaded if r["name"] in quiet and r["state"] != "inactive"]

        # The indexer HPA's metric, as prometheus-adapter asks for it.
        adapter = yaml.safe_load((REPO / "deploy" / "k8s" / "monitoring" / "prometheus-adapter-rules.yaml").read_text())
        [rule] = yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"]
        res = _query(url, rule["metricsQuery"].replace("<<.LabelMatchers>>", ""))
        assert res["status"] == "success" and res["data"]["result"], res
    finally:
        prom.terminate()
        prom.wait(30)


def test_sigterm_stops_every_part_of_recall_up(stack_up):
    import psutil

    _, log, proc = stack_up
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 4, "redis-server, ingest, indexer and the recall service"
    proc.terminate()
    assert proc.wait(60) == 0, log.read_text()[-2000:]
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"
