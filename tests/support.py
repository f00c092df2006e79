"""Test helpers: a real uvicorn server in a thread, on a free port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn

from app.api import create_app
from app.engine.cluster import Cluster, build_cluster
from app.settings import Settings
from app.wiring import Runtime, build_api_runtime, build_runtime, load_cluster


def narrow_cluster(electrical_gbps: float = 0.0) -> Cluster:
    """4 pods x 2 ToRs x 4 servers with two uplinks per pod on one OXC: jobs spanning
    pods outnumber the ports (and may have an electrical core beside them)."""
    return build_cluster(
        "narrow",
        pods=4,
        tors_per_pod=2,
        servers_per_tor=4,
        uplink_ports_per_pod=2,
        oxcs=1,
        oxc_ports=8,
        pod_electrical_gbps=electrical_gbps,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    """The whole embedded service (API, relay, worker) serving real HTTP."""

    def __init__(
        self, settings: Settings, port: int | None = None, *, api_only: bool = False
    ) -> None:
        self.settings = settings
        self.api_only = api_only  # the API process alone: no worker decides anything
        self.port = port or free_port()
        self.runtime: Runtime | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, token: str | None = None, timeout: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def start(self) -> None:
        cluster = load_cluster(self.settings.cluster, self.settings.reconfig_ms)
        build = build_api_runtime if self.api_only else build_runtime
        self.runtime = build(self.settings, cluster)
        self.runtime.start()
        config = uvicorn.Config(
            create_app(self.runtime.services),
            host="127.0.0.1",
            port=self.port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.runtime is not None:
            self.runtime.stop()


@contextlib.contextmanager
def live_on(settings: Settings, cluster: str) -> Iterator[LiveServer]:
    """A live server on `settings` with `cluster` (a preset name or a cluster file),
    stopped on leaving: a restart onto another cluster is two of these in turn."""
    live = LiveServer(settings.model_copy(update={"cluster": cluster}))
    live.start()
    try:
        yield live
    finally:
        live.stop()
