"""Sync and async clients of the Lightpath REST API (httpx is the only dependency).

Both clients share one description of every call (`_Calls`), so they differ only
in how they wait: retries with exponential backoff and jitter on connection
errors and 502/503/504 (every Lightpath call is idempotent: jobs by `job_id`,
traffic batches by an `Idempotency-Key` the client sets), a number of times or,
for a call that must get through a server restart, for a time budget; and
long-poll loops that re-ask until the state or the caller's deadline, since a
server-side long-poll may answer early.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from ._exceptions import (
    InvalidJobId,
    ServerError,
    TransportError,
    UnexpectedAnswer,
    WaitTimeout,
    problem_from_response,
)
from ._models import (
    Advice,
    ClusterState,
    DeadLetterPage,
    Decision,
    DecisionPage,
    Job,
    JobPage,
    Prediction,
    TrafficAccepted,
    state_reached,
)

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8080"
RETRY_STATUSES = frozenset({502, 503, 504})
Progress = Callable[[Job, float], None]  # (job, seconds waited so far)
Retrying = Callable[[str, float], None]  # (what failed, seconds until the next attempt)


def _raw(body: Any) -> Any:
    return body


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One HTTP request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] | None = None
    timeout_s: float | None = None


# the API's job id pattern (a leading letter or digit, then letters, digits and ._:@+-)
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,199}")


def job_segment(job_id: str) -> str:
    """The job id as a path segment; InvalidJobId when no route could address it."""
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise InvalidJobId(
            f"{job_id!r} is not a job id: 1-200 characters, a letter or digit first, "
            "then letters, digits and . _ : @ + -"
        )
    return quote(job_id, safe="")


def job_path(job_id: str) -> str:
    return "/v1/jobs/" + job_segment(job_id)


def job_body(
    job_id: str,
    *,
    dp: int,
    pp: int,
    ep: int = 1,
    lease_s: float | None = None,
    walltime_s: float | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A `POST /v1/jobs` body; None-valued optional fields are left out."""
    body: dict[str, Any] = {"job_id": job_id, "parallelism": {"dp": dp, "pp": pp, "ep": ep}}
    extra = {"lease_s": lease_s, "walltime_s": walltime_s, **fields}
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


class _Calls:
    """Every API call, described once for both clients."""

    @staticmethod
    def submit_job(body: dict[str, Any]) -> Call[Job]:
        return Call("POST", "/v1/jobs", Job.from_dict, json=body)

    @staticmethod
    def get_job(job_id: str, wait_for: str | None = None, timeout_s: float = 0.0) -> Call[Job]:
        if wait_for is None:
            return Call("GET", job_path(job_id), Job.from_dict)
        params = {"wait_for": wait_for, "timeout_s": round(max(0.0, min(timeout_s, 300.0)), 3)}
        return Call("GET", job_path(job_id), Job.from_dict, params, timeout_s=timeout_s + 15)

    @staticmethod
    def list_jobs(state: str | None, after: int, limit: int) -> Call[JobPage]:
        params: dict[str, Any] = {"after": after, "limit": limit}
        if state is not None:
            params["state"] = state
        return Call("GET", "/v1/jobs", JobPage.from_dict, params)

    @staticmethod
    def complete_job(job_id: str) -> Call[Job]:
        return Call("POST", job_path(job_id) + "/complete", Job.from_dict)

    @staticmethod
    def cancel_job(job_id: str) -> Call[Job]:
        return Call("DELETE", job_path(job_id), Job.from_dict)

    @staticmethod
    def fail_job(job_id: str, exit_code: int | None, reason: str | None) -> Call[Job]:
        body = {"exit_code": exit_code, "reason": reason}
        return Call("POST", job_path(job_id) + "/fail", Job.from_dict, json=body)

    @staticmethod
    def heartbeat(job_id: str) -> Call[Job]:
        return Call("POST", job_path(job_id) + "/heartbeat", Job.from_dict)

    @staticmethod
    def report_traffic(reports: list[dict[str, Any]], key: str | None) -> Call[TrafficAccepted]:
        headers = {"Idempotency-Key": key or uuid.uuid4().hex}
        return Call(
            "POST",
            "/v1/traffic",
            TrafficAccepted.from_dict,
            json={"reports": reports},
            headers=headers,
        )

    @staticmethod
    def advise_batch_size(body: dict[str, Any]) -> Call[Advice]:
        return Call("POST", "/v1/advice/batch-size", Advice.from_dict, json=body)

    @staticmethod
    def cluster() -> Call[ClusterState]:
        return Call("GET", "/v1/cluster", ClusterState.from_dict)

    @staticmethod
    def topology() -> Call[dict[str, Any]]:
        return Call("GET", "/v1/topology", _raw)

    @staticmethod
    def decisions(after: int, limit: int) -> Call[DecisionPage]:
        return Call(
            "GET", "/v1/decisions", DecisionPage.from_dict, {"after": after, "limit": limit}
        )

    @staticmethod
    def dead_letters(after: int, limit: int) -> Call[DeadLetterPage]:
        params = {"after": after, "limit": limit}
        return Call("GET", "/v1/traffic/dead-letters", DeadLetterPage.from_dict, params)

    @staticmethod
    def prediction(job_id: str) -> Call[Prediction]:
        return Call("GET", "/v1/predictions/" + job_segment(job_id), Prediction.from_dict)


