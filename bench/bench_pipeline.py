"""Event pipeline benchmark on the full stack (api + worker + mock-oxc, Postgres, Redis).

    .venv/bin/python bench/bench_pipeline.py [--seconds 10] [--demands 10] [--jobs 50]
                                             [--clients 8] [--profile DIR]
                                             [--api-gc-threshold N] [--redis-db 12]

The unbatched mode is driven by wrk when it is on PATH (a C load generator
light enough to leave the two cores to the stack: `apt-get install -y wrk`),
otherwise by a small built-in client (one thread and one keep-alive socket per
connection, requests written as prepared bytes); the table says which.

(a) Durable ingest: POST /v1/traffic in batches of 100 reports of `--demands`
    demand entries each, from `--clients` concurrent connections; a 202 means
    the batch is committed in PostgreSQL with its outbox event. Target >=
    50,000 demand entries/s on the 2-core development machine. Unbatched
    (1 report per POST, driven by wrk with `--clients` connections): target
    >= 1,000 reports/s. Then how long the worker takes to consume everything
    that was acknowledged.
(b) End to end: POST /v1/jobs of a cross-pod job on `small` until its
    cross-connects are confirmed by the mock switches (GET /v1/topology lists
    them and has no `desired`), p50/p99 over `--jobs` jobs, each completed
    (and its cross-connects gone) before the next; mock reconfiguration 25 ms.

`--profile DIR` records py-spy stacks (collapsed, for flamegraph.pl or
speedscope) of the api and the worker during each ingest mode and prints where
their samples go. `--api-gc-threshold N` starts the api with
`gc.set_threshold(N, 20, 100)` (CPython's default first threshold is 700): the
ingest path allocates ~10 objects per demand entry, and young-generation
collections over the api's large long-lived heap are a big share of its CPU.
The app is unchanged; this only shows what that setting would buy.
The load average is printed beside the figures (the machine is shared).
Exits 1 when an ingest target is missed (or a mode measured nothing). Fixed seed: 20261122.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _service import _wait_ready, free_port, percentile, stack_resources  # noqa: E402

REDIS_DB = 12  # the stream and lease keys are fixed names: a database of its own
SEED = 20261122
TARGET_DEMANDS_PER_S = 50_000
TARGET_SINGLE_REPORTS_PER_S = 1_000
BATCH_REPORTS = 100
CROSS_POD = {"dp": 6, "pp": 2}  # 12 servers on `small` (8 per pod): needs circuits


@dataclass
class FullStack:
    url: str
    database: str
    pids: dict[str, int] = field(default_factory=dict)


@contextmanager
def full_stack(
    cluster: str = "small",
    api_gc_threshold: int | None = None,
    redis_db: int = REDIS_DB,
    tree: str | None = None,
) -> Iterator[FullStack]:
    """mock-oxc, worker and api as subprocesses on a fresh database; dropped after.

    `tree`: run another checkout's code (its processes start in that directory)."""
    with stack_resources("lightpath_bench", redis_db) as (name, procs):
        oxc, api, worker = free_port(), free_port(), free_port()
        env = dict(
            os.environ,
            LIGHTPATH_DATABASE_URL=f"postgresql://postgres@127.0.0.1:5432/{name}",
            LIGHTPATH_REDIS_URL=f"redis://127.0.0.1:6379/{redis_db}",
            LIGHTPATH_SOUTHBOUND_URL=f"http://127.0.0.1:{oxc}",
            LIGHTPATH_CLUSTER=cluster,
            LIGHTPATH_RECONFIG_MS="25",
            LIGHTPATH_MOCK_FAULT_RATE="0",
            LIGHTPATH_LOG_LEVEL="WARNING",
        )
        env.pop("LIGHTPATH_API_TOKENS", None)
        if tree is not None:
            env["PYTHONPATH"] = tree
        run = [sys.executable, "-m", "app.cli"]
        subprocess.run([*run, "migrate"], env=env, check=True, capture_output=True, cwd=tree)
        for role, args, health in (
            ("mock-oxc", ["mock-oxc", "--port", str(oxc)], f"http://127.0.0.1:{oxc}/healthz"),
            (
                "worker",
                ["worker", "--metrics-port", str(worker)],
                f"http://127.0.0.1:{worker}/healthz",
            ),
            ("api", ["api", "--port", str(api)], f"http://127.0.0.1:{api}/healthz"),
        ):
            command = [*run, *args]
            if role == "api" and api_gc_threshold is not None:
                command = [sys.executable, "-c", _with_gc_threshold(api_gc_threshold, args)]
            p = subprocess.Popen(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tree
            )
            procs[role] = p
            _wait_ready(health, p)
        yield FullStack(f"http://127.0.0.1:{api}", name, {k: p.pid for k, p in procs.items()})


