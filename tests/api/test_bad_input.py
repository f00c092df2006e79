"""Bad input: always a 4xx problem+json, never a 500, never a half-written job."""

from __future__ import annotations

import json

import pytest

from app.settings import Settings
from tests.support import LiveServer

GOOD = {"job_id": "ok", "parallelism": {"dp": 2, "pp": 2, "ep": 1}}


def _with(**changes: object) -> dict[str, object]:
    body = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        target = body
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return body


CASES = [
    ("zero degree", _with(parallelism__dp=0), 422, "body.parallelism.dp"),
    ("negative degree", _with(parallelism__pp=-1), 422, "body.parallelism.pp"),
    ("string degree", _with(parallelism__dp="8"), 422, "body.parallelism.dp"),
    ("float degree", _with(parallelism__dp=2.5), 422, "body.parallelism.dp"),
    ("bool degree", _with(parallelism__ep=True), 422, "body.parallelism.ep"),
    ("typo field", {**GOOD, "paralelism": {"dp": 1, "pp": 1}}, 422, "body.paralelism"),
    ("nested typo", _with(parallelism__tp=8), 422, "body.parallelism.tp"),
    ("missing parallelism", {"job_id": "ok"}, 422, "body.parallelism"),
    ("bad collective", {**GOOD, "collective": "allgather"}, 422, "body.collective"),
    ("bad job id", {**GOOD, "job_id": "has space"}, 422, "body.job_id"),
    ("empty job id", {**GOOD, "job_id": ""}, 422, "body.job_id"),
    ("negative bytes", {**GOOD, "model": {"parameters": -5}}, 422, "body.model.parameters"),
    ("not an object", [1, 2], 422, "body"),
    ("bool deadline", {**GOOD, "deadline": True}, 422, "body.deadline"),
    ("numeric string deadline", {**GOOD, "deadline": "1893456000"}, 422, "body.deadline"),
    ("bare date deadline", {**GOOD, "deadline": "2030-01-01"}, 422, "body.deadline"),
    ("deadline past year 9999", {**GOOD, "deadline": 1e308}, 422, "body.deadline"),
    ("deadline before 1970", {**GOOD, "deadline": -1e300}, 422, "body.deadline"),
    ("deadline in year 1", {**GOOD, "deadline": "0001-01-01T00:00:00Z"}, 422, "body.deadline"),
    ("deadline at year 10000", {**GOOD, "deadline": 253402300800.0}, 422, "body.deadline"),
    (
        "deadline in 10000 UTC",
        {**GOOD, "deadline": "9999-12-31T23:59:59-05:00"},
        422,
        "body.deadline",
    ),
]


def test_deadlines_late_on_the_last_day_of_9999_are_accepted(server: LiveServer) -> None:
    """The README admits 1970 to 9999; a sweep found the last second's fractions refused
    (the bound was 23:59:59 exactly) and the last microsecond is 10000 as a float."""
    with server.client() as c:
        for n, deadline in enumerate(
            ["9999-12-31T23:59:59.999999Z", 253402300799.5, "9999-12-31T23:59:60Z"]
        ):
            # (23:59:60, a leap second, is RFC 3339 too: it was a parse error)
            job = {**GOOD, "job_id": f"late-{n}", "deadline": deadline}
            r = c.post("/v1/jobs", json=job)
            assert r.status_code in (201, 202), r.text
            assert 253402300799 <= r.json()["deadline"] < 253402300800
            assert c.post("/v1/jobs", json=job).status_code == 200  # idempotent


@pytest.mark.parametrize(("name", "body", "status", "field"), CASES, ids=[c[0] for c in CASES])
def test_invalid_job_bodies_are_refused_with_the_field(
    server: LiveServer, name: str, body: object, status: int, field: str
) -> None:
    with server.client() as c:
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == status, r.text
        assert r.headers["content-type"] == "application/problem+json"
        problem = r.json()
        assert {"type", "title", "status", "detail"} <= problem.keys()
        assert field in [e["field"] for e in problem["errors"]]
        assert c.get("/v1/jobs").json()["jobs"] == []


def test_malformed_json_and_wrong_media_are_4xx(server: LiveServer) -> None:
    with server.client() as c:
        for raw in (b"{bad", b"", b"null", b"\xff\xfe"):
            r = c.post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
            assert 400 <= r.status_code < 500, (raw, r.status_code)
            assert r.headers["content-type"] == "application/problem+json"
        # bytes that are not text, and nesting past the parser: malformed JSON too
        for raw in (b'{"job_id": "\xff\xfe"}', b"[" * 100_000 + b"]" * 100_000):
            r = c.post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400, (raw[:20], r.status_code)
            assert r.json()["type"].endswith("/malformed-json"), r.json()
        # an integer longer than Python's int parser takes says so
        raw = b'{"job_id": "long", "model": {"parameters": ' + b"9" * 5000 + b"}}"
        r = c.post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "4,300 digits" in r.json()["detail"], r.text
        assert c.get("/v1/jobs").json()["jobs"] == []