class _Base:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 6,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        poll_s: float = 30.0,
    ) -> None:
        self.url = (url or os.environ.get("LIGHTPATH_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get("LIGHTPATH_TOKEN")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.headers["User-Agent"] = "lightpath-client"
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.poll_s = poll_s

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        """Exponential backoff with full jitter; a numeric Retry-After wins (capped)."""
        if retry_after is not None and retry_after.replace(".", "", 1).isdigit():
            return min(float(retry_after), self.max_backoff_s)
        growth = self.backoff_s * 2.0 ** min(attempt, 60)
        return random.uniform(0.5, 1.0) * min(self.max_backoff_s, growth)

    def _retry_after(
        self, response: httpx.Response | None, attempt: int, deadline: float | None = None
    ) -> float | None:
        """Seconds to wait before retrying, or None when this answer is final.

        Without a `deadline` (monotonic) a failure is retried `retries` times; with
        one, until then. Answers other than 502/503/504 are final either way.
        """
        if response is not None and response.status_code not in RETRY_STATUSES:
            return None
        left = math.inf
        if deadline is None:
            if attempt >= self.retries:
                return None
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
        retry_after = None if response is None else response.headers.get("retry-after")
        return min(self._delay(attempt, retry_after), left)

    @staticmethod
    def _deadline(retry_for_s: float | None) -> float | None:
        return None if retry_for_s is None else time.monotonic() + retry_for_s

    @staticmethod
    def _result(call: Call[T], response: httpx.Response) -> T:
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = None
            raise problem_from_response(response.status_code, body, response.text)
        try:
            return call.parse(response.json())
        except (ValueError, KeyError, TypeError) as exc:
            kind = response.headers.get("content-type", "no content type")
            raise UnexpectedAnswer(
                f"{call.method} {call.path}: {response.status_code} with a body that is not "
                f"a Lightpath answer ({kind}): is the URL a Lightpath server?"
            ) from exc

    def _request_args(self, call: Call[Any]) -> dict[str, Any]:
        args: dict[str, Any] = {"params": call.params, "headers": call.headers}
        if call.json is not None:
            args["json"] = call.json
        if call.timeout_s is not None:
            args["timeout"] = call.timeout_s
        return args


def _unreachable(url: str, call: Call[Any], exc: Exception) -> TransportError:
    return TransportError(
        f"{call.method} {masked_url(url)}{call.path}: {type(exc).__name__}: {exc}"
    )


def masked_url(url: str) -> str:
    """The URL as an error line may print it: a password is `***`."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return url
    if not parsed.password:
        return url
    return str(parsed.copy_with(username=parsed.username, password="***"))


def _failed(call: Call[Any], response: httpx.Response | None, exc: Exception | None) -> str:
    """What an attempt that will be retried met, for `on_retry`."""
    if response is not None:
        return f"{call.method} {call.path}: {response.status_code} {response.reason_phrase}"
    return f"{call.method} {call.path}: {type(exc).__name__}: {exc}"


class Client(_Base):
    """The blocking client. `Client()` reads LIGHTPATH_URL and LIGHTPATH_TOKEN."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, token, **options)
        self.http = httpx.Client(
            base_url=self.url, headers=self.headers, timeout=self.timeout_s, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def request(
        self, call: Call[T], *, retry_for_s: float | None = None, on_retry: Retrying | None = None
    ) -> T:
        """Send `call`, retrying connection errors and 502/503/504 with backoff.

        `retries` times, or with `retry_for_s` for that many seconds (`math.inf`:
        until answered), e.g. through a server restart; other answers are final at
        once. `on_retry(what_failed, pause_s)` is told of every retry.
        """
        deadline = self._deadline(retry_for_s)
        attempt = 0
        while True:
            try:
                response = self.http.request(call.method, call.path, **self._request_args(call))
            except httpx.TransportError as exc:
                pause = self._retry_after(None, attempt, deadline)
                if pause is None:
                    raise _unreachable(self.url, call, exc) from exc
                if on_retry is not None:
                    on_retry(_failed(call, None, exc), pause)
            else:
                pause = self._retry_after(response, attempt, deadline)
                if pause is None:
                    return self._result(call, response)
                if on_retry is not None:
                    on_retry(_failed(call, response, None), pause)
            time.sleep(pause)
            attempt += 1

    def submit_job(self, job_id: str, *, dp: int, pp: int, ep: int = 1, **fields: Any) -> Job:
        """Submit (idempotent by `job_id`); fields as in `POST /v1/jobs` (model, lease_s, ...)."""
        return self.request(_Calls.submit_job(job_body(job_id, dp=dp, pp=pp, ep=ep, **fields)))

    def get_job(self, job_id: str) -> Job:
        return self.request(_Calls.get_job(job_id))

    def list_jobs(self, state: str | None = None, after: int = 0, limit: int = 100) -> JobPage:
        return self.request(_Calls.list_jobs(state, after, limit))

    def iter_jobs(self, state: str | None = None, page_size: int = 500) -> Iterator[Job]:
        after: int | None = 0
        while after is not None:
            page = self.list_jobs(state, after, page_size)
            yield from page.jobs
            after = page.next

    def complete_job(self, job_id: str) -> Job:
        return self.request(_Calls.complete_job(job_id))

    def cancel_job(self, job_id: str) -> Job:
        return self.request(_Calls.cancel_job(job_id))

    def fail_job(self, job_id: str, exit_code: int | None = None, reason: str | None = None) -> Job:
        return self.request(_Calls.fail_job(job_id, exit_code, reason))

    def heartbeat(self, job_id: str) -> Job:
        return self.request(_Calls.heartbeat(job_id))

    def report_traffic(
        self, reports: list[dict[str, Any]], idempotency_key: str | None = None
    ) -> TrafficAccepted:
        return self.request(_Calls.report_traffic(reports, idempotency_key))

    def advise_batch_size(self, body: dict[str, Any]) -> Advice:
        return self.request(_Calls.advise_batch_size(body))

    def cluster(self) -> ClusterState:
        return self.request(_Calls.cluster())

    def topology(self) -> dict[str, Any]:
        return self.request(_Calls.topology())

    def decisions(self, after: int = 0, limit: int = 100) -> DecisionPage:
        return self.request(_Calls.decisions(after, limit))

    def prediction(self, job_id: str) -> Prediction:
        return self.request(_Calls.prediction(job_id))

    def dead_letters(self, after: int = 0, limit: int = 100) -> DeadLetterPage:
        """Traffic reports the worker set aside (scope telemetry); `next` is the next `after`."""
        return self.request(_Calls.dead_letters(after, limit))

    def wait_for(
        self,
        job_id: str,
        state: str = "placed",
        *,
        timeout_s: float | None = None,
        on_progress: Progress | None = None,
        poll_s: float | None = None,
        ride_out: bool = False,
        on_retry: Retrying | None = None,
    ) -> Job:
        """Long-poll until the job reaches `state` (or later); WaitTimeout at the deadline.

        Each long-poll asks the server to hold the call `poll_s` (default the
        client's); `on_progress(job, waited_s)` is called after each early answer.
        `ride_out`: an unreachable server (or 502/503/504) is retried until the
        deadline (forever without one), not `retries` times, then WaitTimeout.
        """
        waiter = _Waiter(job_id, state, timeout_s, poll_s or self.poll_s)
        while True:
            call = waiter.next_call()
            if call is None:
                raise waiter.timeout()
            try:
                job = self.request(
                    call, retry_for_s=waiter.retry_for_s(ride_out), on_retry=on_retry
                )
            except (TransportError, ServerError) as exc:
                timeout = waiter.outage(exc, ride_out)
                if timeout is None:
                    raise
                raise timeout from exc
            if waiter.done(job, on_progress):
                return job
            time.sleep(waiter.pause())

    def follow_decisions(
        self,
        after: int = 0,
        poll_s: float = 1.0,
        *,
        ride_out: bool = False,
        on_retry: Retrying | None = None,
    ) -> Iterator[Decision]:
        """Every decision after `after`, forever (polls when caught up); `ride_out`:
        through any outage too (an unreachable server is retried until it answers)."""
        retry_for_s = math.inf if ride_out else None
        while True:
            call = _Calls.decisions(after, 1000)
            page = self.request(call, retry_for_s=retry_for_s, on_retry=on_retry)
            yield from page.decisions
            after = page.next
            if not page.decisions:
                time.sleep(poll_s)


class AsyncClient(_Base):
    """The asyncio client; the same calls as `Client`, awaited."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, token, **options)
        self.http = httpx.AsyncClient(
            base_url=self.url, headers=self.headers, timeout=self.timeout_s, transport=transport
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(
        self, call: Call[T], *, retry_for_s: float | None = None, on_retry: Retrying | None = None
    ) -> T:
        deadline = self._deadline(retry_for_s)
        attempt = 0
        while True:
            try:
                response = await self.http.request(
                    call.method, call.path, **self._request_args(call)
                )
            except httpx.TransportError as exc:
                pause = self._retry_after(None, attempt, deadline)
                if pause is None:
                    raise _unreachable(self.url, call, exc) from exc
                if on_retry is not None:
                    on_retry(_failed(call, None, exc), pause)
            else:
                pause = self._retry_after(response, attempt, deadline)
                if pause is None:
                    return self._result(call, response)
                if on_retry is not None:
                    on_retry(_failed(call, response, None), pause)
            await asyncio.sleep(pause)
            attempt += 1

    async def submit_job(self, job_id: str, *, dp: int, pp: int, ep: int = 1, **fields: Any) -> Job:
        return await self.request(
            _Calls.submit_job(job_body(job_id, dp=dp, pp=pp, ep=ep, **fields))
        )

    async def get_job(self, job_id: str) -> Job:
        return await self.request(_Calls.get_job(job_id))

    async def list_jobs(
        self, state: str | None = None, after: int = 0, limit: int = 100
    ) -> JobPage:
        return await self.request(_Calls.list_jobs(state, after, limit))

    async def iter_jobs(self, state: str | None = None, page_size: int = 500) -> AsyncIterator[Job]:
        after: int | None = 0
        while after is not None:
            page = await self.list_jobs(state, after, page_size)
            for job in page.jobs:
                yield job
            after = page.next

    async def complete_job(self, job_id: str) -> Job:
        return await self.request(_Calls.complete_job(job_id))

    async def cancel_job(self, job_id: str) -> Job:
        return await self.request(_Calls.cancel_job(job_id))

    async def fail_job(
        self, job_id: str, exit_code: int | None = None, reason: str | None = None
    ) -> Job:
        return await self.request(_Calls.fail_job(job_id, exit_code, reason))

    async def heartbeat(self, job_id: str) -> Job:
        return await self.request(_Calls.heartbeat(job_id))

    async def report_traffic(
        self, reports: list[dict[str, Any]], idempotency_key: str | None = None
    ) -> TrafficAccepted:
        return await self.request(_Calls.report_traffic(reports, idempotency_key))

    async def advise_batch_size(self, body: dict[str, Any]) -> Advice:
        return await self.request(_Calls.advise_batch_size(body))

    async def cluster(self) -> ClusterState:
        return await self.request(_Calls.cluster())

    async def topology(self) -> dict[str, Any]:
        return await self.request(_Calls.topology())

    async def decisions(self, after: int = 0, limit: int = 100) -> DecisionPage:
        return await self.request(_Calls.decisions(after, limit))

    async def prediction(self, job_id: str) -> Prediction:
        return await self.request(_Calls.prediction(job_id))

    async def dead_letters(self, after: int = 0, limit: int = 100) -> DeadLetterPage:
        return await self.request(_Calls.dead_letters(after, limit))

    async def wait_for(
        self,
        job_id: str,
        state: str = "placed",
        *,
        timeout_s: float | None = None,
        on_progress: Progress | None = None,
        poll_s: float | None = None,
        ride_out: bool = False,
        on_retry: Retrying | None = None,
    ) -> Job:
        waiter = _Waiter(job_id, state, timeout_s, poll_s or self.poll_s)
        while True:
            call = waiter.next_call()
            if call is None:
                raise waiter.timeout()
            try:
                job = await self.request(
                    call, retry_for_s=waiter.retry_for_s(ride_out), on_retry=on_retry
                )
            except (TransportError, ServerError) as exc:
                timeout = waiter.outage(exc, ride_out)
                if timeout is None:
                    raise
                raise timeout from exc
            if waiter.done(job, on_progress):
                return job
            await asyncio.sleep(waiter.pause())


class _Waiter:
    """The long-poll loop's bookkeeping, shared by both clients."""

    def __init__(self, job_id: str, state: str, timeout_s: float | None, poll_s: float) -> None:
        if state not in ("placed", "completed", "failed", "cancelled"):
            raise ValueError(f"cannot wait for state {state!r}")
        self.job_id = job_id
        self.state = state
        self.started = time.monotonic()
        self.deadline = None if timeout_s is None else self.started + timeout_s
        self.poll_s = poll_s
        self.last: Job | None = None
        self.asked_at = self.started
        self.asked_for = 0.0

    def next_call(self) -> Call[Job] | None:
        """The next long-poll, or None once the deadline has passed."""
        now = time.monotonic()
        wait = self.poll_s
        if self.deadline is not None:
            if now >= self.deadline and self.last is not None:
                return None
            wait = max(0.0, min(wait, self.deadline - now))
        self.asked_at, self.asked_for = now, wait
        return _Calls.get_job(self.job_id, self.state, wait)

    def done(self, job: Job, on_progress: Progress | None) -> bool:
        self.last = job
        if state_reached(job.state, self.state):
            return True
        if on_progress is not None:
            on_progress(job, time.monotonic() - self.started)
        return False

    def pause(self) -> float:
        """A server that answered a long-poll well before its timeout is not hammered."""
        answered_in = time.monotonic() - self.asked_at
        return 0.2 if answered_in < min(0.2, self.asked_for / 2) else 0.0

    def retry_for_s(self, ride_out: bool) -> float | None:
        """How long a long-poll may retry an unreachable server (None: `retries` times)."""
        if not ride_out:
            return None
        return math.inf if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def outage(self, exc: TransportError | ServerError, ride_out: bool) -> WaitTimeout | None:
        """Riding out, a server unanswered until the deadline is its WaitTimeout (else None)."""
        if not ride_out or (isinstance(exc, ServerError) and exc.status not in RETRY_STATUSES):
            return None
        return self.timeout(f"; the server did not answer: {exc}")

    def timeout(self, why: str = "") -> WaitTimeout:
        state = self.last.state if self.last else "unknown"
        return WaitTimeout(
            f"job {self.job_id} did not reach {self.state} in time (still {state}){why}",
            self.last,
        )
