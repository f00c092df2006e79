"""The full stack as separate processes on PostgreSQL and Redis, killed mid-stream.

api, worker and mock-oxc run as real subprocesses. While a client streams job
arrivals, completions and traffic reports, the worker and then the API are
SIGKILLed and restarted, the mock switches fail 10% of commands, and one OXC
port carrying a circuit loses light. Afterwards every acknowledged request has
taken effect exactly once, the decision log is gap-free, and the switches hold
exactly the desired cross-connects with no port used twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
import redis

from tests.conftest import ADMIN_URL
from tests.support import free_port

REDIS_DB = 13  # the stream and lease keys are fixed names: a database of its own


def eventually(check: Callable[[], Any], timeout_s: float = 40.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout_s} s: {what}")
        time.sleep(0.1)


@dataclass
class Process:
    name: str
    args: list[str]
    env: dict[str, str]
    health_url: str
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *self.args],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        eventually(
            lambda: httpx.get(self.health_url, timeout=1).status_code == 200,
            30,
            f"{self.name} up",
        )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@dataclass
class Stack:
    env: dict[str, str]
    api_url: str
    oxc_url: str
    processes: dict[str, Process] = field(default_factory=dict)

    def add(self, name: str, args: list[str], health: str) -> Process:
        p = Process(name, args, self.env, health)
        self.processes[name] = p
        p.start()
        return p

    def worker(self, name: str) -> Process:
        port = free_port()
        return self.add(
            name, ["worker", "--metrics-port", str(port)], f"http://127.0.0.1:{port}/healthz"
        )


@pytest.fixture
def stack() -> Iterator[Stack]:
    name = f"lightpath_crash_{uuid.uuid4().hex[:10]}"
    base = ADMIN_URL.rsplit("/", 1)[0]
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    r = redis.Redis.from_url(f"redis://127.0.0.1:6379/{REDIS_DB}")
    r.flushdb()
    oxc_port, api_port = free_port(), free_port()
    env = dict(
        os.environ,
        LIGHTPATH_DATABASE_URL=f"{base}/{name}",
        LIGHTPATH_REDIS_URL=f"redis://127.0.0.1:6379/{REDIS_DB}",
        LIGHTPATH_SOUTHBOUND_URL=f"http://127.0.0.1:{oxc_port}",
        LIGHTPATH_CLUSTER="small",
        LIGHTPATH_MOCK_FAULT_RATE="0.1",
        LIGHTPATH_MOCK_FAULT_SEED="7",
        LIGHTPATH_WORKER_TICK_S="0.5",
        LIGHTPATH_LOG_LEVEL="WARNING",
    )
    env.pop("LIGHTPATH_API_TOKENS", None)
    subprocess.run(
        [sys.executable, "-m", "app.cli", "migrate"],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    s = Stack(env, f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{oxc_port}")
    try:
        s.add("mock-oxc", ["mock-oxc", "--port", str(oxc_port)], f"{s.oxc_url}/healthz")
        s.add("api", ["api", "--port", str(api_port)], f"{s.api_url}/healthz")
        yield s
    finally:
        for p in s.processes.values():
            p.stop()
        r.flushdb()
        r.close()
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """Retry through crashes; a 2xx means acknowledged, anything else raises."""
    deadline = time.monotonic() + 30
    while True:
        try:
            response = client.request(method, path, **kwargs)
            if response.status_code < 500:
                response.raise_for_status()
                return response
        except (httpx.TransportError, httpx.RemoteProtocolError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{method} {path} never acknowledged")
        time.sleep(0.2)


def _job_body(i: int) -> dict[str, Any]:
    dp, pp = (6, 2) if i % 3 == 0 else (2, 1)  # a third span pods and need circuits
    return {"job_id": f"job-{i}", "parallelism": {"dp": dp, "pp": pp}}


def _report(job: dict[str, Any], at: float, phase: int) -> dict[str, Any]:
    servers = [u["server"] for u in job["placement"]["units"]]
    pairs = list(zip(servers, servers[1:] + servers[:1], strict=True))
    if phase % 2:
        pairs = pairs[::2]
    return {
        "job_id": job["job_id"],
        "phase_started_at": at,
        "demands": [{"src": a, "dst": b, "bytes": 1e9 * (1 + phase % 2)} for a, b in pairs],
    }


def _mock_switch_state(stack: Stack) -> dict[str, dict[str, Any]]:
    """Each switch's state as it reads back (reads fail like commands: retry them)."""
    ids = [o["id"] for o in httpx.get(f"{stack.oxc_url}/oxcs", timeout=5).json()["oxcs"]]
    states = {}
    for oxc_id in ids:
        states[oxc_id] = eventually(
            lambda i=oxc_id: (
                (r := httpx.get(f"{stack.oxc_url}/oxcs/{i}", timeout=5))
                and r.status_code == 200
                and r.json()
            ),
            10,
            f"read {oxc_id}",
        )
    return states


