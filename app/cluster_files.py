"""Cluster descriptions from a preset name or a YAML/JSON file, without the service bootstrap.

The CLI, the simulator and the service all load clusters here; importing this
module pulls in neither FastAPI nor the database (`app.wiring` does).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from app.engine.cluster import MAX_RECONFIG_MS, PRESETS, Cluster, cluster_from_dict, preset


class ConfigError(Exception):
    """The settings or the cluster description cannot work; the message says why."""


def with_reconfig_ms(cluster: Cluster, reconfig_ms: float) -> Cluster:
    """The same cluster with every OXC switching in `reconfig_ms`."""
    oxcs = tuple(dataclasses.replace(o, reconfig_ms=reconfig_ms) for o in cluster.oxcs)
    return Cluster(
        cluster.name,
        cluster.gpus_per_server,
        cluster.nic_gbps,
        cluster.pods,
        oxcs,
        gpu_model=cluster.gpu_model,
    )


def load_cluster(name_or_file: str, reconfig_ms: float | None = None) -> Cluster:
    """A preset by name, or a YAML/JSON cluster file in the shape of `GET /v1/cluster`.

    `reconfig_ms` (LIGHTPATH_RECONFIG_MS when set) overrides every OXC's
    reconfiguration latency, a file's as well as a preset's; None keeps theirs.
    """
    if reconfig_ms is not None and not 0 <= reconfig_ms <= MAX_RECONFIG_MS:  # NaN fails too
        raise ConfigError(
            f"the reconfiguration latency must be from 0 to {MAX_RECONFIG_MS:,.0f} ms"
        )
    if name_or_file in PRESETS:
        return preset(name_or_file, reconfig_ms=reconfig_ms)
    path = Path(name_or_file)
    if not path.is_file():
        raise ConfigError(
            f"cluster {name_or_file!r} is neither a preset ({', '.join(PRESETS)}) nor a file"
        )
    import yaml  # only files need it

    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        if not isinstance(data, dict):
            raise ValueError("expected a mapping with pods and oxcs")
        cluster = cluster_from_dict(data, name=path.stem)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cluster file {path}: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"cluster file {path}: nested too deeply") from None
    return cluster if reconfig_ms is None else with_reconfig_ms(cluster, reconfig_ms)