def test_a_body_not_sent_as_json_is_415_and_json_with_parameters_is_read(
    server: LiveServer,
) -> None:
    raw = json.dumps(GOOD).encode()
    with server.client() as c:
        for kind in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"content-type": kind} if kind else {}
            for path in ("/v1/jobs", "/v1/traffic", "/v1/jobs/ok/fail"):
                r = c.post(path, content=raw, headers=headers)
                assert r.status_code == 415, (kind, path, r.text)
                assert r.headers["content-type"] == "application/problem+json"
                assert "application/json" in r.json()["detail"]
        assert c.get("/v1/jobs").json()["jobs"] == []
        # a body is read as sent: one labelled with a content coding is refused, not taken
        # as if the label were absent (a sweep's plain body labelled gzip was a 201)
        for coding in ("gzip", "br"):
            headers = {"content-type": "application/json", "content-encoding": coding}
            r = c.post("/v1/jobs", content=raw, headers=headers)
            assert r.status_code == 415 and coding in r.json()["detail"], r.text
        assert c.get("/v1/jobs").json()["jobs"] == []
        # a bodiless POST needs no type; a JSON type with parameters is JSON
        assert c.post("/v1/jobs/ok/heartbeat").status_code == 404
        r = c.post(
            "/v1/jobs", content=raw, headers={"content-type": "application/json; charset=utf-8"}
        )
        assert r.status_code in (201, 202), r.text


def test_complete_and_heartbeat_take_no_body_or_an_empty_object(server: LiveServer) -> None:
    """They used to ignore whatever was sent: junk and unknown fields answered 200."""
    job = {"job_id": "beat", "parallelism": {"dp": 1, "pp": 1}, "lease_s": 60}
    json_type = {"content-type": "application/json"}
    with server.client() as c:
        assert c.post("/v1/jobs", json=job).status_code in (201, 202)
        for verb in ("heartbeat", "complete"):
            path = f"/v1/jobs/beat/{verb}"
            r = c.post(path, content=b"junk", headers=json_type)
            assert r.status_code == 400 and r.json()["type"].endswith("/malformed-json"), r.text
            r = c.post(path, json={"x": 1})
            assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.x", r.text
            assert c.get("/v1/jobs/beat").json()["state"] == "placed"
        assert c.post("/v1/jobs/beat/heartbeat", json={}).status_code == 200
        assert c.post("/v1/jobs/beat/heartbeat").status_code == 200
        assert c.post("/v1/jobs/beat/complete", json={}).status_code == 200
        assert c.post("/v1/jobs/beat/complete").json()["state"] == "completed"


def test_delete_takes_no_body_or_an_empty_object(server: LiveServer) -> None:
    """DELETE cancelled the job whatever body came with it (a sweep: `this is not json`
    and unknown fields answered 200, cancelled), where complete and heartbeat refuse."""
    json_type = {"content-type": "application/json"}
    with server.client() as c:
        for job_id in ("del-a", "del-b"):
            job = {"job_id": job_id, "parallelism": {"dp": 1, "pp": 1}}
            assert c.post("/v1/jobs", json=job).status_code in (201, 202)
        r = c.request("DELETE", "/v1/jobs/del-a", content=b"junk", headers=json_type)
        assert r.status_code == 400 and r.json()["type"].endswith("/malformed-json"), r.text
        r = c.request("DELETE", "/v1/jobs/del-a", json={"unexpected": 1})
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.unexpected"
        # a body not declared JSON is a 415, as for the other calls (it was a 422)
        r = c.request(
            "DELETE", "/v1/jobs/del-a", content=b"{}", headers={"content-type": "text/plain"}
        )
        assert r.status_code == 415, r.text
        assert c.get("/v1/jobs/del-a").json()["state"] == "placed"
        assert c.request("DELETE", "/v1/jobs/del-a", json={}).json()["state"] == "cancelled"
        assert c.delete("/v1/jobs/del-b").json()["state"] == "cancelled"


def test_nan_in_numbers_is_refused(server: LiveServer) -> None:
    raw = b'{"job_id": "n", "parallelism": {"dp": 1, "pp": 1}, "model": {"parameters": NaN}}'
    with server.client() as c:
        r = c.post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500
        assert c.get("/v1/jobs").json()["jobs"] == []


