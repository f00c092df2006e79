"""Cluster files in the shape of GET /v1/cluster (YAML or JSON), and their errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.cluster_files import ConfigError, load_cluster
from app.engine.cluster import CLUSTER_FILE_KEYS, cluster_to_dict, preset
from tests.support import LiveServer


def test_a_cluster_file_round_trips_through_the_api_shape(tmp_path: Path) -> None:
    small = preset("small")
    for suffix, dump in ((".json", json.dumps), (".yaml", yaml.safe_dump)):
        path = tmp_path / f"fabric{suffix}"
        path.write_text(dump(cluster_to_dict(small)))
        loaded = load_cluster(str(path))
        assert loaded.server_ids == small.server_ids
        assert [(o.id, o.ports, dict(o.pod_ports)) for o in loaded.oxcs] == [
            (o.id, o.ports, dict(o.pod_ports)) for o in small.oxcs
        ]
        assert [p.uplink_ports for p in loaded.pods] == [p.uplink_ports for p in small.pods]
        assert [p.aggregator_gbps for p in loaded.pods] == [p.aggregator_gbps for p in small.pods]
    data = cluster_to_dict(small)
    data["pods"][1]["electrical_gbps"] = 1600
    path = tmp_path / "hybrid.json"
    path.write_text(json.dumps(data))
    assert [p.electrical_gbps for p in load_cluster(str(path)).pods] == [0.0, 1600.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["oxcs"][0]["pod_ports"].update({"pod-9": [60]}), "unknown pod"),
        (lambda d: d["oxcs"][0]["pod_ports"]["pod-1"].append(0), "wired twice"),
        (lambda d: d["oxcs"][0]["pod_ports"]["pod-1"].append(999), "out of range"),
        (lambda d: d["pods"][0].update({"uplink_ports": 3}), "uplinks"),
        (lambda d: d.pop("pods"), "missing"),
        (lambda d: d["pods"][0].update({"electrical_gbps": -1}), "finite numbers >= 0"),
        # a helper's held-out files: each of these was accepted silently
        (lambda d: d["pods"][0].update({"electrical_gbps": float("nan")}), "finite"),
        (lambda d: d["pods"][0].update({"electrical_gbps": float("inf")}), "finite"),
        (lambda d: d["pods"][0]["tors"][0].update({"aggregator_gbps": -1}), "pod-0/tor-0"),
        (lambda d: d["pods"][0]["tors"][0].update({"aggregator_gbps": float("nan")}), "finite"),
        (lambda d: d["oxcs"].append({"id": "oxc-x", "ports": -5}), "oxc-x: ports"),
        (lambda d: d["pods"][0].update({"electrical_gbs": 800}), "unknown field 'electrical_gbs'"),
        (lambda d: d["oxcs"][0].update({"latency_ms": 5}), "OXC oxc-0 has an unknown field"),
        (lambda d: d.update({"pod": []}), "the cluster has an unknown field 'pod'"),
        (lambda d: d["oxcs"][0].update({"reconfig_ms": -5}), "reconfig_ms"),
        (lambda d: d["oxcs"][0].update({"reconfig_ms": 1e18}), "from 0 to 3,600,000"),
        (lambda d: d.update({"nic_gbps": float("nan")}), "must be finite numbers above 0"),
        (lambda d: d.update({"nic_gbps": float("inf")}), "must be finite numbers above 0"),
        # types as the file states them, not coerced
        (lambda d: d.update({"gpus_per_server": 8.5}), "gpus_per_server must be an integer"),
        (lambda d: d.update({"gpus_per_server": True}), "gpus_per_server must be an integer"),
        (lambda d: d["oxcs"][0]["pod_ports"].update({"pod-1": "0123"}), "must be a list"),
        (lambda d: d["oxcs"][0]["pod_ports"]["pod-1"].append(3.7), "must be an integer"),
        (lambda d: d["pods"].append(d["pods"][0]), "pod id pod-0 appears more than once"),
        (lambda d: d["pods"][0].update({"id": 7}), "pod id must be a non-empty string"),
    ],
)
def test_inconsistent_cluster_files_are_refused(tmp_path: Path, mutate, message: str) -> None:
    data = cluster_to_dict(preset("small"))
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message):
        load_cluster(str(path))
    with pytest.raises(ConfigError, match="neither a preset"):
        load_cluster(str(tmp_path / "missing.yaml"))


def test_every_field_of_the_cluster_view_loads_back_as_a_cluster_file() -> None:
    """A cluster file refuses unknown fields (a typo meant a default); the view the API
    serves (`GET /v1/cluster`, live fields included) must still load back."""
    from app.api.schemas import ClusterOut, OxcOut, PodOut, ServerOut, TorOut

    for level, model in (
        ("cluster", ClusterOut),
        ("pod", PodOut),
        ("tor", TorOut),
        ("server", ServerOut),
        ("oxc", OxcOut),
    ):
        assert set(model.model_fields) <= CLUSTER_FILE_KEYS[level], level


def test_seed_15k_matches_the_design_notes() -> None:
    big = preset("seed-15k")
    assert big.server_count == 1875
    assert big.gpu_count == 15000
    assert big.nic_gbps == 400
    for oxc in big.oxcs:
        wired = [p for ports in oxc.pod_ports.values() for p in ports]
        assert len(wired) == len(set(wired)) <= oxc.ports


def test_cluster_view_shows_fragmentation_and_holders(server: LiveServer) -> None:
    with server.client() as c:
        c.post("/v1/jobs", json={"job_id": "f", "parallelism": {"dp": 3, "pp": 1}})
        view = c.get("/v1/cluster").json()
        frag = view["fragmentation"]
        assert sum(p["free_servers"] for p in frag.values()) == 29
        held = [
            s for p in view["pods"] for t in p["tors"] for s in t["servers"] if s["job_id"] == "f"
        ]
        assert len(held) == 3 and not any(s["free"] for s in held)
        assert all("aggregator_used_gbps" in t for p in view["pods"] for t in p["tors"])


def test_a_cluster_file_nested_past_the_parser_is_refused_not_a_traceback(
    tmp_path: Path,
) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_cluster(str(deep))


def test_reconfig_ms_overrides_a_cluster_file_only_when_given(tmp_path: Path) -> None:
    data = cluster_to_dict(preset("small"))
    for oxc in data["oxcs"]:
        oxc["reconfig_ms"] = 7.0
    data["gpu_model"] = "b200"
    path = tmp_path / "fabric.json"
    path.write_text(json.dumps(data))
    assert {o.reconfig_ms for o in load_cluster(str(path)).oxcs} == {7.0}
    assert {o.reconfig_ms for o in load_cluster(str(path), 40.0).oxcs} == {40.0}
    # the override changes the switches only (it dropped the file's GPU model to a100)
    assert load_cluster(str(path), 40.0).gpu_model == "b200"
    assert load_cluster(str(path), 40.0).server_ids == preset("small").server_ids
    assert load_cluster("small", 3.0).reconfig_ms == 3.0
    with pytest.raises(ConfigError, match="from 0 to 3,600,000 ms"):
        load_cluster(str(path), -1.0)
    with pytest.raises(ConfigError, match="from 0 to 3,600,000 ms"):
        load_cluster("small", 1e18)


def test_loading_a_cluster_imports_neither_the_service_nor_numpy(tmp_path: Path) -> None:
    path = tmp_path / "fabric.yaml"
    path.write_text(yaml.safe_dump(cluster_to_dict(preset("small"))))
    probe = (
        "import sys; from app.cluster_files import load_cluster; "
        f"load_cluster({str(path)!r}); load_cluster('seed-15k'); "
        "print(sorted(m for m in ('fastapi', 'sqlalchemy', 'app.wiring', 'numpy', 'scipy') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"


def test_simulating_imports_neither_the_web_nor_the_database_layer(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    probe = (
        "import sys; from app.sim.commands import run_generate, run_simulate; "
        f"assert run_generate('dense', 'small', 1.0, 3, 1, {str(workload)!r}) == 0; "
        f"assert run_simulate('small', {str(workload)!r}, ['static'], None, 1, None) == 0; "
        "print(sorted(m for m in ('fastapi', 'sqlalchemy', 'app.wiring', 'app.api') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"
