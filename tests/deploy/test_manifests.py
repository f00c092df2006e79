"""Deployment artefacts parse and agree with the code (no Docker engine runs here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SETTINGS = {f"LIGHTPATH_{name.upper()}" for name in Settings.model_fields}


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _k8s() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def test_compose_has_every_process_with_health_and_order() -> None:
    services = _compose()["services"]
    expected = {
        "postgres",
        "redis",
        "migrate",
        "api",
        "worker",
        "mock-oxc",
        "prometheus",
        "grafana",
    }
    assert expected <= services.keys()
    assert services["api"]["deploy"]["replicas"] == 2
    assert services["mock-oxc"]["deploy"]["replicas"] == 1
    for name in expected - {"migrate"}:
        assert "healthcheck" in services[name], name
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "worker"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully"
        assert deps["redis"]["condition"] == "service_healthy"
    assert services["api"]["command"][0] == "api"
    assert services["worker"]["command"] == ["worker"]
    assert services["api"]["environment"]["LIGHTPATH_API_TOKENS"].startswith(
        "${LIGHTPATH_API_TOKENS:?"
    )


def test_every_lightpath_variable_is_a_real_setting() -> None:
    text = (ROOT / "docker-compose.yml").read_text() + "".join(
        p.read_text() for p in K8S.glob("*.yaml")
    )
    used = set(re.findall(r"\bLIGHTPATH_[A-Z_]+\b", text))
    assert used, "the manifests configure Lightpath through LIGHTPATH_* variables"
    assert used <= SETTINGS, used - SETTINGS


def test_prometheus_scrapes_api_worker_and_mock_oxc() -> None:
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {c["job_name"] for c in config["scrape_configs"]}
    assert {"api", "worker", "mock-oxc"} <= jobs


def test_dashboard_queries_only_metrics_the_code_exposes() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/lightpath.json").read_text())
    source = "".join(p.read_text() for p in (ROOT / "app").rglob("*.py"))
    names = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names.update(re.findall(r"\blightpath_[a-z_]+", target["expr"]))
    assert len(dashboard["panels"]) >= 10
    for name in names:
        base = re.sub(r"_(total|bucket|count|sum)$", "", name)
        assert f'"{base}' in source, f"{name} is not defined in app/"


def test_k8s_has_probes_resources_and_secrets() -> None:
    docs = _k8s()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Secret", "lightpath-secrets") in kinds and ("ConfigMap", "lightpath-config") in kinds
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert deployments["api"]["spec"]["replicas"] == 2
    assert deployments["worker"]["spec"]["replicas"] == 2
    assert deployments["mock-oxc"]["spec"]["replicas"] == 1
    assert deployments["mock-oxc"]["spec"]["strategy"]["type"] == "Recreate"
    for name, d in deployments.items():
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for c in pod["containers"]:
            assert c["resources"]["requests"] and c["resources"]["limits"], name
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", name
            assert c["readinessProbe"]["httpGet"]["path"] in ("/readyz", "/healthz"), name
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert not any("TOKENS" in k or "DATABASE_URL" in k for k in config["data"]), (
        "secrets in a ConfigMap"
    )
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(
        p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"
    )
