"""Bounded soak on the full stack: churn, traffic, a stalled leader and a killed one.

    .venv/bin/python bench/bench_soak.py [--seconds 120] [--jobs 2000] [--reports 100000]
                                         [--launchers 16] [--hold-s 1.0] [--redis-db 13] [--no-pace]

mock-oxc, two workers (leader-elected) and one api on a fresh PostgreSQL
database and Redis database `--redis-db`, with short retention windows
(reports 30 s, decisions 60 s, idempotency keys 30 s, outbox 10 s, ended jobs
and their prediction rows 60 s; retention every 5 s) so a short run shows
whether tables stay within them.

Load, spread over `--seconds` (job k is not submitted before k/jobs of the run,
report batches likewise; `--no-pace` sends as fast as the launchers go):
- `--launchers` threads each loop: POST /v1/jobs (2 servers on `small`),
  long-poll until placed, hold `--hold-s`, complete; one job in five is
  cancelled while still queued instead (churn). Up to `--jobs` jobs in all.
- two telemetry threads POST batches of 100 reports (each with an
  Idempotency-Key) until `--reports` reports were acknowledged.
- at 1/3 of the run the leader is SIGSTOPped for 8 s (past its 5 s lease) and
  resumed; at 2/3 the leader is SIGKILLed and restarted. Takeover = time from
  the signal until the other worker reports itself leader.

Printed: p50/p99 per endpoint; POST /v1/jobs split by answer (201 placed, 202
queued) and by whether it overlapped a takeover window (signal until the other
worker leads: nothing can decide, so the API waits its admit wait); 5xx count,
placements per second, takeovers; RSS of api and workers after warm-up and at
the end, table sizes at the start and the end, both every tenth of the run
(`timeline`); the load average (the machine is shared). Targets from
issue 15: no 5xx, takeover <= TTL + 2 s, tables within retention, flat memory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _service import _wait_ready, free_port, percentile, stack_resources  # noqa: E402

SMALL = {"dp": 2, "pp": 1}
TABLES = (
    "jobs",
    "decisions",
    "traffic_reports",
    "traffic_batches",
    "outbox",
    "dead_letters",
    "predictions",
)
TTL_S = 5.0


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.status: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self.errors: list[str] = []
        self.unplaced = 0  # jobs not placed within the launcher's 20 s wait (then cancelled)
        # jobs seen placed (201, or placed after a 202): counted by the client, since
        # retention deletes ended job rows during the run
        self.placed = 0
        # POST /v1/jobs: (sent at, seconds, status), to split the tail by outcome and by
        # whether a leader was in place (takeover windows)
        self.submits: list[tuple[float, float, int]] = []
        # the API's own account of each POST /v1/jobs (Server-Timing: store, decide), in ms
        self.server_ms: dict[float, dict[str, float]] = {}
        self.leaderless: list[tuple[float, float]] = []  # (signal, new leader seen)

    def call(self, client: httpx.Client, name: str, method: str, path: str, **kw: Any) -> Any:
        """One request, retried on connection errors (the api never dies here)."""
        for _ in range(50):
            start = time.perf_counter()
            try:
                r = client.request(method, path, **kw)
            except httpx.HTTPError as exc:
                with self.lock:
                    self.errors.append(f"{name}: {type(exc).__name__}")
                time.sleep(0.2)
                continue
            took = time.perf_counter() - start
            with self.lock:
                self.latency[name].append(took)
                self.status[name][r.status_code] += 1
                if name == "POST /v1/jobs":
                    sent = time.monotonic() - took
                    self.submits.append((sent, took, r.status_code))
                    self.server_ms[sent] = server_timing(r.headers.get("server-timing", ""))
            if r.status_code == 503:
                time.sleep(float(r.headers.get("retry-after", "1")))
                continue
            return r
        raise RuntimeError(f"{name}: no answer")


def server_timing(header: str) -> dict[str, float]:
    """`store;dur=1.2, decide;dur=3.4` -> {"store": 1.2, "decide": 3.4}."""
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name and dur:
            out[name] = float(dur)
    return out


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def submit_split(stats: Stats) -> dict[str, dict[str, float]]:
    """POST /v1/jobs latency by answer (201 placed, 202 queued) and by whether the request
    overlapped a takeover window (no leader: nothing can decide, the API waits its admit wait)."""

    def overlaps(sent: float, took: float) -> bool:
        return any(sent < end and sent + took > start for start, end in stats.leaderless)

    groups: dict[str, list[float]] = defaultdict(list)
    for sent, took, status in stats.submits:
        window = "takeover" if overlaps(sent, took) else "leader"
        groups[f"{status} {window}"].append(took)
        groups[f"all {window}"].append(took)
    return {
        k: {
            "n": len(v),
            "p50_ms": round(percentile(v, 50) * 1000, 1),
            "p99_ms": round(percentile(v, 99) * 1000, 1),
            "over_1s": sum(1 for x in v if x > 1.0),
        }
        for k, v in sorted(groups.items())
    }


def slowest_submits(stats: Stats, t0: float, n: int = 10) -> list[dict[str, Any]]:
    """The slowest POST /v1/jobs made while a worker led: when (seconds into the run), how
    long after the last takeover window ended (a pass's tail or a leader's first passes),
    and the API's Server-Timing (its write and its wait for the scheduler; the rest of the
    client's time is queueing outside the handler: the event loop, the client, the CPU)."""
    out = []
    for sent, took, status in stats.submits:
        if any(sent < end and sent + took > start for start, end in stats.leaderless):
            continue
        ends = [end for _start, end in stats.leaderless if end <= sent]
        out.append(
            {
                "t_s": round(sent - t0, 2),
                "ms": round(took * 1000, 1),
                "status": status,
                "after_takeover_s": round(sent - max(ends), 2) if ends else -1.0,
                "server_ms": stats.server_ms.get(sent, {}),
            }
        )
    return sorted(out, key=lambda x: -x["ms"])[:n]