def _with_gc_threshold(threshold: int, args: list[str]) -> str:
    """`python -c` source running `lightpath ARGS` under another gc threshold."""
    return (
        f"import gc, sys; gc.set_threshold({threshold}, 20, 100); "
        f"sys.argv = ['lightpath', *{args!r}]; from app.cli import main; main()"
    )


def _body(servers: list[str], reports: int, demands: int, rng: random.Random) -> bytes:
    """One POST /v1/traffic body: `reports` unlabelled reports of `demands` entries."""
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


async def _ingest(url: str, bodies: list[bytes], seconds: float, clients: int) -> int:
    """POST bodies round-robin from `clients` connections for `seconds`; 202s counted."""
    sent = 0
    stop = time.perf_counter() + seconds
    headers = {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:

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
                i += clients

        await asyncio.gather(*(loop(k) for k in range(clients)))
    return sent


WRK_SCRIPT = """
local bodies = {%s}
local n = #bodies
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i + 1
  return wrk.format(nil, "/v1/traffic", nil, bodies[(i %% n) + 1])
end
done = function(summary, latency, requests)
  io.write(string.format("WRK %%d %%d %%d %%d\\n", summary.requests, summary.duration,
    summary.errors.status, summary.errors.connect + summary.errors.read
    + summary.errors.write + summary.errors.timeout))
end
"""


def _wrk_ingest(
    wrk: str, url: str, bodies: list[bytes], seconds: float, clients: int
) -> tuple[int, float]:
    """POST one-report bodies with wrk (`clients` connections, 2 threads); (202s, seconds)."""
    quoted = ", ".join(f"[==[{b.decode()}]==]" for b in bodies)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(WRK_SCRIPT % quoted)
    try:
        out = subprocess.run(
            [
                wrk,
                "-t2",
                f"-c{clients}",
                f"-d{max(1, round(seconds))}s",
                "--timeout",
                "10s",
                "-s",
                fh.name,
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(fh.name)
    line = next(x for x in out.splitlines() if x.startswith("WRK "))
    requests, duration_us, bad_status, socket_errors = (int(v) for v in line.split()[1:])
    if bad_status or socket_errors:
        raise SystemExit(f"unbatched ingest: {bad_status} non-2xx answers, {socket_errors} errors")
    return requests, duration_us / 1e6


def _socket_ingest(
    url: str, bodies: list[bytes], seconds: float, clients: int
) -> tuple[int, float]:
    """POST one-report bodies over `clients` keep-alive sockets, one thread each; (202s, s).

    The requests are prepared bytes and the answers are read by Content-Length:
    a few tens of microseconds of client CPU per request, so the stack, not
    the client, sets the rate (the fallback when wrk is not installed).
    """
    host, port = url.removeprefix("http://").split(":")
    requests = [
        b"POST /v1/traffic HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(b), b)
        for b in bodies
    ]
    stop = time.perf_counter() + seconds
    counts = [0] * clients
    failures: list[str] = []

    def run(k: int) -> None:
        with socket.create_connection((host, int(port))) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pending = b""
            i = k
            while time.perf_counter() < stop and not failures:
                sock.sendall(requests[i % len(requests)])
                i += clients
                while b"\r\n\r\n" not in pending:
                    chunk = sock.recv(65536)
                    if not chunk:
                        failures.append("connection closed")
                        return
                    pending += chunk
                head, _, pending = pending.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(pending) < length:
                    chunk = sock.recv(65536)
                    if not chunk:
                        failures.append("connection closed")
                        return
                    pending += chunk
                body, pending = pending[:length], pending[length:]
                if not head.startswith(b"HTTP/1.1 202"):
                    status = head.split(b"\r\n")[0]
                    failures.append(f"{status!r} {body[:200]!r}")
                    return
                counts[k] += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise SystemExit(f"unbatched ingest refused: {failures[0]}")
    return sum(counts), elapsed


@contextmanager
def _profiled(stack: FullStack, out: Path | None, seconds: float, mode: str) -> Iterator[None]:
    """py-spy record the api and the worker for `seconds` while the body runs."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    recorders = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for role in ("api", "worker"):
            recorders.append(
                subprocess.Popen(
                    [
                        spy,
                        "record",
                        "--pid",
                        str(stack.pids[role]),
                        "--duration",
                        str(max(1, int(seconds) - 1)),
                        "--rate",
                        "200",
                        "--format",
                        "raw",
                        "--gil",
                        "--output",
                        str(out / f"ingest-{mode}-{role}.folded"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    try:
        yield
    finally:
        for rec in recorders:
            rec.wait(timeout=60)


def _worker_cursor(database: str) -> int:
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}") as conn:
        row = conn.execute("SELECT value FROM counters WHERE name = 'traffic_cursor'").fetchone()
    return int(row[0]) if row else 0


def _stored_reports(database: str) -> int:
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}") as conn:
        row = conn.execute("SELECT count(*) FROM traffic_reports").fetchone()
    return int(row[0]) if row else 0


def _cpu_s(pid: int) -> float:
    """utime + stime of one process, seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pids_named(name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _machine_busy_s() -> float:
    """All non-idle CPU time of the machine, seconds (every core)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds per part of the stack over a window (from /proc): where the cores went."""

    def __init__(self, stack: FullStack) -> None:
        self.fixed = {
            "api": [stack.pids["api"]],
            "worker": [stack.pids["worker"]],
            "mock-oxc": [stack.pids["mock-oxc"]],
            "bench client": [os.getpid()],
        }
        self._start = self._read()

    def _read(self) -> dict[str, dict[int, float]]:
        # postgres backends come and go with the pools: found afresh at each reading
        groups = dict(
            self.fixed, postgres=_pids_named("postgres"), redis=_pids_named("redis-server")
        )
        out = {g: {p: _cpu_s(p) for p in pids} for g, pids in groups.items()}
        out["machine"] = {0: _machine_busy_s()}
        # children this script waited for (wrk, py-spy): their CPU is the client's
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["bench client"][-1] = children.ru_utime + children.ru_stime
        out["wall"] = {0: time.perf_counter()}
        return out

    def stop(self) -> dict[str, float]:
        end = self._read()
        used = {g: sum(v - self._start[g].get(p, 0.0) for p, v in end[g].items()) for g in end}
        used["other"] = used["machine"] - sum(
            v for g, v in used.items() if g not in ("machine", "wall")
        )
        return used


STACK = ("api", "worker", "postgres", "redis", "mock-oxc")


@dataclass
class IngestMode:
    """One ingest mode's run: what was acknowledged, in how long, at what CPU cost."""

    reports: int
    demands: int  # entries per report
    seconds: float
    cpu: dict[str, float]  # core-seconds per part of the stack over the run

    @property
    def reports_per_s(self) -> float:
        return self.reports / self.seconds if self.seconds else 0.0

    @property
    def demands_per_s(self) -> float:
        return self.reports_per_s * self.demands

    def cpu_us(self, parts: tuple[str, ...] = STACK, per: str = "report") -> float:
        """CPU microseconds of `parts` per report (or per demand entry)."""
        count = self.reports * (self.demands if per == "entry" else 1)
        return 1e6 * sum(self.cpu[p] for p in parts) / count if count else float("nan")


@dataclass
class IngestResult:
    batched: IngestMode
    single: IngestMode
    driver: str  # what drove the unbatched mode
    catch_up_s: float
    stored: int
    acknowledged: int


def measure_ingest(
    stack: FullStack, seconds: float, demands: int, clients: int, profile: Path | None
) -> IngestResult:
    rng = random.Random(SEED)
    cluster = httpx.get(f"{stack.url}/v1/cluster").json()
    servers = [s["id"] for p in cluster["pods"] for t in p["tors"] for s in t["servers"]]
    batched = [_body(servers, BATCH_REPORTS, demands, rng) for _ in range(16)]
    single = [_body(servers, 1, demands, rng) for _ in range(64)]
    asyncio.run(_ingest(stack.url, batched[:2], 1.0, 2))  # warm up pools and caches
    _socket_ingest(stack.url, single, 0.5, clients)
    acked = _stored_reports(stack.database)
    start = time.perf_counter()
    meter = CpuMeter(stack)
    with _profiled(stack, profile, seconds, "batched"):
        posts = asyncio.run(_ingest(stack.url, batched, seconds, clients))
    cpu = meter.stop()
    batched_mode = IngestMode(posts * BATCH_REPORTS, demands, time.perf_counter() - start, cpu)
    acked += batched_mode.reports
    wrk = shutil.which("wrk")
    meter = CpuMeter(stack)
    with _profiled(stack, profile, seconds, "single"):
        if wrk is not None:
            singles, single_s = _wrk_ingest(wrk, stack.url, single, seconds, clients)
        else:
            singles, single_s = _socket_ingest(stack.url, single, seconds, clients)
    single_mode = IngestMode(singles, demands, single_s, meter.stop())
    acked += singles
    done = time.perf_counter()
    while _worker_cursor(stack.database) < acked and time.perf_counter() - done < 120:
        time.sleep(0.1)
    return IngestResult(
        batched=batched_mode,
        single=single_mode,
        driver="wrk" if wrk is not None else "built-in client",
        catch_up_s=time.perf_counter() - done,
        stored=_stored_reports(stack.database),
        acknowledged=acked,
    )


def _job_cross_connects(topology: dict[str, Any], job_id: str) -> int:
    return sum(1 for o in topology["oxcs"] for cc in o["cross_connects"] if cc["job_id"] == job_id)


def measure_end_to_end(url: str, jobs: int) -> list[float]:
    """ms from POST /v1/jobs to the job's cross-connects confirmed and nothing else desired."""
    latencies = []
    with httpx.Client(base_url=url, timeout=30) as c:
        for i in range(jobs):
            job_id = f"e2e-{i}"
            start = time.perf_counter()
            r = c.post("/v1/jobs", json={"job_id": job_id, "parallelism": CROSS_POD})
            if r.status_code != 201:
                raise SystemExit(f"{job_id} not placed at once: {r.status_code} {r.text[:200]}")
            while True:
                t: dict[str, Any] = c.get("/v1/topology").json()
                if "desired" not in t and _job_cross_connects(t, job_id):
                    break
                if time.perf_counter() - start > 30:
                    raise SystemExit(f"{job_id}: cross-connects not confirmed in 30 s")
                time.sleep(0.002)
            latencies.append((time.perf_counter() - start) * 1000)
            c.post(f"/v1/jobs/{job_id}/complete").raise_for_status()
            while _job_cross_connects(c.get("/v1/topology").json(), job_id):
                time.sleep(0.01)
    return latencies


def print_profile(path: Path, role: str, top: int = 12) -> None:
    """Share of samples per leaf frame and per interesting caller, from collapsed stacks."""
    if not path.exists():
        print(f"{role}: no profile (py-spy needs ptrace permission)")
        return
    leaf: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        total += n
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    print(f"\n{role}: {total} samples holding the GIL; top leaf frames (self time)")
    for frame, n in sorted(leaf.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / total:5.1f}%  {frame[:110]}")
    print(f"{role}: inclusive share of app and driver frames")
    mine = {f: n for f, n in inclusive.items() if "/app/" in f or "psycopg" in f or "json" in f}
    for frame, n in sorted(mine.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / total:5.1f}%  {frame[:110]}")


def _print_cpu(mode: IngestMode, title: str) -> None:
    cpu = mode.cpu
    cores = os.cpu_count() or 1
    print(
        f"\nCPU during {title} ({cpu['wall']:.1f} s wall x {cores} cores = "
        f"{cpu['wall'] * cores:.1f} core-s; busy {cpu['machine']:.1f}; "
        f"{mode.reports:,} reports of {mode.demands} entries)"
    )
    for part in (*STACK, "bench client", "other"):
        per = ""
        if part in STACK:
            us, us_entry = mode.cpu_us((part,)), mode.cpu_us((part,), "entry")
            per = f"  {us:8.1f} us/report  {us_entry:6.2f} us/entry"
        print(
            f"  {part:<14} {cpu[part]:6.1f} core-s  {100 * cpu[part] / cpu['wall']:5.0f}% of a core"
            + per
        )
    print(
        f"  {'stack':<14} {sum(cpu[p] for p in STACK):6.1f} core-s  {'':>17}"
        f"{mode.cpu_us():8.1f} us/report  {mode.cpu_us(per='entry'):6.2f} us/entry"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10, help="per ingest mode")
    parser.add_argument("--demands", type=int, default=10, help="demand entries per report")
    parser.add_argument("--clients", type=int, default=8, help="concurrent connections")
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--profile", type=Path, default=None, help="py-spy stacks to this dir")
    parser.add_argument(
        "--api-gc-threshold", type=int, default=None, help="gc gen-0 threshold for the api"
    )
    parser.add_argument("--redis-db", type=int, default=REDIS_DB, help="flushed: its own")
    args = parser.parse_args()
    load_before = os.getloadavg()
    print("starting mock-oxc, worker and api on PostgreSQL and Redis ...", file=sys.stderr)
    with full_stack(api_gc_threshold=args.api_gc_threshold, redis_db=args.redis_db) as stack:
        print(f"ingest for {args.seconds:.0f} s per mode ...", file=sys.stderr)
        ingest = measure_ingest(stack, args.seconds, args.demands, args.clients, args.profile)
        print(f"{args.jobs} cross-pod jobs end to end ...", file=sys.stderr)
        lat = measure_end_to_end(stack.url, args.jobs)
    load_after = os.getloadavg()
    batched, single = ingest.batched, ingest.single
    # a mode that acknowledged nothing is not judged: that fails too
    ok = batched.reports > 0 and batched.demands_per_s >= TARGET_DEMANDS_PER_S
    single_ok = single.reports > 0 and single.reports_per_s >= TARGET_SINGLE_REPORTS_PER_S
    # wrk stops with up to `clients` requests in flight: stored, never answered
    in_flight = ingest.stored - ingest.acknowledged
    stored_once = 0 <= in_flight <= args.clients
    rows = [
        (
            f"ingest: demand entries/s (batches of {BATCH_REPORTS} x {args.demands})",
            f"{batched.demands_per_s:,.0f}",
            f">= {TARGET_DEMANDS_PER_S:,}",
            "met" if ok else "MISSED",
        ),
        ("ingest: reports/s, batched", f"{batched.reports_per_s:,.0f}", "", ""),
        ("  stack CPU per demand entry, us", f"{batched.cpu_us(per='entry'):.2f}", "", ""),
        (
            f"ingest: reports/s, 1 report per POST ({ingest.driver})",
            f"{single.reports_per_s:,.0f}",
            f">= {TARGET_SINGLE_REPORTS_PER_S:,}",
            "met" if single_ok else "MISSED",
        ),
        ("  stack CPU per report, us", f"{single.cpu_us():.0f}", "", ""),
        (
            "reports stored / acknowledged (+ in flight)",
            f"{ingest.stored:,} / {ingest.acknowledged:,}",
            f"+0..{args.clients}",
            "met" if stored_once else "MISSED",
        ),
        ("worker catch-up after ingest, s", f"{ingest.catch_up_s:.1f}", "", ""),
        ("POST /v1/jobs -> cross-connects confirmed p50, ms", f"{percentile(lat, 50):.0f}", "", ""),
        ("POST /v1/jobs -> cross-connects confirmed p99, ms", f"{percentile(lat, 99):.0f}", "", ""),
    ]
    print(
        f"\nfull stack on `small`, {args.clients} concurrent clients, OXC reconfiguration "
        f"25 ms, {len(lat)} cross-pod jobs, seed {SEED}, api gc threshold "
        f"{args.api_gc_threshold or 'default (700)'}; load average (1/5/15 min) "
        f"{'/'.join(f'{v:.2f}' for v in load_before)} before, "
        f"{'/'.join(f'{v:.2f}' for v in load_after)} after"
    )
    print(f"{'measure':<52} {'value':>16} {'target':>10}  result")
    for name, value, target, result in rows:
        print(f"{name:<52} {value:>16} {target:>10}  {result}")
    _print_cpu(batched, "batched ingest")
    _print_cpu(single, f"unbatched ingest ({ingest.driver})")
    if args.profile:
        for mode in ("batched", "single"):
            for role in ("api", "worker"):
                print_profile(args.profile / f"ingest-{mode}-{role}.folded", f"{mode} {role}")
    return 0 if ok and single_ok and stored_once else 1


if __name__ == "__main__":
    raise SystemExit(main())
