"""deploy/: the files parse, reference only what the Dockerfile defines, set only real settings,
and pass promtool."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from services.indexer.settings import IndexerSettings
from services.ingest.settings import IngestSettings
from services.recall.settings import RecallSettings
from services.stack import StackSettings
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
# Variables read by something other than our settings classes.
FOREIGN_ENV = {"HF_HUB_OFFLINE", "HF_HOME", "FASTMCP_LOG_ENABLED", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED",
               "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK", "GF_SECURITY_ADMIN_PASSWORD",
               # read by the engine itself (shared/engine), not by a service settings class
               "RECALL_SQLITE_JOURNAL_MODE", "RECALL_EMBED_MODEL_DIR", "RECALL_RERANK_MODEL_DIR"}
SETTINGS = {"ingest": IngestSettings, "indexer": IndexerSettings, "recall": RecallSettings}


def setting_names(cls) -> set[str]:
    return {f"RECALL_{name.upper()}" for name in cls.model_fields}


def dockerfile_targets() -> set[str]:
    return set(re.findall(r"^FROM \S+ AS (\S+)$", (DEPLOY / "Dockerfile").read_text(), re.M))


def k8s_documents() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").rglob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_dockerfile_defines_a_target_per_service_and_runs_as_non_root():
    text = (DEPLOY / "Dockerfile").read_text()
    assert {"ingest", "indexer", "recall"} <= dockerfile_targets()
    assert "USER 10001" in text and "HF_HUB_OFFLINE=1" in text
    assert re.search(r"ADD --checksum=sha256:\$\{FUNES_SHA256\} --chmod=0755", text)
    for stage in ("ingest", "indexer", "recall"):
        assert re.search(rf'FROM runtime AS {stage}\n(.*\n)*?CMD \["recall", "(ingest|indexer|serve)"\]', text)


def test_compose_builds_only_dockerfile_targets_and_sets_only_real_settings():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert services["indexer"]["deploy"]["replicas"] == 2 and services["recall"]["deploy"]["replicas"] == 2
    assert "--appendonly" in services["redis"]["command"]
    for name, cls in SETTINGS.items():
        svc = services[name]
        assert svc["build"]["target"] in dockerfile_targets()
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        unknown = {k for k in svc["environment"] if k not in setting_names(cls) and k not in FOREIGN_ENV}
        assert not unknown, f"{name} sets {unknown}, which no setting reads"
    for mount in services["prometheus"]["volumes"] + services["grafana"]["volumes"] + services["recall-lb"]["volumes"]:
        assert (DEPLOY / mount.split(":")[0]).exists(), mount


def test_env_example_names_only_real_settings():
    all_settings = set().union(*(setting_names(c) for c in SETTINGS.values()))
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            name = line.split("=", 1)[0]
            assert name in all_settings or name in FOREIGN_ENV, name


def test_k8s_manifests_parse_and_set_only_real_settings():
    docs = k8s_documents()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs if "metadata" in d and "name" in d.get("metadata", {})}
    for needed in [("Deployment", "recall"), ("Deployment", "recall-indexer"), ("Deployment", "recall-ingest"),
                   ("HorizontalPodAutoscaler", "recall"), ("HorizontalPodAutoscaler", "recall-indexer"),
                   ("PersistentVolumeClaim", "recall-data"), ("NetworkPolicy", "recall-ingest-from-gateway")]:
        assert needed in kinds, needed
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    image_to_settings = {"recall/ingest": IngestSettings, "recall/indexer": IndexerSettings, "recall/recall": RecallSettings}
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        [container] = d["spec"]["template"]["spec"]["containers"]
        image = container["image"].split(":")[0]
        assert image.split("/")[1] in dockerfile_targets(), image
        names = setting_names(image_to_settings[image])
        env = {e["name"] for e in container.get("env", [])} | set(config)
        assert not (env - names - FOREIGN_ENV), (d["metadata"]["name"], env - names - FOREIGN_ENV)
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_stack_settings_cover_the_ports_recall_up_prints():
    assert {"RECALL_INGEST_PORT", "RECALL_RECALL_PORT", "RECALL_INDEXER_PORT"} <= setting_names(StackSettings)


def test_dashboard_is_valid_grafana_json_with_prometheus_targets():
    dash = json.loads((DEPLOY / "grafana" / "recall.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 15 and all(t["datasource"]["uid"] == "prometheus" for p in dash["panels"] for t in p["targets"])
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("latency", "calls per second", "unavailable", "pool", "stream", "index job", "ingest to searchable", "dead letters"):
        assert topic in titles, topic


promtool = shutil.which("promtool")


@pytest.mark.skipif(promtool is None, reason="promtool is not installed (Debian package prometheus); make test installs it where it can")
def test_promtool_accepts_config_and_rules():
    config = subprocess.run([promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")], capture_output=True, text=True)
    assert config.returncode == 0, config.stdout + config.stderr
    rules = subprocess.run([promtool, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml")], capture_output=True, text=True)
    assert rules.returncode == 0 and "SUCCESS" in rules.stdout, rules.stdout + rules.stderr
