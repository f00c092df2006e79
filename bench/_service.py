"""Start Lightpath (or a bare hello app) in a subprocess for benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx

HELLO_APP = """
from fastapi import FastAPI
app = FastAPI()

@app.get("/hello")
async def hello():
    return {"hello": "world"}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


@contextlib.contextmanager
def lightpath(cluster: str, database_url: str | None = None, **env: str) -> Iterator[str]:
    """`lightpath serve` on a fresh SQLite file (or the given database); yields its URL."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        environ = dict(os.environ, LIGHTPATH_LOG_LEVEL="WARNING", **env)
        environ["LIGHTPATH_DATABASE_URL"] = database_url or f"sqlite:///{tmp}/bench.db"
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--cluster", cluster],
            env=environ,
            cwd=tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@contextlib.contextmanager
def hello_app() -> Iterator[str]:
    """A bare FastAPI hello endpoint under the same uvicorn settings; yields its URL."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "hello_bench.py"), "w") as fh:
            fh.write(HELLO_APP)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "hello_bench:app",
                "--port",
                str(port),
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            cwd=tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_ready(f"http://127.0.0.1:{port}/hello", proc)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


ADMIN_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


@contextlib.contextmanager
def stack_resources(
    prefix: str, redis_db: int
) -> Iterator[tuple[str, dict[str, subprocess.Popen[bytes]]]]:
    """A fresh PostgreSQL database and a flushed Redis database for a full stack.

    Yields the database name and a dict the caller fills with its processes. On
    exit every process is resumed (if SIGSTOPped) and terminated (killed after
    20 s), Redis is flushed and the database dropped.
    """
    import uuid

    import psycopg
    import redis

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_POSTGRES, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    r = redis.Redis.from_url(f"redis://127.0.0.1:6379/{redis_db}")
    r.flushdb()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        yield name, procs
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        r.flushdb()
        r.close()
        with psycopg.connect(ADMIN_POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
