"""Launcher figures: `lightpath launch` to the training command running, and client overhead.

    .venv/bin/python bench/bench_launch.py [--launches 10] [--calls 2000]

1. Launch latency: `lightpath launch --runner local --dp 2 --pp 2 -- sh -c ...` on
   an idle `small` cluster, N times in a row. Each rank's command writes the
   wall-clock time it started; the figures are from just before the launcher
   process is spawned to the first and to the last rank started (median, p90),
   next to the start-up time of `lightpath --version` (interpreter + imports)
   so the share the server and the placement take is visible.
2. Client overhead per call: `Client.get_job` (call description, retry loop,
   status check, typed `Job`) against a bare `httpx.Client.get(...).json()` on
   the same URL, interleaved, on (a) an in-process transport answering a canned
   job (only the client's own code differs) and (b) the live server.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _service import lightpath, percentile  # noqa: E402

from lightpath_client import Client  # noqa: E402

LIGHTPATH = str(Path(sys.executable).with_name("lightpath"))
RANK = 'python3 -c "import time,os; print(time.time())" > "$OUT/rank-$NODE_RANK"'


def launch_once(url: str, job_id: str, out: Path) -> tuple[float, float, float]:
    """(first rank started, last rank started, launcher exited), seconds after spawning."""
    env = dict(os.environ, OUT=str(out))
    start = time.time()
    done = subprocess.run(
        [
            LIGHTPATH,
            "launch",
            "--server",
            url,
            "--job-id",
            job_id,
            "--dp",
            "2",
            "--pp",
            "2",
            "--workdir",
            str(out / "w"),
            "--",
            "sh",
            "-c",
            RANK,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ended = time.time()
    if done.returncode != 0:
        raise SystemExit(f"launch {job_id} failed: {done.stderr}")
    starts = [float((out / f"rank-{i}").read_text()) for i in range(4)]
    return min(starts) - start, max(starts) - start, ended - start


def cli_startup(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([LIGHTPATH, "--version"], capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return times


def overhead(url: str, calls: int, transport: httpx.BaseTransport | None) -> tuple[float, float]:
    """Median µs per call: (lightpath Client.get_job, bare httpx get + json)."""
    client = Client(url, transport=transport)
    bare = httpx.Client(base_url=url, transport=transport, timeout=30)
    ours, theirs = [], []
    try:
        for _ in range(50):  # warm both connections
            client.get_job("bench")
            bare.get("/v1/jobs/bench").json()
        for _ in range(calls):
            t = time.perf_counter()
            client.get_job("bench")
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            r = bare.get("/v1/jobs/bench")
            r.raise_for_status()
            r.json()
            theirs.append(time.perf_counter() - t)
    finally:
        client.close()
        bare.close()
    return statistics.median(ours) * 1e6, statistics.median(theirs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=10)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")

    startup = cli_startup(5)
    with lightpath("small") as url, tempfile.TemporaryDirectory() as tmp:
        firsts, lasts, totals = [], [], []
        for i in range(args.launches):
            out = Path(tmp) / str(i)
            out.mkdir()
            first, last, total = launch_once(url, f"bench-{i}", out)
            firsts.append(first * 1000)
            lasts.append(last * 1000)
            totals.append(total * 1000)
        canned = None
        with Client(url) as c:
            job = c.submit_job("bench", dp=1, pp=1)
            canned = json.dumps(job.raw).encode()

        def answer(_request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, content=canned, headers={"content-type": "application/json"})

        mock_ours, mock_bare = overhead("http://lightpath", args.calls, httpx.MockTransport(answer))
        live_ours, live_bare = overhead(url, args.calls, None)

    print(f"\nlightpath launch, dp=2 pp=2 (4 local ranks), {args.launches} launches:")
    print(
        f"  `lightpath --version` start-up     median {statistics.median(startup) * 1000:7.0f} ms"
    )
    for name, values in (
        ("first rank started", firsts),
        ("last rank started", lasts),
        ("launcher exited (completed)", totals),
    ):
        print(
            f"  {name:<34} median {statistics.median(values):7.0f} ms"
            f"  p90 {percentile(values, 90):7.0f} ms"
        )
    print(f"\nclient overhead per GET /v1/jobs/{{id}}, {args.calls} calls each (median):")
    for name, ours, bare in (
        ("in-process transport", mock_ours, mock_bare),
        ("live server", live_ours, live_bare),
    ):
        print(
            f"  {name:<21} Client.get_job {ours:7.1f} µs, bare httpx {bare:7.1f} µs,"
            f" overhead {ours - bare:6.1f} µs"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
