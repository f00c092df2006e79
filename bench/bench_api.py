"""Service foundation benchmark: POST /v1/jobs -> placed latency, GET /v1/jobs/{id} throughput.

    .venv/bin/python bench/bench_api.py [--jobs 300] [--seconds 5] [--postgres URL]

Latency: sequential arrivals, each answered 201 with its placement (end to end:
validation, durable write, worker placement, decision log), then completed.
Throughput: requests/s of GET /v1/jobs/{id} next to a bare FastAPI hello
endpoint in the same run and with the same load generator (wrk when installed,
else an asyncio httpx client). Target: GET >= 0.5 x hello. Exits 1 if missed.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _service import hello_app, lightpath, percentile  # noqa: E402


def measure_placement(url: str, jobs: int, dp: int, pp: int) -> list[float]:
    latencies = []
    with httpx.Client(base_url=url, timeout=30) as c:
        for i in range(jobs):
            body = {"job_id": f"bench-{i}", "parallelism": {"dp": dp, "pp": pp, "ep": 1}}
            start = time.perf_counter()
            r = c.post("/v1/jobs", json=body)
            latencies.append((time.perf_counter() - start) * 1000)
            if r.status_code != 201:
                raise SystemExit(f"job {i} not placed at once: {r.status_code} {r.text}")
            c.post(f"/v1/jobs/bench-{i}/complete")
            if (i + 1) % 100 == 0:
                print(f"  ... {i + 1}/{jobs} arrivals", file=sys.stderr)
    return latencies


def _wrk(url: str, seconds: int) -> float:
    out = subprocess.run(
        ["wrk", "-t2", "-c32", f"-d{seconds}s", url], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert match, out
    return float(match.group(1))


async def _httpx_load(url: str, seconds: int, concurrency: int = 32) -> float:
    done = 0
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(timeout=10) as client:

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                r = await client.get(url)
                r.raise_for_status()
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


def throughput(url: str, seconds: int) -> float:
    if shutil.which("wrk"):
        return _wrk(url, seconds)
    return asyncio.run(_httpx_load(url, seconds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--postgres", help="also run on this postgresql:// URL (empty database)")
    args = parser.parse_args()
    tool = "wrk -t2 -c32" if shutil.which("wrk") else "httpx asyncio x32"
    rows = []
    ok = True
    backends = [("sqlite", None)] + ([("postgres", args.postgres)] if args.postgres else [])
    for backend, db in backends:
        for cluster, dp, pp in (("small", 2, 2), ("seed-15k", 8, 4)):
            print(
                f"{backend} {cluster}: {args.jobs} arrivals of {dp * pp} servers", file=sys.stderr
            )
            with lightpath(cluster, db) as url:
                lat = measure_placement(url, args.jobs, dp, pp)
                with httpx.Client(base_url=url) as c:
                    c.post(
                        "/v1/jobs", json={"job_id": "probe", "parallelism": {"dp": dp, "pp": pp}}
                    )
                get_rps = throughput(f"{url}/v1/jobs/probe", args.seconds)
            if db is not None:
                _reset_postgres(db)
            rows.append((backend, cluster, percentile(lat, 50), percentile(lat, 99), get_rps))
    with hello_app() as hello:
        hello_rps = throughput(f"{hello}/hello", args.seconds)
    print(f"\nload generator: {tool}, {args.seconds}s per endpoint; hello: {hello_rps:,.0f} req/s")
    header = ("db", "cluster", "POST->placed p50", "p99", "GET job req/s", "x hello")
    print("{:9} {:9} {:>17} {:>9} {:>14} {:>8}".format(*header))
    for backend, cluster, p50, p99, rps in rows:
        ratio = rps / hello_rps
        ok &= ratio >= 0.5
        print(f"{backend:9} {cluster:9} {p50:14.1f} ms {p99:6.1f} ms {rps:14,.0f} {ratio:8.2f}")
    print("target GET >= 0.5 x hello:", "met" if ok else "MISSED")
    return 0 if ok else 1


def _reset_postgres(url: str) -> None:
    from sqlalchemy import create_engine, text

    from app.settings import Settings
    from app.store.tables import metadata

    engine = create_engine(Settings(database_url=url).database_url)
    with engine.begin() as conn:
        names = ", ".join(t.name for t in metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
