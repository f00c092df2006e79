"""Deployment artefacts parse and agree with the code (no Docker engine runs here).

Covers docker-compose.yml, deploy/prometheus, deploy/grafana and deploy/k8s: the
processes and their order, that every LIGHTPATH_* variable is a real setting with a
value Settings accepts, that Prometheus scrapes every process on the port it
listens on, that the dashboard only queries metrics the code exposes, and that the
Kubernetes pods are probed, bounded, non-root and keep their secrets in a Secret.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from pydantic import ValidationError

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "lightpath.json"
SETTINGS = {f"LIGHTPATH_{name.upper()}" for name in Settings.model_fields}
LIGHTPATH_PROCESSES = ("migrate", "api", "worker", "mock-oxc")
LONG_RUNNING = ("postgres", "redis", "api", "worker", "mock-oxc", "prometheus", "grafana")
APP_UID = 10001  # the Dockerfile's `useradd --uid`
TEST_TOKENS = "launcher=t-launch-1,telemetry=t-tele-2,operator=t-op-3"


# --- helpers -----------------------------------------------------------------


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _services() -> dict[str, Any]:
    return _compose()["services"]


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose variable substitution: ${VAR}, ${VAR:-default}, ${VAR:?error}."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op == ":-":
            return arg or ""
        if op == ":?":
            raise KeyError(f"{name} is required: {arg}")
        return ""

    return re.sub(r"\$\{([A-Z0-9_]+)(?:(:-|:\?)([^}]*))?\}", one, str(value))


def _compose_env(service: str, env: dict[str, str] | None = None) -> dict[str, str]:
    raw = _services()[service].get("environment") or {}
    assert isinstance(raw, dict), f"{service}: use the mapping form of environment"
    given = {"LIGHTPATH_SOUTHBOUND_TOKEN": "test-southbound-token", **(env or {})}
    return {k: _interpolate(v, given) for k, v in raw.items()}


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        if name.startswith("LIGHTPATH_"):
            monkeypatch.setenv(name, value)
    return Settings()


def _k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def _k8s(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _k8s_docs() if d["kind"] == kind}


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


# --- docker compose ------------------------------------------------------------


def test_compose_has_every_process_with_health_and_order() -> None:
    services = _services()
    assert set(LONG_RUNNING) | {"migrate"} <= services.keys()
    for name in LONG_RUNNING:
        check = services[name].get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no healthcheck"

    assert services["postgres"]["image"].startswith("postgres:16")
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["redis"]["image"].startswith("redis:7")
    assert services["redis"]["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]

    migrate = services["migrate"]
    assert migrate["command"] == ["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"

    assert services["api"]["command"] == ["api", "--host", "0.0.0.0", "--port", "8080"]
    assert services["worker"]["command"] == ["worker"]
    assert services["mock-oxc"]["command"] == ["mock-oxc", "--host", "0.0.0.0", "--port", "9090"]
    for name in LIGHTPATH_PROCESSES:
        assert services[name].get("build") == ".", f"{name} must run the repository's image"

    # api stateless x2, worker leader-elected x2, mock-oxc singleton (state in memory)
    assert services["api"]["deploy"]["replicas"] == 2
    assert services["worker"]["deploy"]["replicas"] == 2
    assert services["mock-oxc"]["deploy"]["replicas"] == 1

    for name in ("api", "worker"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["redis"]["condition"] == "service_healthy", name
    assert services["worker"]["depends_on"]["mock-oxc"]["condition"] == "service_healthy"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_compose_shares_one_anchored_environment() -> None:
    text = COMPOSE.read_text()
    anchor = re.search(r"&(\S+)", text)
    assert anchor, "the common LIGHTPATH_* environment is a YAML anchor"
    assert text.count(f"*{anchor.group(1)}") >= 3, "migrate, api and worker reuse it"
    tokens = {"LIGHTPATH_API_TOKENS": TEST_TOKENS}
    envs = {name: _compose_env(name, tokens) for name in ("migrate", "api", "worker")}
    for name, env in envs.items():
        assert env["LIGHTPATH_DATABASE_URL"] == (
            "postgresql://postgres:lightpath@postgres:5432/lightpath"
        ), name
        assert env["LIGHTPATH_REDIS_URL"] == "redis://redis:6379/0", name
        assert env["LIGHTPATH_CLUSTER"] == "small", name
    worker = envs["worker"]
    assert worker["LIGHTPATH_SOUTHBOUND_URL"] == "http://mock-oxc:9090"
    assert worker["LIGHTPATH_WORKER_METRICS_HOST"] == "0.0.0.0"
    assert worker["LIGHTPATH_WORKER_METRICS_PORT"] == "9100"
    assert _compose_env("mock-oxc")["LIGHTPATH_CLUSTER"] == "small"


def test_compose_holds_no_secret() -> None:
    api = _services()["api"]["environment"]
    assert api["LIGHTPATH_API_TOKENS"].startswith("${LIGHTPATH_API_TOKENS:?")
    with pytest.raises(KeyError):
        _compose_env("api")  # compose refuses to start without the tokens
    for name, service in _services().items():
        for key, value in (service.get("environment") or {}).items():
            literal = re.sub(r"\$\{[^}]*\}", "", str(value))
            assert not re.search(r"(launcher|telemetry|operator)=", literal), (name, key)


def test_compose_environment_is_accepted_by_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LIGHTPATH_PROCESSES:
        env = _compose_env(name, {"LIGHTPATH_API_TOKENS": TEST_TOKENS})
        settings = _settings_from(env, monkeypatch)
        assert settings.cluster == "small", name
        if name != "mock-oxc":
            assert settings.database_url.startswith("postgresql+psycopg://"), name
            assert settings.redis_url, name
    api = _settings_from(_compose_env("api", {"LIGHTPATH_API_TOKENS": TEST_TOKENS}), monkeypatch)
    assert len(api.token_scopes()) == 3  # the api binds 0.0.0.0: tokens are mandatory


def test_every_lightpath_variable_is_a_real_setting() -> None:
    files = [COMPOSE, *K8S.glob("*.yaml"), DEPLOY / "README.md"]
    used = set()
    for path in files:
        used |= set(re.findall(r"\bLIGHTPATH_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert used, "the manifests configure Lightpath through LIGHTPATH_* variables"
    assert used <= SETTINGS, f"not Settings fields: {sorted(used - SETTINGS)}"


# --- prometheus and grafana --------------------------------------------------------


def test_prometheus_scrapes_every_process_on_its_port() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets: dict[str, set[str]] = {}
    for job in config["scrape_configs"]:
        found = targets.setdefault(job["job_name"], set())
        for sd in job.get("dns_sd_configs", []):
            found |= {f"{n}:{sd['port']}" for n in sd["names"]}
        for sc in job.get("static_configs", []):
            found |= set(sc["targets"])
        assert job.get("metrics_path", "/metrics") == "/metrics"
    services = _services()
    worker_port = _compose_env("worker")["LIGHTPATH_WORKER_METRICS_PORT"]
    expected = {
        "api": f"api:{_arg(services['api']['command'], '--port')}",
        "worker": f"worker:{worker_port}",
        "mock-oxc": f"mock-oxc:{_arg(services['mock-oxc']['command'], '--port')}",
    }
    for job, target in expected.items():
        assert target in targets.get(job, set()), f"prometheus job {job} must scrape {target}"

    prometheus = services["prometheus"]
    assert any(v.startswith("./deploy/prometheus/prometheus.yml:") for v in prometheus["volumes"])


def test_grafana_is_provisioned_with_the_dashboard() -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((provisioning / "dashboards" / "lightpath.yml").read_text())
    dashboard_dir = providers["providers"][0]["options"]["path"]

    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in _services()["grafana"]["volumes"])
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./deploy/grafana/dashboards"] == dashboard_dir

    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for ds in [panel.get("datasource"), *(t.get("datasource") for t in panel["targets"])]:
            assert ds is None or ds["uid"] == source["uid"], panel["title"]


def _exposed_metric_names() -> set[str]:
    """Every series name the api, worker and mock-oxc processes can expose."""
    from app.api.metrics import ApiMetrics
    from app.southbound.mock_oxc import create_mock_oxc_app
    from app.wiring import load_cluster
    from app.worker.metrics import WorkerMetrics

    class _Store:  # what the api's scrape-time collector reads
        def count_jobs_by_state(self) -> dict[str, int]:
            return {"queued": 1, "placed": 2}

        def count_free_servers(self, total: int) -> int:
            return total

        def last_decision_seq(self) -> int:
            return 7

    cluster = load_cluster("small")
    texts = [
        generate_latest(ApiMetrics(_Store(), cluster).registry).decode(),  # type: ignore[arg-type]
        generate_latest(WorkerMetrics().registry).decode(),
        TestClient(create_mock_oxc_app(cluster)).get("/metrics").text,
    ]
    suffixes = {"counter": ("",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names: set[str] = set()
    for text in texts:
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
            names |= {name + s for s in suffixes.get(kind, ("",))}
    return names


def test_dashboard_queries_only_metrics_the_code_exposes() -> None:
    used = {n for e in _dashboard_exprs() for n in re.findall(r"\blightpath_[a-z0-9_]+", e)}
    wanted = {
        "lightpath_jobs",
        "lightpath_free_servers",
        "lightpath_http_request_duration_seconds_bucket",
        "lightpath_placement_seconds_bucket",
        "lightpath_traffic_demands_total",
        "lightpath_traffic_reports_total",
        "lightpath_reconfigurations_total",
        "lightpath_oxc_reconfigurations_total",
        "lightpath_exposed_reconfig_seconds_total",
        "lightpath_prediction_hits_total",
        "lightpath_prediction_misses_total",
        "lightpath_mlu",
        "lightpath_decisions",
        "lightpath_worker_is_leader",
        "lightpath_switches_converged",
        "lightpath_oxc_cross_connects",
        "lightpath_oxc_failed_ports",
    }
    assert wanted <= used, f"dashboard lacks {sorted(wanted - used)}"

    # the grep check: each base name is declared somewhere under app/
    source = "\n".join(p.read_text() for p in (ROOT / "app").rglob("*.py"))
    for name in used:
        base = re.sub(r"_(total|bucket|count|sum)$", "", name)
        declared = re.search(rf"""["']{re.escape(base)}(_total)?["']""", source)
        assert declared, f"{name}: no metric {base!r} declared in app/"

    # the exposition check: the exact series name (counters end in _total) exists
    exposed = _exposed_metric_names()
    assert used <= exposed, f"not exposed as written: {sorted(used - exposed)}"


def test_dashboard_reads_worker_gauges_from_the_leader_only() -> None:
    # a standby worker keeps these gauges at 0 (or stale): min/max over both lies
    for expr in _dashboard_exprs():
        if re.search(r"lightpath_(mlu|switches_converged)\b", expr):
            assert "lightpath_worker_is_leader == 1" in expr, expr
        if "lightpath_jobs" in re.findall(r"lightpath_[a-z_]+", expr):
            assert not expr.startswith("sum"), f"{expr}: every api replica reports all jobs"


# --- kubernetes -------------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == "lightpath"
    files = {p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    expected = {
        "namespace.yaml",
        "configmap.yaml",
        "secret.example.yaml",
        "api-deployment.yaml",
        "api-service.yaml",
        "migrate-job.yaml",
        "worker-deployment.yaml",
        "mock-oxc-deployment.yaml",
        "mock-oxc-service.yaml",
    }
    assert expected <= files
    for doc in _k8s_docs():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace", "lightpath") == "lightpath"


def test_k8s_workloads_are_probed_bounded_and_non_root() -> None:
    deployments = _k8s("Deployment")
    assert deployments["api"]["spec"]["replicas"] == 2
    assert deployments["worker"]["spec"]["replicas"] == 2
    assert deployments["mock-oxc"]["spec"]["replicas"] == 1
    assert deployments["mock-oxc"]["spec"]["strategy"]["type"] == "Recreate"
    config = _k8s("ConfigMap")["lightpath-config"]["data"]
    # the port each process listens on, as its args or settings say
    listen = {
        "api": _arg(
            deployments["api"]["spec"]["template"]["spec"]["containers"][0]["args"], "--port"
        ),
        "worker": config["LIGHTPATH_WORKER_METRICS_PORT"],
        "mock-oxc": _arg(_pod_spec(deployments["mock-oxc"])["containers"][0]["args"], "--port"),
    }
    assert config["LIGHTPATH_WORKER_METRICS_HOST"] == "0.0.0.0"
    readiness = {"api": "/readyz", "worker": "/readyz", "mock-oxc": "/healthz"}  # no /readyz

    workloads = {**deployments, **{f"job/{k}": v for k, v in _k8s("Job").items()}}
    assert "job/migrate" in workloads
    for name, workload in workloads.items():
        pod = _pod_spec(workload)
        ctx = pod["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == APP_UID, name
        labels = workload["spec"]["template"]["metadata"]["labels"]
        if "selector" in workload["spec"] and workload["kind"] == "Deployment":
            assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        for c in pod["containers"]:
            assert c["resources"]["requests"] and c["resources"]["limits"], name
            assert c.get("securityContext", {}).get("allowPrivilegeEscalation") is False, name
            assert c["args"][0] in ("api", "worker", "mock-oxc", "migrate"), name
            if workload["kind"] != "Deployment":
                continue
            ports = {p["name"]: str(p["containerPort"]) for p in c.get("ports", [])}
            assert listen[name] in ports.values(), f"{name} listens on {listen[name]}"
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", readiness[name])):
                get = c[probe]["httpGet"]
                assert get["path"] == path, (name, probe)
                port = str(ports.get(get["port"], get["port"]))
                assert port == listen[name], (name, probe, port)


def test_k8s_services_reach_their_pods() -> None:
    deployments = _k8s("Deployment")
    services = _k8s("Service")
    assert {"api", "mock-oxc"} <= services.keys()
    for name, service in services.items():
        template = deployments[name]["spec"]["template"]
        assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
        port_names = {p["name"] for c in template["spec"]["containers"] for p in c["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, name
    # the worker reaches the switches through the mock-oxc Service
    config = _k8s("ConfigMap")["lightpath-config"]["data"]
    southbound = config["LIGHTPATH_SOUTHBOUND_URL"]
    oxc_port = services["mock-oxc"]["spec"]["ports"][0]["port"]
    assert southbound.startswith("http://mock-oxc") and southbound.endswith(f":{oxc_port}")


def test_k8s_config_in_a_configmap_and_tokens_in_a_secret() -> None:
    config = _k8s("ConfigMap")["lightpath-config"]["data"]
    secret = _k8s("Secret")["lightpath-secrets"]["stringData"]
    assert not any("TOKENS" in k or "DATABASE_URL" in k for k in config), "secrets in a ConfigMap"
    assert {"LIGHTPATH_API_TOKENS", "LIGHTPATH_DATABASE_URL"} <= secret.keys()
    assert "REPLACE" in (K8S / "secret.example.yaml").read_text()
    for name, workload in {**_k8s("Deployment"), **_k8s("Job")}.items():
        for c in _pod_spec(workload)["containers"]:
            refs = c.get("envFrom", [])
            assert {"configMapRef": {"name": "lightpath-config"}} in refs, name
            # every process needs a secret: the database, API tokens or the switches' token
            assert {"secretRef": {"name": "lightpath-secrets"}} in refs, name
            assert not c.get("env"), f"{name}: configure through the ConfigMap and Secret"


def test_k8s_environment_is_accepted_by_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _k8s("ConfigMap")["lightpath-config"]["data"]
    secret = dict(_k8s("Secret")["lightpath-secrets"]["stringData"])
    assert all(isinstance(v, str) for v in config.values()), "ConfigMap values are strings"
    secret["LIGHTPATH_API_TOKENS"] = TEST_TOKENS
    secret["LIGHTPATH_SOUTHBOUND_TOKEN"] = "test-southbound-token"
    settings = _settings_from({**config, **secret}, monkeypatch)
    assert settings.database_url.startswith("postgresql+psycopg://")
    assert settings.redis_url and settings.southbound_url
    assert len(settings.token_scopes()) == 3


def test_example_secret_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Applied unedited, the example's tokens stop every process from starting."""
    config = _k8s("ConfigMap")["lightpath-config"]["data"]
    secret = _k8s("Secret")["lightpath-secrets"]["stringData"]
    with pytest.raises(ValidationError, match="placeholder"):
        _settings_from({**config, **secret}, monkeypatch)
