"""Bootstrap: the single place that decides which parts are real and wires them.

`build_runtime` returns the pieces of one process (API services, worker,
outbox relay) for the configured settings; the CLI and the tests start them.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from app.api.deps import Services
from app.api.read_cache import JobViewCache
from app.bus import InProcessBus
from app.bus.relay import OutboxRelay
from app.engine.cluster import PRESETS, Cluster, cluster_from_dict, preset
from app.settings import Settings
from app.store import Store, create_db_engine
from app.worker import Worker


class ConfigError(Exception):
    """The settings or the cluster description cannot work; the message says why."""


def load_cluster(name_or_file: str, reconfig_ms: float | None = None) -> Cluster:
    """A preset by name, or a YAML/JSON cluster file in the shape of `GET /v1/cluster`."""
    if name_or_file in PRESETS:
        return preset(name_or_file, reconfig_ms=reconfig_ms)
    path = Path(name_or_file)
    if not path.is_file():
        raise ConfigError(
            f"cluster {name_or_file!r} is neither a preset ({', '.join(PRESETS)}) nor a file"
        )
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        return cluster_from_dict(data, name=path.stem)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cluster file {path}: {exc}") from exc


def build_store(settings: Settings) -> Store:
    write = create_db_engine(settings, for_writes=True)
    read = create_db_engine(settings, for_writes=False) if settings.is_sqlite else write
    return Store(write, read)


@dataclass
class Runtime:
    """One process's parts; `start` runs the background loops, `stop` ends them."""

    services: Services
    worker: Worker | None
    relay: OutboxRelay
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.relay.start()
        if self.worker is not None:
            thread = threading.Thread(
                target=self.worker.run, args=(self._stop,), name="worker", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self.relay.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        self.services.store.dispose()


def build_runtime(settings: Settings, cluster: Cluster, *, with_worker: bool = True) -> Runtime:
    """The embedded default: SQLite or Postgres, in-process bus, worker in a thread."""
    store = build_store(settings)
    bus = InProcessBus()
    services = Services(
        settings=settings,
        cluster=cluster,
        store=store,
        bus=bus,
        read_cache=JobViewCache(ttl_s=settings.read_cache_ttl_s),
    )
    bus.listen(services.read_cache.on_change)
    bus.listen(services.waiters.on_change)
    relay = OutboxRelay(store, bus.publish)
    services.extras["kick_relay"] = relay.kick
    worker = Worker(store, bus, cluster, settings) if with_worker else None
    return Runtime(services, worker, relay)
