"""`lightpath_client` against the live API (real HTTP), sync and async.

Retries on 503 are also checked on a scripted transport, where the sequence of
answers and the pauses between attempts can be asserted exactly.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from lightpath_client import (
    AsyncClient,
    Client,
    Conflict,
    DeadLetterPage,
    NotFound,
    PhaseReporter,
    ServiceUnavailable,
    TransportError,
    UnexpectedAnswer,
    ValidationFailed,
    WaitTimeout,
    ring_allreduce_demands,
)
from lightpath_client._client import _Calls
from tests.support import LiveServer, free_port

SMALL_SERVERS = 32


def small_settings(tmp_path: Path) -> Settings:
    from app.store.migrate import upgrade_to_head

    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'lp.db'}",
        cluster="small",
        admit_wait_s=2.0,
        worker_tick_s=0.2,
    )
    upgrade_to_head(settings)
    return settings


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(small_settings(tmp_path))
    server.start()
    yield server
    server.stop()


def test_sync_client_covers_the_lifecycle_with_typed_results(live: LiveServer) -> None:
    with Client(live.url) as lp:
        job = lp.submit_job("c-1", dp=2, pp=2, lease_s=30, walltime_s=600)
        assert (job.state, job.servers_needed, len(job.units)) == ("placed", 4, 4)
        assert job.lease_s == 30 and job.raw["walltime_s"] == 600
        assert lp.submit_job("c-1", dp=2, pp=2, lease_s=30, walltime_s=600) == job  # idempotent
        assert lp.heartbeat("c-1").state == "placed"
        assert lp.submit_job("big", dp=16, pp=2).state == "queued"
        assert lp.cluster().free_servers == SMALL_SERVERS - 4
        assert [j.job_id for j in lp.list_jobs(state="queued").jobs] == ["big"]
        assert lp.cancel_job("big").state == "cancelled"
        done = lp.complete_job("c-1")
        assert done.state == "completed" and done.completed_at is not None
        assert lp.cluster().free_servers == SMALL_SERVERS
        assert lp.submit_job("f-1", dp=1, pp=1).state == "placed"
        failed = lp.fail_job("f-1", exit_code=137, reason="oom")
        assert (failed.state, failed.exit_code, failed.end_reason) == ("failed", 137, "oom")
        assert [j.job_id for j in lp.iter_jobs(page_size=1)] == ["c-1", "big", "f-1"]
        decisions = lp.decisions(0, 1000)
        assert [d.seq for d in decisions.decisions] == list(range(1, decisions.next + 1))
        assert lp.decisions(decisions.next).decisions == ()  # next is the after to pass
        assert lp.dead_letters() == DeadLetterPage((), None)


def test_problems_are_raised_as_typed_exceptions(live: LiveServer) -> None:
    with Client(live.url) as lp:
        with pytest.raises(NotFound) as missing:
            lp.get_job("nope")
        assert missing.value.status == 404 and missing.value.kind == "unknown-job"
        with pytest.raises(ValidationFailed) as invalid:
            lp.submit_job("bad", dp=0, pp=1)
        assert invalid.value.errors[0]["field"] == "body.parallelism.dp"
        with pytest.raises(ValidationFailed) as never:
            lp.submit_job("huge", dp=64, pp=2)
        assert never.value.kind == "never-fits" and never.value.body["servers_needed"] == 128
        lp.submit_job("x", dp=1, pp=1)
        with pytest.raises(Conflict) as other_body:
            lp.submit_job("x", dp=2, pp=1)
        assert other_body.value.kind == "conflict"
        lp.cancel_job("x")
        with pytest.raises(Conflict) as ended:
            lp.complete_job("x")
        assert ended.value.body["job"]["state"] == "cancelled"


def test_wait_for_loops_over_early_answers_until_the_state(live: LiveServer) -> None:
    requests: list[httpx.Request] = []
    with Client(live.url, poll_s=0.3) as lp:
        lp.http.event_hooks["request"].append(requests.append)
        lp.submit_job("head", dp=16, pp=2)
        assert lp.submit_job("next", dp=4, pp=2).state == "queued"
        progress: list[str] = []
        timer = threading.Timer(1.5, lambda: Client(live.url).complete_job("head"))
        timer.start()
        started = time.monotonic()
        job = lp.wait_for(
            "next", "placed", timeout_s=30, on_progress=lambda j, _s: progress.append(j.state)
        )
        timer.join()
        assert job.state == "placed" and 1.4 < time.monotonic() - started < 10
        polls = [r for r in requests if r.url.params.get("wait_for") == "placed"]
        # the server answered each 0.3 s long-poll early with "queued"; the loop asked again
        assert len(polls) >= 3 and set(progress) == {"queued"}


def test_wait_for_gives_up_at_the_deadline_with_the_last_state(live: LiveServer) -> None:
    with Client(live.url, poll_s=5) as lp:
        lp.submit_job("head", dp=16, pp=2)
        lp.submit_job("stuck", dp=4, pp=2)
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as timeout:
            lp.wait_for("stuck", "placed", timeout_s=1.0)
        assert 0.9 < time.monotonic() - started < 4
        assert timeout.value.job.state == "queued"


def test_async_client_does_the_same(live: LiveServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(live.url, poll_s=0.3) as lp:
            assert (await lp.submit_job("a-1", dp=16, pp=2)).state == "placed"
            assert (await lp.submit_job("a-2", dp=2, pp=1)).state == "queued"
            waiting = asyncio.create_task(lp.wait_for("a-2", "placed", timeout_s=30))
            await asyncio.sleep(0.8)
            assert not waiting.done()
            await lp.complete_job("a-1")
            assert (await waiting).state == "placed"
            with pytest.raises(NotFound):
                await lp.get_job("nope")
            with pytest.raises(WaitTimeout):
                await lp.wait_for("a-2", "completed", timeout_s=0.5)
            assert (await lp.cancel_job("a-2")).state == "cancelled"
            assert [j.job_id async for j in lp.iter_jobs(page_size=1)] == ["a-1", "a-2"]
            assert (await lp.cluster()).free_servers == SMALL_SERVERS

    asyncio.run(scenario())


def test_calls_retry_across_a_server_restart(tmp_path: Path) -> None:
    settings = small_settings(tmp_path)
    port = free_port()
    first = LiveServer(settings, port=port)
    first.start()
    with Client(first.url, retries=12, backoff_s=0.1, max_backoff_s=1.0) as lp:
        assert lp.submit_job("r-1", dp=2, pp=1).state == "placed"
        first.stop()
        second = LiveServer(settings, port=port)
        threading.Timer(1.5, second.start).start()
        try:
            started = time.monotonic()
            # refused while the server is down, then answered by the new process
            assert lp.get_job("r-1").state == "placed"
            assert time.monotonic() - started > 1.0
            assert lp.complete_job("r-1").state == "completed"
        finally:
            time.sleep(0.1)
            second.stop()
    with Client(f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.01) as lp:
        with pytest.raises(TransportError):
            lp.cluster()


def _scripted(statuses: list[int]) -> tuple[list[float], httpx.MockTransport]:
    """A transport answering `statuses` in turn (503s carry problem+json), recording times."""
    times: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        times.append(time.monotonic())
        status = statuses[min(len(times) - 1, len(statuses) - 1)]
        if status == 503:
            problem = {"type": "x/not-ready", "title": "Not ready", "status": 503, "detail": "db"}
            return httpx.Response(
                503, json=problem, headers={"content-type": "application/problem+json"}
            )
        job = {"job_id": "j", "state": "placed", "parallelism": {"dp": 1, "pp": 1, "ep": 1}}
        return httpx.Response(200, json=job)

    return times, httpx.MockTransport(handle)


def test_503_is_retried_with_growing_backoff_then_raised() -> None:
    times, transport = _scripted([503, 503, 503, 200])
    with Client("http://lp", transport=transport, backoff_s=0.1, max_backoff_s=5) as lp:
        assert lp.get_job("j").state == "placed"
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(gaps) == 3
    for attempt, gap in enumerate(gaps):  # full jitter in [0.5, 1] x 0.1 x 2^attempt
        assert 0.05 * 2**attempt * 0.9 <= gap <= 0.1 * 2**attempt + 0.1, gaps
    times, transport = _scripted([503])
    with Client("http://lp", transport=transport, retries=2, backoff_s=0.01) as lp:
        with pytest.raises(ServiceUnavailable) as unavailable:
            lp.get_job("j")
    assert len(times) == 3 and unavailable.value.title == "Not ready"


def test_a_retry_budget_rides_out_an_outage_and_4xx_stay_final() -> None:
    """`retries` ends after ~3-6 s of backoff, less than a server restart; a call given
    `retry_for_s` keeps retrying refused connections and 503s for that long, telling
    `on_retry` of each, while a 4xx is still final at once."""
    calls: list[float] = []

    def down_then_up(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if len(calls) <= 5:
            raise httpx.ConnectError("Connection refused", request=request)
        if len(calls) <= 8:
            return httpx.Response(503, json={"title": "Not ready", "status": 503})
        if request.url.path.endswith("/nope"):
            return httpx.Response(404, json={"title": "Not found", "status": 404})
        job = {"job_id": "j", "state": "completed", "parallelism": {"dp": 1, "pp": 1, "ep": 1}}
        return httpx.Response(200, json=job)

    transport = httpx.MockTransport(down_then_up)
    told: list[tuple[str, float]] = []
    options = {"retries": 2, "backoff_s": 0.01, "max_backoff_s": 0.02}
    with Client("http://lp", transport=transport, **options) as lp:
        with pytest.raises(TransportError):
            lp.complete_job("j")  # three attempts, then given up
        assert len(calls) == 3
        calls.clear()
        call = _Calls.complete_job("j")
        job = lp.request(call, retry_for_s=30, on_retry=lambda w, p: told.append((w, p)))
        assert job.state == "completed" and len(calls) == 9
        assert [w for w, _ in told[:1]] == [
            "POST /v1/jobs/j/complete: ConnectError: Connection refused"
        ]
        assert told[-1][0] == "POST /v1/jobs/j/complete: 503 Service Unavailable"
        assert len(told) == 8 and all(0 < p <= 0.02 for _, p in told)
        # a final answer is final: no retry, whatever the budget
        with pytest.raises(NotFound):
            lp.request(_Calls.get_job("nope"), retry_for_s=30, on_retry=lambda w, p: 1 / 0)
        assert len(calls) == 10

    # the budget bounds the retrying
    def refused(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        raise httpx.ConnectError("Connection refused", request=request)

    calls.clear()
    with Client("http://lp", transport=httpx.MockTransport(refused), **options) as lp:
        started = time.monotonic()
        with pytest.raises(TransportError):
            lp.request(call, retry_for_s=0.3)
    assert 0.3 <= time.monotonic() - started < 2 and len(calls) > 3


def test_wait_for_rides_out_an_outage_until_its_deadline() -> None:
    """A launcher waiting for placement lost its queued job to a 6-15 s restart: the
    long-poll's TransportError ended the wait. Riding out, the wait retries until its
    deadline and only then raises WaitTimeout (so the launcher cancels the job)."""
    calls: list[float] = []

    def outage(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if 2 <= len(calls) <= 6 or len(calls) > 8:
            raise httpx.ConnectError("Connection refused", request=request)
        state = "placed" if len(calls) == 8 else "queued"
        job = {"job_id": "j", "state": state, "parallelism": {"dp": 1, "pp": 1, "ep": 1}}
        return httpx.Response(200, json=job)

    options = {"retries": 2, "backoff_s": 0.01, "max_backoff_s": 0.02}
    told: list[str] = []
    with Client("http://lp", transport=httpx.MockTransport(outage), **options) as lp:
        with pytest.raises(TransportError):
            lp.wait_for("j", timeout_s=30, poll_s=0.01)
        calls.clear()
        job = lp.wait_for(
            "j", timeout_s=30, poll_s=0.01, ride_out=True, on_retry=lambda w, p: told.append(w)
        )
        assert job.state == "placed" and len(calls) == 8 and len(told) == 5
        with pytest.raises(WaitTimeout) as timeout:
            lp.wait_for("j", "completed", timeout_s=0.3, poll_s=0.01, ride_out=True)
        assert "did not answer" in str(timeout.value) and len(calls) > 12


def test_async_503_is_retried() -> None:
    times, sync_transport = _scripted([503, 503, 200])

    class Scripted(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return sync_transport.handle_request(request)

    async def call() -> str:
        async with AsyncClient("http://lp", transport=Scripted(), backoff_s=0.01) as lp:
            return (await lp.get_job("j")).state

    assert asyncio.run(call()) == "placed" and len(times) == 3


def test_phase_reporter_posts_a_training_loops_traffic(live: LiveServer) -> None:
    with Client(live.url) as lp:
        job = lp.submit_job("ddp", dp=4, pp=1)
        servers = [u.server for u in sorted(job.units, key=lambda u: u.dp_rank)]
        with PhaseReporter(
            Client(live.url),
            "ddp",
            flush_s=0.1,
            placement=[
                {"server": u.server, "stage": u.stage, "dp_rank": u.dp_rank, "ep_rank": u.ep_rank}
                for u in job.units
            ],
            server=servers[2],
        ) as reporter:
            assert reporter.dp_ring() == servers and reporter.dp_rings() == [servers]
            reporter.allreduce(1e9, started_at=time.time())
            for _ in range(6):
                reporter.phase(ring_allreduce_demands(reporter.dp_ring(), 2e9))
                reporter.phase({})  # an empty phase is skipped, not sent
        assert (reporter.sent, reporter.dropped) == (7, 0)
        deadline = time.monotonic() + 20
        while lp.prediction("ddp").raw["cycle_count"] == 0:
            assert time.monotonic() < deadline, "the worker never consumed the reports"
            time.sleep(0.2)
    dead = PhaseReporter(Client(f"http://127.0.0.1:{free_port()}", retries=0), "x")
    dead.phase({("a", "b"): 1.0})
    dead.close()  # a telemetry failure never stops training: counted, not raised
    assert (dead.sent, dead.dropped) == (0, 1)


def test_allreduce_reports_every_dp_group_as_one_phase() -> None:
    units = [
        {"server": f"s{stage}{dp}", "stage": stage, "dp_rank": dp, "ep_rank": 0}
        for stage in range(2)
        for dp in (1, 0)
    ]
    posted: list[dict] = []
    posted_at: list[float] = []

    def traffic(request: httpx.Request) -> httpx.Response:
        posted.extend(json.loads(request.content)["reports"])
        posted_at.append(time.monotonic())
        return httpx.Response(202, json={"accepted": 1, "last_seq": len(posted)})

    client = Client("http://lp", transport=httpx.MockTransport(traffic))
    reporter = PhaseReporter(client, "j", flush_s=60, placement=units)
    queued_at = time.monotonic()
    reporter.allreduce(4e9, started_at=12.5)
    assert reporter.dp_rings() == [["s00", "s01"], ["s10", "s11"]]
    deadline = time.monotonic() + 5
    while not posted and time.monotonic() < deadline:
        time.sleep(0.01)
    # posted at once, not at the next flush_s (a second by default, here a minute): the
    # controller rewires for the next phase as it learns of this one
    assert posted and posted_at[0] - queued_at < 2.0
    (report,) = posted
    assert report["job_id"] == "j" and report["phase_started_at"] == 12.5
    # a ring of two moves 2 (n-1)/n = 1 x the buffer each way
    assert sorted((d["src"], d["dst"], d["bytes"]) for d in report["demands"]) == [
        ("s00", "s01", 4e9),
        ("s01", "s00", 4e9),
        ("s10", "s11", 4e9),
        ("s11", "s10", 4e9),
    ]
    reporter.close()


def test_dead_letters_are_typed() -> None:
    from lightpath_client import DeadLetter

    body = {
        "dead_letters": [
            {"ord": 7, "job_id": None, "reason": "too_many_bytes", "report": {"x": 1}, "at": None}
        ],
        "next": 7,
    }
    page = DeadLetterPage.from_dict(body)
    assert page == DeadLetterPage((DeadLetter(7, None, "too_many_bytes", {"x": 1}, None),), 7)


def test_an_answer_that_is_not_the_apis_is_one_clear_error() -> None:
    """`--server` pointed at another web server: a 200 page was a JSONDecodeError
    traceback from every operator command, and a 404 page was printed whole."""
    page = "<html><body>" + "<p>not here</p>" * 200 + "</body></html>"

    def handler(request: httpx.Request) -> httpx.Response:
        status = 404 if "missing" in request.url.path else 200
        return httpx.Response(status, text=page, headers={"content-type": "text/html"})

    transport = httpx.MockTransport(handler)
    with Client("http://lp", transport=transport) as lp:
        with pytest.raises(UnexpectedAnswer, match="not a Lightpath answer"):
            lp.get_job("j")
        with pytest.raises(NotFound) as missing:
            lp.get_job("missing")
    assert len(str(missing.value)) < 260, str(missing.value)


def test_operator_commands_say_what_is_wrong_without_a_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = b"<html>a plain web server</html>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    lightpath = Path(sys.executable).with_name("lightpath")
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        for argv in (["jobs"], ["job", "j"], ["cluster"], ["decisions"]):
            done = subprocess.run(
                [str(lightpath), *argv, "--server", url],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=tmp_path,
            )
            assert done.returncode == 1, (argv, done.stderr)
            assert "Traceback" not in done.stderr and "not a Lightpath answer" in done.stderr
        # a password in the URL is not printed back
        closed = f"http://ops:hunter2@127.0.0.1:{free_port()}"
        done = subprocess.run(
            [str(lightpath), "jobs", "--server", closed],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.returncode == 1 and "hunter2" not in done.stderr, done.stderr
        assert "ops:***@" in done.stderr
    finally:
        httpd.shutdown()


def test_the_heartbeats_long_poll_never_holds_a_renewal_back() -> None:
    """A review: the long-poll for the job's end ran between renewals and was retried on
    503 with its whole timeout each time, so three 503s near the end of a poll moved the
    renewal due at 1 s to 3.7 s, past a 3 s lease. Polls run beside the renewals now,
    each failure a short pause, and a poll that hangs holds nothing back."""
    from lightpath_client.launch import Heartbeat

    started = time.monotonic()
    renewals: list[float] = []
    polls = [0]
    job = {"job_id": "j", "state": "placed"}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            polls[0] += 1
            if polls[0] <= 3:  # the database blips
                return httpx.Response(503, headers={"Retry-After": "0"}, json={"title": "busy"})
            time.sleep(5.0)  # then a poll that hangs
            return httpx.Response(200, json=job)
        renewals.append(time.monotonic() - started)
        return httpx.Response(200, json=job)

    client = Client("http://lightpath.test", transport=httpx.MockTransport(handler))
    beat = Heartbeat(client, "j", 1.0)
    beat.start()
    time.sleep(3.4)
    beat.stop.set()
    assert len(renewals) >= 4, renewals  # the first at once, then every second
    assert all(abs(at - k) < 0.3 for k, at in enumerate(renewals[:4])), renewals
    assert polls[0] == 4 and beat.ended is None  # 1 s pauses after each 503