def test_kills_faults_and_a_failed_port_lose_and_duplicate_nothing(stack: Stack) -> None:
    stack.worker("worker")
    client = httpx.Client(base_url=stack.api_url, timeout=10)
    acked_jobs: dict[str, dict[str, Any]] = {}
    completed: set[str] = set()
    reports_per_job: dict[str, int] = {}
    last_seqs: list[int] = []
    start = 1_763_812_345.0
    for i in range(24):
        if i == 8:
            stack.processes["worker"].kill()
            stack.processes["worker"].start()
        if i == 16:
            stack.processes["api"].kill()
            stack.processes["api"].start()
        r = call(client, "POST", "/v1/jobs", json=_job_body(i))
        acked_jobs[f"job-{i}"] = r.json()
        if i % 4 == 3:
            victim = f"job-{i - 3}"
            call(client, "POST", f"/v1/jobs/{victim}/complete")
            completed.add(victim)
        placed = [
            j
            for j in (call(client, "GET", f"/v1/jobs/{k}").json() for k in acked_jobs)
            if j["state"] == "placed"
        ]
        if placed:
            target = placed[0]
            batch = {"reports": [_report(target, start + i + k * 0.1, k) for k in range(4)]}
            r = call(
                client, "POST", "/v1/traffic", json=batch, headers={"Idempotency-Key": f"batch-{i}"}
            )
            last_seqs.append(r.json()["last_seq"])
            reports_per_job[target["job_id"]] = reports_per_job.get(target["job_id"], 0) + 4

    # a port carrying a circuit loses light
    topo = eventually(
        lambda: (
            (t := client.get("/v1/topology").json())["oxcs"]
            and any(o["cross_connects"] for o in t["oxcs"])
            and t
        ),
        what="circuits exist",
    )
    oxc = next(o for o in topo["oxcs"] if o["cross_connects"])
    failed_port = oxc["cross_connects"][0]["a"]
    failed = httpx.post(f"{stack.oxc_url}/oxcs/{oxc['id']}/ports/{failed_port}/fail", timeout=5)
    assert failed.status_code == 200, failed.text
    assert reports_per_job and completed and len(last_seqs) >= 20

    # every acknowledged job, in the state the acknowledged calls imply
    jobs = {k: call(client, "GET", f"/v1/jobs/{k}").json() for k in acked_jobs}
    for job_id, job in jobs.items():
        if job_id in completed:
            assert job["state"] == "completed", job_id
        else:
            assert job["state"] in ("placed", "queued"), job_id
    # no server held twice, and exactly one placement decision per job ever placed
    cluster = call(client, "GET", "/v1/cluster").json()
    holders = [
        s["job_id"] for p in cluster["pods"] for t in p["tors"] for s in t["servers"] if s["job_id"]
    ]
    for job_id, job in jobs.items():
        if job["state"] == "placed":
            assert holders.count(job_id) == len(job["placement"]["units"])
    decisions: list[dict[str, Any]] = []
    after = 0
    while True:
        page = call(client, "GET", "/v1/decisions", params={"after": after, "limit": 500}).json()
        if not page["decisions"]:
            break
        decisions.extend(page["decisions"])
        after = page["decisions"][-1]["seq"]
    assert [d["seq"] for d in decisions] == list(range(1, len(decisions) + 1)), "gap-free"
    placements = [d["job_id"] for d in decisions if d["kind"] == "placement"]
    assert len(placements) == len(set(placements))
    ever_placed = {k for k, j in jobs.items() if j["placed_at"]}
    assert set(placements) == ever_placed

    # every acknowledged traffic report stored once and consumed once
    assert len(set(last_seqs)) == len(last_seqs)
    assert max(last_seqs) == 4 * len(last_seqs)
    for job_id, n in reports_per_job.items():
        if jobs[job_id]["state"] == "placed":
            eventually(
                lambda j=job_id, n=n: (
                    (p := client.get(f"/v1/predictions/{j}").json())
                    and p["hits"] + p["misses"] == n
                ),
                what=f"{job_id} saw its {n} reports once",
            )

    # the switches converge to desired: no port twice, nothing on the failed port
    def converged() -> bool:
        t = client.get("/v1/topology").json()
        if "desired" in t or failed_port not in t["failed_ports"].get(oxc["id"], []):
            return False
        for oxc_id, state in _mock_switch_state(stack).items():
            ports = [p for cc in state["cross_connects"] for p in (cc["a"], cc["b"])]
            if len(ports) != len(set(ports)):
                raise AssertionError(f"{oxc_id}: a port in two cross-connects")
            if oxc_id == oxc["id"] and failed_port in ports:
                return False
        return True

    eventually(converged, 60, "switches converge off the failed port")
    client.close()


def test_the_standby_worker_takes_over_when_the_leader_dies(stack: Stack) -> None:
    a = stack.worker("worker-a")
    b = stack.worker("worker-b")
    ready = {p.name: p.health_url.replace("/healthz", "/readyz") for p in (a, b)}

    def leader() -> str | None:
        leaders = [n for n, url in ready.items() if httpx.get(url, timeout=2).json().get("leader")]
        assert len(leaders) <= 1, "two leaders"
        return leaders[0] if leaders else None

    first = eventually(leader, 20, "a leader")
    stack.processes[first].kill()
    ready.pop(first)
    t0 = time.monotonic()
    eventually(leader, 15, "the standby leads")
    assert time.monotonic() - t0 < 12
    client = httpx.Client(base_url=stack.api_url, timeout=10)
    call(client, "POST", "/v1/jobs", json={"job_id": "after", "parallelism": {"dp": 6, "pp": 2}})
    eventually(
        lambda: (
            (t := client.get("/v1/topology").json())
            and "desired" not in t
            and any(cc["job_id"] == "after" for o in t["oxcs"] for cc in o["cross_connects"])
        ),
        40,
        "the new leader wires the new job",
    )
    client.close()
