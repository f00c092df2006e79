"""Fixtures for the southbound tests: a fake clock and the mock-oxc app served over real HTTP."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import uvicorn
from fastapi import FastAPI

from app.engine.cluster import Cluster, preset
from app.southbound.mock_oxc import create_mock_oxc_app
from app.southbound.switch import OpticalSwitch


class FakeClock:
    """A monotonic clock that only moves when someone sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def small_cluster() -> Cluster:
    return preset("small")


@pytest.fixture
def seed_cluster() -> Cluster:
    return preset("seed-15k")


@dataclass
class ServedMockOxc:
    url: str
    app: FastAPI

    @property
    def switches(self) -> dict[str, OpticalSwitch]:
        return self.app.state.switches  # type: ignore[no-any-return]


@pytest.fixture
def serve_mock_oxc() -> Iterator[Callable[..., ServedMockOxc]]:
    """Start `create_mock_oxc_app(...)` under uvicorn on a free local port, in a thread."""
    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(
        cluster: Cluster,
        *,
        reconfig_ms: float | None = None,
        fault_rate: float = 0.0,
        seed: int = 0,
    ) -> ServedMockOxc:
        app = create_mock_oxc_app(
            cluster, reconfig_ms=reconfig_ms, fault_rate=fault_rate, seed=seed
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        running.append((server, thread))
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("mock-oxc did not start")
            time.sleep(0.01)
        return ServedMockOxc(f"http://127.0.0.1:{port}", app)

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(timeout=10)