def test_oversized_body_is_413(settings: Settings) -> None:
    live = LiveServer(settings.model_copy(update={"max_body_bytes": 10_000}))
    live.start()
    try:
        with live.client() as c:
            padding = "x" * 20_000
            r = c.post("/v1/jobs", json={**GOOD, "pad": padding})
            assert r.status_code == 413
            assert r.headers["content-type"] == "application/problem+json"

            def chunks():  # no content-length: the limit applies to the stream too
                for _ in range(30):
                    yield b" " * 1000

            r = c.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
            assert r.status_code == 413
            assert c.get("/v1/jobs").json()["jobs"] == []
    finally:
        live.stop()


def test_bad_query_parameters_are_422(server: LiveServer) -> None:
    with server.client() as c:
        for path, params in [
            ("/v1/jobs", {"state": "running"}),
            ("/v1/jobs", {"limit": 0}),
            ("/v1/decisions", {"after": -1}),
            ("/v1/decisions", {"limit": "many"}),
        ]:
            r = c.get(path, params=params)
            assert r.status_code == 422, (path, params)
            assert r.headers["content-type"] == "application/problem+json"
        c.post("/v1/jobs", json=GOOD)
        r = c.get("/v1/jobs/ok", params={"wait_for": "placed", "timeout_s": "nan"})
        assert r.status_code == 422
        r = c.get("/v1/jobs/ok", params={"wait_for": "exploded"})
        assert r.status_code == 422


def test_a_fail_reason_with_a_nul_is_422_on_every_database(server: LiveServer) -> None:
    # PostgreSQL text cannot hold NUL: stored as given it was a 500 there (and kept on SQLite)
    with server.client() as c:
        assert c.post("/v1/jobs", json=GOOD).status_code == 201
        r = c.post("/v1/jobs/ok/fail", json={"exit_code": 1, "reason": "oom\u0000"})
        assert r.status_code == 422, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert "body.reason" in [e["field"] for e in r.json()["errors"]]
        assert c.get("/v1/jobs/ok").json()["state"] == "placed"
        r = c.post("/v1/jobs/ok/fail", json={"exit_code": 1, "reason": "oom \u00fc\U0001f4a5"})
        assert r.status_code == 200, r.text
        assert r.json()["end_reason"] == "oom \u00fc\U0001f4a5"


def test_unknown_route_and_method_are_problems(server: LiveServer) -> None:
    with server.client() as c:
        r = c.get("/v1/nothing")
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/problem+json"
        r = c.delete("/v1/jobs")
        assert r.status_code == 405
        assert r.headers["content-type"] == "application/problem+json"
        # Allow names every method of the path, not only its first route's (RFC 9110)
        assert r.headers["allow"] == "GET, HEAD, POST"
        assert c.put("/v1/jobs/x").headers["allow"] == "DELETE, GET, HEAD"
        assert c.get("/v1/jobs/x/complete").headers["allow"] == "POST"


def test_head_answers_as_get_without_a_body(server: LiveServer) -> None:
    """HEAD was 405 on every route (RFC 9110: a server that answers GET answers HEAD)."""
    with server.client() as c:
        assert c.post("/v1/jobs", json=GOOD).status_code in (201, 202)
        # placed and planned: the views compared below no longer change under us
        c.get("/v1/jobs/ok", params={"wait_for": "placed", "timeout_s": 10})
        for path in ("/v1/jobs/ok", "/v1/jobs", "/v1/cluster", "/healthz", "/v1/jobs/nope"):
            got = c.get(path)
            while (again := c.get(path)).content != got.content:  # the worker is still at it
                got = again
            head = c.head(path)
            assert head.status_code == got.status_code, (path, head.status_code)
            assert head.content == b"", path
            assert head.headers["content-type"] == got.headers["content-type"], path
            assert head.headers["content-length"] == str(len(got.content)), path
        # a route without GET still says which methods it has
        r = c.head("/v1/jobs/ok/complete")
        assert r.status_code == 405 and r.content == b""
        assert c.get("/v1/jobs/ok").json()["state"] == "placed"


def test_a_trailing_slash_is_a_404_problem_not_a_redirect(server: LiveServer) -> None:
    with server.client() as c:
        assert c.post("/v1/jobs", json=GOOD).status_code in (201, 202)
        for path in ("/v1/jobs/", "/v1/jobs/ok/", "/v1/jobs/%2F", "/v1/cluster/"):
            r = c.get(path, follow_redirects=False)
            assert r.status_code == 404, (path, r.status_code)
            assert r.headers["content-type"] == "application/problem+json"