def table_sizes(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {
            t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])  # type: ignore[index]
            for t in TABLES
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--reports", type=int, default=100_000)
    parser.add_argument("--launchers", type=int, default=16)
    parser.add_argument("--hold-s", type=float, default=1.0)
    parser.add_argument("--redis-db", type=int, default=13)
    parser.add_argument(
        "--no-faults",
        action="store_true",
        help="no leader stall or kill: churn and traffic only (POST /v1/jobs under churn)",
    )
    parser.add_argument(
        "--no-pace",
        action="store_true",
        help="send jobs and reports as fast as the launchers go (default: spread over --seconds)",
    )
    parser.add_argument("--logs", help="write each process's log (stderr) under this directory")
    args = parser.parse_args()

    with stack_resources("lightpath_soak", args.redis_db) as (name, procs):
        return soak(args, name, procs)


def soak(args: argparse.Namespace, name: str, procs: dict[str, subprocess.Popen[bytes]]) -> int:
    """The soak itself; `stack_resources` tears the processes, Redis and the database down."""
    db_url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    oxc, api = free_port(), free_port()
    env = dict(
        os.environ,
        LIGHTPATH_DATABASE_URL=db_url,
        LIGHTPATH_REDIS_URL=f"redis://127.0.0.1:6379/{args.redis_db}",
        LIGHTPATH_SOUTHBOUND_URL=f"http://127.0.0.1:{oxc}",
        LIGHTPATH_CLUSTER="small",
        LIGHTPATH_RECONFIG_MS="25",
        LIGHTPATH_LOG_LEVEL="WARNING",
        LIGHTPATH_WORKER_TICK_S="0.5",
        LIGHTPATH_RETAIN_REPORTS_S="30",
        LIGHTPATH_RETAIN_DECISIONS_S="60",
        LIGHTPATH_IDEMPOTENCY_WINDOW_S="30",
        LIGHTPATH_RETAIN_OUTBOX_S="10",
        LIGHTPATH_RETAIN_JOBS_S="60",
        LIGHTPATH_RETENTION_INTERVAL_S="5",
    )
    env.pop("LIGHTPATH_API_TOKENS", None)
    env.pop("LIGHTPATH_SOUTHBOUND_TOKEN", None)
    run = [sys.executable, "-m", "app.cli"]
    ports: dict[str, int] = {}

    def start(role: str, cmd: list[str], health: str) -> None:
        err: Any = subprocess.DEVNULL
        if args.logs:
            Path(args.logs).mkdir(parents=True, exist_ok=True)
            err = open(Path(args.logs) / f"{role}.log", "ab")  # noqa: SIM115
        p = subprocess.Popen([*run, *cmd], env=env, stdout=subprocess.DEVNULL, stderr=err)
        procs[role] = p
        _wait_ready(health, p)

    def start_worker(role: str) -> None:
        port = ports.setdefault(role, free_port())
        start(role, ["worker", "--metrics-port", str(port)], f"http://127.0.0.1:{port}/healthz")

    def leader(exclude: str | None = None) -> str | None:
        for role in ("worker-a", "worker-b"):
            if role == exclude:
                continue
            try:
                body = httpx.get(f"http://127.0.0.1:{ports[role]}/readyz", timeout=1).json()
            except (httpx.HTTPError, ValueError):
                continue
            if body.get("leader"):
                return role
        return None

    stats = Stats()
    stop = threading.Event()
    jobs_left = [args.jobs]
    reports_done = [0]
    reports_sent = [0]  # reserved by telemetry threads (pacing)
    start_at = [time.monotonic()]  # set when the load starts

    def pace(fraction: float) -> None:
        """Wait until `fraction` of --seconds has passed (the load spans the whole run, both
        takeovers included), unless --no-pace."""
        if not args.no_pace:
            stop.wait(max(0.0, start_at[0] + fraction * args.seconds - time.monotonic()))

    takeovers: list[tuple[str, float]] = []
    try:
        subprocess.run([*run, "migrate"], env=env, check=True, capture_output=True)
        start("mock-oxc", ["mock-oxc", "--port", str(oxc)], f"http://127.0.0.1:{oxc}/healthz")
        start_worker("worker-a")
        start_worker("worker-b")
        start("api", ["api", "--port", str(api)], f"http://127.0.0.1:{api}/healthz")
        url = f"http://127.0.0.1:{api}"
        deadline = time.monotonic() + 20
        while leader() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        servers = [
            s["id"]
            for p in httpx.get(f"{url}/v1/cluster").json()["pods"]
            for t in p["tors"]
            for s in t["servers"]
        ]

        def launcher(k: int) -> None:
            rng = random.Random(k)
            with httpx.Client(base_url=url, timeout=30) as c:
                n = 0
                while not stop.is_set():
                    with stats.lock:
                        if jobs_left[0] <= 0:
                            return
                        slot = args.jobs - jobs_left[0]
                        jobs_left[0] -= 1
                    pace(slot / args.jobs)
                    if stop.is_set():
                        return
                    job_id = f"soak-{k}-{n}"
                    n += 1
                    body = {"job_id": job_id, "parallelism": SMALL}
                    posted = stats.call(c, "POST /v1/jobs", "POST", "/v1/jobs", json=body)
                    if posted.status_code == 201:
                        with stats.lock:
                            stats.placed += 1
                    if rng.random() < 0.2:  # churn: cancelled while (probably) queued
                        ended = stats.call(
                            c, "DELETE /v1/jobs/{id}", "DELETE", f"/v1/jobs/{job_id}"
                        )
                        if posted.status_code == 202 and ended.json().get("placed_at"):
                            with stats.lock:
                                stats.placed += 1  # placed between the 202 and the cancel
                        continue
                    params = {"wait_for": "placed", "timeout_s": 20}
                    got = stats.call(
                        c, "GET /v1/jobs/{id}?wait_for", "GET", f"/v1/jobs/{job_id}", params=params
                    )
                    if got.json().get("state") != "placed":  # not placed in 20 s: give up on it
                        with stats.lock:
                            stats.unplaced += 1
                        stats.call(c, "DELETE /v1/jobs/{id}", "DELETE", f"/v1/jobs/{job_id}")
                        continue
                    if posted.status_code == 202:
                        with stats.lock:
                            stats.placed += 1
                    time.sleep(args.hold_s)
                    stats.call(c, "POST complete", "POST", f"/v1/jobs/{job_id}/complete")

        def telemetry(k: int) -> None:
            rng = random.Random(100 + k)
            with httpx.Client(base_url=url, timeout=30) as c:
                n = 0
                while not stop.is_set():
                    with stats.lock:
                        if reports_done[0] >= args.reports or reports_sent[0] >= args.reports:
                            return
                        slot = reports_sent[0]
                        reports_sent[0] += 100
                    pace(slot / args.reports)
                    if stop.is_set():
                        return
                    at = 1_800_000_000.0 + k * 1e6 + n * 100
                    batch = {
                        "reports": [
                            {
                                "phase_started_at": at + i * 0.1,
                                "demands": [
                                    {"src": a, "dst": b, "bytes": rng.uniform(1e8, 2e9)}
                                    for a, b in (rng.sample(servers, 2) for _ in range(4))
                                ],
                            }
                            for i in range(100)
                        ]
                    }
                    key = {"Idempotency-Key": f"soak-{k}-{n}"}
                    resp = stats.call(
                        c, "POST /v1/traffic", "POST", "/v1/traffic", json=batch, headers=key
                    )
                    n += 1
                    if resp.status_code == 202:
                        with stats.lock:
                            reports_done[0] += resp.json()["accepted"]

        threads = [
            threading.Thread(target=launcher, args=(k,), daemon=True) for k in range(args.launchers)
        ]
        threads += [threading.Thread(target=telemetry, args=(k,), daemon=True) for k in range(2)]
        t0 = time.monotonic()
        start_at[0] = t0
        timeline: list[dict[str, Any]] = []

        def sample() -> None:
            """RSS and table sizes every tenth of the run (at least 30 s apart)."""
            every = max(30.0, args.seconds / 10)
            while not stop.wait(every):
                timeline.append(
                    {
                        "t_s": round(time.monotonic() - t0),
                        "rss_mb": {
                            k: round(rss_mb(p.pid), 1) for k, p in procs.items() if k != "mock-oxc"
                        },
                        "tables": table_sizes(db_url),
                        "loadavg": Path("/proc/loadavg").read_text().split()[0],
                    }
                )

        sampler = threading.Thread(target=sample, daemon=True)
        for th in threads:
            th.start()
        sampler.start()
        time.sleep(min(10.0, args.seconds / 6))
        rss_start = {k: rss_mb(p.pid) for k, p in procs.items() if k != "mock-oxc"}
        sizes_start = table_sizes(db_url)

        def takeover(kind: str) -> None:
            old = leader()
            if old is None:
                return
            p = procs[old]
            signalled = time.monotonic()
            if kind == "stall":
                p.send_signal(signal.SIGSTOP)
            else:
                p.send_signal(signal.SIGKILL)
                p.wait()
            new = None
            while new is None and time.monotonic() - signalled < 30:
                new = leader(exclude=old)
                time.sleep(0.05)
            takeovers.append((kind, time.monotonic() - signalled if new else float("inf")))
            with stats.lock:
                stats.leaderless.append((signalled, time.monotonic()))
            if kind == "stall":
                time.sleep(max(0.0, 8.0 - (time.monotonic() - signalled)))
                p.send_signal(signal.SIGCONT)
            else:
                start_worker(old)

        while time.monotonic() - t0 < args.seconds / 3:
            time.sleep(0.2)
        if not args.no_faults:
            takeover("stall")
        while time.monotonic() - t0 < 2 * args.seconds / 3:
            time.sleep(0.2)
        if not args.no_faults:
            takeover("kill")
        while time.monotonic() - t0 < args.seconds and any(th.is_alive() for th in threads):
            time.sleep(0.2)
        stop.set()
        for th in threads:
            th.join(60)
        elapsed = time.monotonic() - t0
        time.sleep(6)  # one retention interval after the load
        rss_end = {k: rss_mb(p.pid) for k, p in procs.items() if k != "mock-oxc"}
        sizes_end = table_sizes(db_url)
        placed = stats.placed
        report = {
            "seconds": round(elapsed, 1),
            "jobs_submitted": args.jobs - max(0, jobs_left[0]),
            "reports_acknowledged": reports_done[0],
            "jobs_placed": placed,
            "placements_per_s": round(placed / elapsed, 2),
            "endpoints": {
                name: {
                    "n": len(v),
                    "p50_ms": round(percentile(v, 50) * 1000, 1),
                    "p99_ms": round(percentile(v, 99) * 1000, 1),
                    "status": dict(stats.status[name]),
                }
                for name, v in sorted(stats.latency.items())
            },
            "post_jobs_split": submit_split(stats),
            "post_jobs_slowest_with_leader": slowest_submits(stats, t0),
            "server_errors_5xx": sum(
                n
                for s in stats.status.values()
                for code, n in s.items()
                if code >= 500 and code != 503
            ),
            "answers_503": sum(s.get(503, 0) for s in stats.status.values()),
            "connection_errors": len(stats.errors),
            "jobs_not_placed_in_20s": stats.unplaced,
            "takeover_s": {k: round(v, 2) for k, v in takeovers},
            "rss_mb_start": {k: round(v, 1) for k, v in rss_start.items()},
            "rss_mb_end": {k: round(v, 1) for k, v in rss_end.items()},
            "tables_start": sizes_start,
            "tables_end": sizes_end,
            "timeline": timeline,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        }
        print(json.dumps(report, indent=2))
        ok = report["server_errors_5xx"] == 0 and all(v <= TTL_S + 2 for _, v in takeovers)
        return 0 if ok else 1
    finally:
        stop.set()


if __name__ == "__main__":
    sys.exit(main())
