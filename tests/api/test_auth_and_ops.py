"""Scoped bearer tokens, the loopback rule, and the operations endpoints."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest
from pydantic import SecretStr

from app.settings import Settings, parse_tokens
from tests.support import LiveServer, free_port

TOKENS = "launcher=launch-secret-1,telemetry=tele-secret-2,operator=op-secret-3"
# not JSON, malformed, too large: answered 401 or 403 before the body is looked at
UNREADABLE_BODIES = (
    (b"x", "text/plain"),
    (b"{", "application/json"),
    (b"[" * 10_000_000, "application/json"),
)


@pytest.fixture
def secured(settings: Settings):
    live = LiveServer(settings.model_copy(update={"api_tokens": SecretStr(TOKENS)}))
    live.start()
    yield live
    live.stop()


def test_tokens_and_scopes(secured: LiveServer) -> None:
    body = {"job_id": "a", "parallelism": {"dp": 1, "pp": 1}}
    with secured.client() as anon:
        r = anon.post("/v1/jobs", json=body)
        assert r.status_code == 401
        assert r.headers["content-type"] == "application/problem+json"
        assert r.headers["www-authenticate"] == "Bearer"
        assert anon.get("/healthz").status_code == 200
        assert anon.get("/readyz").status_code == 200
        assert anon.get("/metrics").status_code == 200
        # no token: 401 before the body is looked at (not 415, 400 or 413)
        for content, kind in UNREADABLE_BODIES:
            r = anon.post("/v1/jobs", content=content, headers={"content-type": kind})
            assert r.status_code == 401, (kind, r.status_code)
    with secured.client("wrong") as bad:
        assert bad.get("/v1/jobs").status_code == 401
        assert bad.post("/v1/jobs", content=b"{").status_code == 401
    with secured.client("tele-secret-2") as tele:
        r = tele.post("/v1/jobs", json=body)
        assert r.status_code == 403
        assert "launcher" in r.json()["detail"]
        # a token of another scope: 403 before the body is looked at (it was 400 for
        # malformed JSON and 415 for text/plain), on every route that needs a scope
        for content, kind in UNREADABLE_BODIES:
            r = tele.post("/v1/jobs", content=content, headers={"content-type": kind})
            assert r.status_code == 403, (kind, r.status_code)
            assert r.headers["content-type"] == "application/problem+json"
        assert tele.post("/v1/advice/batch-size", content=b"{").status_code == 403
        assert tele.post("/v1/jobs/a/fail", json={"exit_code": 999}).status_code == 403
        # what the scope admits still reaches the route's own checks
        r = tele.post("/v1/traffic", content=b"{", headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert tele.get("/v1/nowhere").status_code == 404
    with secured.client("launch-secret-1") as launcher:
        assert launcher.post("/v1/jobs", json=body).status_code == 201
        assert launcher.get("/v1/decisions").status_code == 200
    with secured.client("op-secret-3") as op:
        assert op.post("/v1/jobs/a/complete").status_code == 200


def test_token_settings_are_validated() -> None:
    assert parse_tokens("launcher=a,operator=b") == {"a": "launcher", "b": "operator"}
    for bad in ("root=abc", "launcher", "launcher=", "launcher=changeme"):
        with pytest.raises(ValueError):
            parse_tokens(bad)


def test_the_spread_limit_setting_reads_a_count_or_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LIGHTPATH_MAX_EXTRA_PODS", raising=False)
    assert Settings().max_extra_pods == 1
    for text, value in (("2", 2), ("0", 0), ("none", None), ("", None), ("None", None)):
        monkeypatch.setenv("LIGHTPATH_MAX_EXTRA_PODS", text)
        assert Settings().max_extra_pods == value
    for bad in ("-1", "many"):
        monkeypatch.setenv("LIGHTPATH_MAX_EXTRA_PODS", bad)
        with pytest.raises(ValueError):
            Settings()


def test_secrets_never_reach_logs(secured: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with secured.client("launch-secret-1") as c:
        c.post("/v1/jobs", json={"job_id": "s", "parallelism": {"dp": 1, "pp": 1}})
        c.get("/v1/jobs/nope")
    assert "launch-secret-1" not in caplog.text
    assert "launch-secret-1" not in repr(secured.settings)


def test_serve_refuses_a_public_address_without_tokens(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "LIGHTPATH_DATABASE_URL": f"sqlite:///{tmp_path}/x.db"},
    )
    assert result.returncode == 2
    assert "refusing to bind 0.0.0.0" in result.stderr


def test_readyz_and_metrics(server: LiveServer) -> None:
    with server.client() as c:
        ready = c.get("/readyz").json()
        # serve drives the switches itself: it checks them too
        assert ready["checks"] == {"database": "ok", "bus": "ok", "southbound": "ok"}
        c.post("/v1/jobs", json={"job_id": "m", "parallelism": {"dp": 1, "pp": 1}})
        text = c.get("/metrics").text
        assert 'lightpath_jobs{state="placed"} 1.0' in text
        assert "lightpath_free_servers 31.0" in text
        # serve's worker is the only one and leads: a "no leader" alert must not fire
        assert "lightpath_worker_is_leader 1.0" in text
        for _ in range(50):  # the worker may still be appending fabric decisions
            last = c.get("/v1/decisions", params={"limit": 1000}).json()["decisions"][-1]["seq"]
            if f"lightpath_decisions {float(last)}" in c.get("/metrics").text:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("lightpath_decisions never matched the decision log")
        assert (
            'lightpath_http_request_duration_seconds_count{method="POST",route="/v1/jobs"' in text
        )


def test_the_api_is_ready_while_the_switch_adapter_is_down(settings: Settings) -> None:
    """The API process does not drive the switches: with LIGHTPATH_SOUTHBOUND_URL
    pointing nowhere it is ready and takes jobs (it answered 503 'southbound
    unreachable' and a Kubernetes readiness probe took every replica out)."""
    dead = f"http://127.0.0.1:{free_port()}"
    live = LiveServer(settings.model_copy(update={"southbound_url": dead}), api_only=True)
    live.start()
    try:
        with live.client() as c:
            ready = c.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert set(ready.json()["checks"]) == {"database", "bus"}
            body = {"job_id": "while-down", "parallelism": {"dp": 1, "pp": 1}}
            assert c.post("/v1/jobs", json=body).status_code in (201, 202)
    finally:
        live.stop()


def test_openapi_documents_every_contract_path(server: LiveServer) -> None:
    with server.client() as c:
        paths = c.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/complete",
        "/v1/cluster",
        "/v1/decisions",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert path in paths


def test_a_cached_job_view_is_served_only_to_callers_the_route_admits(
    secured: LiveServer,
) -> None:
    """A polled job view comes from the read cache ahead of the router: the same bytes as
    the route's, to the same callers, timed under the route's template; a cached view is
    still refused without a token (401) or with another scope's (403)."""
    body = {"job_id": "polled", "parallelism": {"dp": 1, "pp": 1}}
    with secured.client("launch-secret-1") as launcher:
        assert launcher.post("/v1/jobs", json=body).status_code == 201
        assert secured.runtime is not None
        cache = secured.runtime.services.read_cache
        for _ in range(50):  # the route renders and caches it (until the fabric settles)
            first = launcher.get("/v1/jobs/polled")
            if cache.get("polled") == first.content:
                break
            time.sleep(0.1)
        assert cache.get("polled") == first.content
        again = launcher.get("/v1/jobs/polled")  # served from the cache
        assert again.status_code == 200 and again.content == first.content
        assert again.headers["content-type"] == "application/json"
        metrics = launcher.get("/metrics").text
        assert 'route="/v1/jobs/{job_id}"' in metrics and 'route="unmatched"' not in metrics
    with secured.client() as anon:
        assert anon.get("/v1/jobs/polled").status_code == 401
    with secured.client("tele-secret-2") as tele:
        assert tele.get("/v1/jobs/polled").status_code == 403
    with secured.client("op-secret-3") as op:
        assert op.get("/v1/jobs/polled").json()["job_id"] == "polled"
