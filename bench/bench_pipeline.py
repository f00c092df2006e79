"""Event pipeline benchmark on the full stack (api + worker + mock-oxc, Postgres, Redis).

    .venv/bin/python bench/bench_pipeline.py [--seconds 10] [--demands 10] [--jobs 40]

(a) Durable ingest: POST /v1/traffic in batches of 100 reports of `--demands`
    demand entries each, from concurrent clients; a 202 means the batch is
    committed in PostgreSQL with its outbox event. Target >= 50,000 demand
    entries/s on the 2-core development machine. Unbatched (1 report per POST)
    reports/s are printed next to it.
(b) End to end: POST /v1/jobs of a cross-pod job until its cross-connects are
    confirmed by the mock switches (GET /v1/topology lists them and has no
    `desired`), p50/p99, mock reconfiguration latency 25 ms.
Exits 1 when the ingest target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _service import _wait_ready, free_port, percentile  # noqa: E402

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_DB = 12
TARGET_DEMANDS_PER_S = 50_000


@contextmanager
def full_stack(cluster: str = "small"):  # type: ignore[no-untyped-def]
    name = f"lightpath_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    r = redis.Redis.from_url(f"redis://127.0.0.1:6379/{REDIS_DB}")
    r.flushdb()
    oxc, api, worker = free_port(), free_port(), free_port()
    env = dict(
        os.environ,
        LIGHTPATH_DATABASE_URL=f"postgresql://postgres@127.0.0.1:5432/{name}",
        LIGHTPATH_REDIS_URL=f"redis://127.0.0.1:6379/{REDIS_DB}",
        LIGHTPATH_SOUTHBOUND_URL=f"http://127.0.0.1:{oxc}",
        LIGHTPATH_CLUSTER=cluster,
        LIGHTPATH_LOG_LEVEL="WARNING",
    )
    env.pop("LIGHTPATH_API_TOKENS", None)
    run = [sys.executable, "-m", "app.cli"]
    subprocess.run([*run, "migrate"], env=env, check=True, capture_output=True)
    procs = []
    try:
        for args, health in (
            (["mock-oxc", "--port", str(oxc)], f"http://127.0.0.1:{oxc}/healthz"),
            (["worker", "--metrics-port", str(worker)], f"http://127.0.0.1:{worker}/healthz"),
            (["api", "--port", str(api)], f"http://127.0.0.1:{api}/healthz"),
        ):
            p = subprocess.Popen(
                [*run, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            procs.append(p)
            _wait_ready(health, p)
        yield f"http://127.0.0.1:{api}"
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=20)
        r.flushdb()
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _batch(servers: list[str], reports: int, demands: int, rng: random.Random) -> bytes:
    import json

    body = {
        "reports": [
            {
                "phase_started_at": 1_763_812_345.0 + i,
                "demands": [
                    {"src": a, "dst": b, "bytes": rng.uniform(1e8, 2e9)}
                    for a, b in (rng.sample(servers, 2) for _ in range(demands))
                ],
            }
            for i in range(reports)
        ]
    }
    return json.dumps(body).encode()


async def _ingest(url: str, bodies: list[bytes], seconds: float, concurrency: int) -> int:
    sent = 0
    stop = time.perf_counter() + seconds
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def loop(k: int) -> None:
            nonlocal sent
            i = k
            while time.perf_counter() < stop:
                r = await client.post(
                    "/v1/traffic", content=bodies[i % len(bodies)], headers=headers
                )
                if r.status_code != 202:
                    raise SystemExit(f"ingest refused: {r.status_code} {r.text[:200]}")
                sent += 1
                i += concurrency

        await asyncio.gather(*(loop(k) for k in range(concurrency)))
    return sent


def measure_ingest(url: str, seconds: float, demands: int) -> tuple[float, float]:
    rng = random.Random(20261122)
    cluster = httpx.get(f"{url}/v1/cluster").json()
    servers = [s["id"] for p in cluster["pods"] for t in p["tors"] for s in t["servers"]]
    batched = [_batch(servers, 100, demands, rng) for _ in range(16)]
    single = [_batch(servers, 1, demands, rng) for _ in range(64)]
    start = time.perf_counter()
    posts = asyncio.run(_ingest(url, batched, seconds, 8))
    demands_per_s = posts * 100 * demands / (time.perf_counter() - start)
    start = time.perf_counter()
    posts = asyncio.run(_ingest(url, single, seconds, 8))
    reports_per_s = posts / (time.perf_counter() - start)
    return demands_per_s, reports_per_s


def measure_end_to_end(url: str, jobs: int) -> list[float]:
    latencies = []
    with httpx.Client(base_url=url, timeout=30) as c:
        for i in range(jobs):
            job_id = f"e2e-{i}"
            start = time.perf_counter()
            r = c.post("/v1/jobs", json={"job_id": job_id, "parallelism": {"dp": 6, "pp": 2}})
            if r.status_code != 201:
                raise SystemExit(f"{job_id} not placed: {r.status_code}")
            while True:
                t: dict[str, Any] = c.get("/v1/topology").json()
                mine = any(cc["job_id"] == job_id for o in t["oxcs"] for cc in o["cross_connects"])
                if mine and "desired" not in t:
                    break
                if time.perf_counter() - start > 30:
                    raise SystemExit(f"{job_id}: cross-connects not confirmed in 30 s")
                time.sleep(0.002)
            latencies.append((time.perf_counter() - start) * 1000)
            c.post(f"/v1/jobs/{job_id}/complete")
            while any(
                cc["job_id"] == job_id
                for o in c.get("/v1/topology").json()["oxcs"]
                for cc in o["cross_connects"]
            ):
                time.sleep(0.01)
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--demands", type=int, default=10, help="demand entries per report")
    parser.add_argument("--jobs", type=int, default=40)
    args = parser.parse_args()
    print("starting api, worker and mock-oxc on PostgreSQL and Redis ...", file=sys.stderr)
    with full_stack() as url:
        print(f"ingest for {args.seconds:.0f} s per mode ...", file=sys.stderr)
        demands_per_s, reports_per_s = measure_ingest(url, args.seconds, args.demands)
        print(f"{args.jobs} cross-pod jobs end to end ...", file=sys.stderr)
        lat = measure_end_to_end(url, args.jobs)
    ok = demands_per_s >= TARGET_DEMANDS_PER_S
    print(f"\ningest, batches of 100 reports x {args.demands} demands, 8 concurrent clients")
    print(
        f"  demand entries/s      {demands_per_s:12,.0f}   target >= {TARGET_DEMANDS_PER_S:,}"
        f"  {'met' if ok else 'MISSED'}"
    )
    print(f"  reports/s (batched)   {demands_per_s / args.demands:12,.0f}")
    print(f"  reports/s (1 per POST){reports_per_s:12,.0f}")
    print(
        f"POST /v1/jobs -> cross-connects confirmed (small, 25 ms OXC): "
        f"p50 {percentile(lat, 50):.0f} ms, p99 {percentile(lat, 99):.0f} ms"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
