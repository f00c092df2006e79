"""The OpenAPI document as a client generator reads it, and docs that work offline."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from app.api.problems import PROBLEM_JSON
from app.settings import Settings
from tests.support import LiveServer

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

OPERATION_IDS = {
    ("post", "/v1/jobs"): "submitJob",
    ("get", "/v1/jobs"): "listJobs",
    ("get", "/v1/jobs/{job_id}"): "getJob",
    ("delete", "/v1/jobs/{job_id}"): "cancelJob",
    ("post", "/v1/jobs/{job_id}/complete"): "completeJob",
    ("post", "/v1/jobs/{job_id}/fail"): "failJob",
    ("post", "/v1/jobs/{job_id}/heartbeat"): "heartbeatJob",
    ("post", "/v1/traffic"): "reportTraffic",
    ("get", "/v1/traffic/dead-letters"): "listDeadLetters",
    ("get", "/v1/predictions/{job_id}"): "getPrediction",
    ("post", "/v1/advice/batch-size"): "adviseBatchSize",
    ("get", "/v1/cluster"): "getCluster",
    ("get", "/v1/topology"): "getTopology",
    ("get", "/v1/decisions"): "listDecisions",
    ("get", "/healthz"): "getHealth",
    ("get", "/readyz"): "getReadiness",
    ("get", "/metrics"): "getMetrics",
}


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield method, path, op


@pytest.fixture
def doc(server: LiveServer) -> dict[str, Any]:
    with server.client() as c:
        answer = c.get("/openapi.json")
    assert answer.status_code == 200
    return dict(answer.json())


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1")
    validate(doc)  # raises on any violation of the OpenAPI 3.1 schema


def test_operation_ids_are_stable_and_camel_case(doc: dict[str, Any]) -> None:
    found = {(m, p): op["operationId"] for m, p, op in operations(doc)}
    assert found == OPERATION_IDS
    assert all(re.fullmatch(r"[a-z]+(?:[A-Z][a-z]+)*", i) for i in found.values())


def test_every_error_is_problem_json_and_every_success_has_a_schema(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "Problem" in schemas
    for method, path, op in operations(doc):
        for status, response in op["responses"].items():
            content = response.get("content", {})
            if int(status) >= 400:
                assert list(content) == [PROBLEM_JSON], (method, path, status)
            else:
                assert content, (method, path, status)
                assert all("schema" in media for media in content.values()), (method, path)
        statuses = set(op["responses"])
        if "requestBody" in op:
            assert {"400", "413", "422"} <= statuses, (method, path)
        if op.get("parameters"):
            assert "422" in statuses, (method, path)
        if "{job_id}" in path:
            assert "404" in statuses, (method, path)
        if path.startswith("/v1/") and path != "/v1/advice/batch-size":
            assert "Retry-After" in op["responses"]["503"]["headers"], (method, path)
    jobs = doc["paths"]["/v1/jobs/{job_id}"]
    assert {"403", "404", "409"} <= set(jobs["delete"]["responses"])
    assert {"403", "409"} <= set(doc["paths"]["/v1/jobs"]["post"]["responses"])
    assert "503" in doc["paths"]["/readyz"]["get"]["responses"]
    # response models everywhere, including the three that had none
    for path in ("/v1/cluster", "/v1/topology", "/readyz"):
        media = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        assert media["schema"]["$ref"].startswith("#/components/schemas/"), path


def test_bearer_security_on_every_v1_route_and_none_on_probes(doc: dict[str, Any]) -> None:
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    for method, path, op in operations(doc):
        if path.startswith("/v1/"):
            (requirement,) = op["security"]
            assert list(requirement) == ["bearerAuth"], (method, path)
            assert "401" in op["responses"], (method, path)
            assert "Token scope:" in op["description"], (method, path)
        else:
            assert "security" not in op, (method, path)
    assert doc["paths"]["/v1/jobs"]["post"]["security"] == [{"bearerAuth": ["launcher"]}]
    assert doc["paths"]["/v1/traffic"]["post"]["security"] == [{"bearerAuth": ["telemetry"]}]


def test_location_is_documented_on_201_and_202(doc: dict[str, Any]) -> None:
    submit = doc["paths"]["/v1/jobs"]["post"]["responses"]
    for status in ("201", "202"):
        assert "Location" in submit[status]["headers"], status


def test_every_request_body_has_an_example_the_server_accepts(
    doc: dict[str, Any], server: LiveServer
) -> None:
    with server.client() as c:
        with_bodies = [(m, p, op) for m, p, op in operations(doc) if "requestBody" in op]
        assert len(with_bodies) == 7  # DELETE /v1/jobs/{job_id} takes none or {} too
        # the job first; each route on a job of its own (complete and fail end it)
        with_bodies.sort(key=lambda item: item[1] != "/v1/jobs")
        for method, path, op in with_bodies:
            example = op["requestBody"]["content"]["application/json"]["example"]
            url = path
            if "{job_id}" in path:
                job_id = f"example-{method}-" + path.rsplit("/", 1)[-1].strip("{}")
                one = {"job_id": job_id, "parallelism": {"dp": 1, "pp": 1}, "lease_s": 60}
                placed = c.post("/v1/jobs", json=one)
                assert placed.status_code == 201, placed.text
                url = path.replace("{job_id}", job_id)
            answer = c.request(method, url, json=example)
            assert answer.status_code < 300, (path, answer.text)
            if path == "/v1/jobs":  # the example takes every server of `small`
                assert c.delete(f"/v1/jobs/{example['job_id']}").status_code == 200


def test_paginated_endpoints_share_one_cursor_rule(server: LiveServer) -> None:
    with server.client() as c:
        for i in range(4):
            c.post("/v1/jobs", json={"job_id": f"p{i}", "parallelism": {"dp": 1, "pp": 1}})
        for path, key, field in (("/v1/jobs", "jobs", None), ("/v1/decisions", "decisions", "seq")):
            seen: list[Any] = []
            after = 0
            while True:
                page = c.get(path, params={"after": after, "limit": 2}).json()
                seen.extend(item[field] if field else item["job_id"] for item in page[key])
                if not page[key] or page["next"] is None or page["next"] == after:
                    break
                after = page["next"]  # the same rule on both
            assert len(seen) == len(set(seen)) >= 4, path
        assert seen == sorted(seen) and seen[0] == 1  # decisions: gap-free from 1, none skipped
        assert seen == list(range(1, len(seen) + 1))


def test_docs_work_offline(server: LiveServer) -> None:
    with server.client() as c:
        for page in ("/docs", "/redoc"):
            html = c.get(page)
            assert html.status_code == 200
            assert not re.findall(r"""(?:src|href)=["']?(?:https?:)?//""", html.text), page
            assets = re.findall(r"""(?:src|href)=["']?(/docs/assets/[^"' >]+)""", html.text)
            assert assets, page
            for asset in assets:
                got = c.get(asset)
                assert got.status_code == 200 and len(got.content) > 1000, asset
        assert "persistAuthorization" in c.get("/docs").text


def test_readyz_answers_a_503_problem_when_a_dependency_is_down(settings: Settings) -> None:
    live = LiveServer(settings)
    live.start()
    try:
        assert live.runtime is not None

        def down() -> None:
            raise ConnectionError("refused")

        live.runtime.services.bus.ping = down
        with live.client() as c:
            answer = c.get("/readyz")
        assert answer.status_code == 503
        assert answer.headers["content-type"] == PROBLEM_JSON
        body = answer.json()
        assert (
            body["checks"]["bus"].startswith("unreachable") and body["checks"]["database"] == "ok"
        )
        assert body["status"] == 503 and "bus" in body["detail"]
    finally:
        live.stop()


def test_readyz_refuses_a_database_at_another_schema_revision(settings: Settings) -> None:
    """`lightpath api` on a database nobody migrated answered every call with a 503
    while /readyz said the database was ok (a contract sweep)."""
    from sqlalchemy import text

    live = LiveServer(settings)
    live.start()
    try:
        assert live.runtime is not None
        engine = live.runtime.services.store.write_engine
        with live.client() as c:
            assert c.get("/readyz").json()["checks"]["database"] == "ok"
            for stale in ("reliability_fencing", None):
                with engine.begin() as conn:
                    conn.execute(text("DELETE FROM alembic_version"))
                    if stale is not None:
                        conn.execute(text("INSERT INTO alembic_version VALUES (:v)"), {"v": stale})
                answer = c.get("/readyz")
                assert answer.status_code == 503, answer.text
                said = answer.json()["checks"]["database"]
                assert "run `lightpath migrate`" in said, said
                assert (stale or "not migrated") in said, said
    finally:
        live.stop()


def _conforms(doc: dict[str, Any], method: str, path: str, answer: Any) -> None:
    """`answer` matches the schema the document gives for its status and media type."""
    op = doc["paths"][path][method]
    documented = op["responses"].get(str(answer.status_code))
    assert documented is not None, f"{method} {path} answered undocumented {answer.status_code}"
    media = answer.headers["content-type"].split(";")[0]
    assert media in documented["content"], (method, path, answer.status_code, media)
    schema = {**documented["content"][media]["schema"], "components": doc["components"]}
    OAS31Validator(schema).validate(answer.json())
    undocumented = list(_undocumented(doc, documented["content"][media]["schema"], answer.json()))
    assert not undocumented, (method, path, "served but not in the document", undocumented)


def _undocumented(doc: dict[str, Any], schema: dict[str, Any], value: Any, at: str = "") -> Any:
    """Keys of `value` its schema does not name (the schema validator lets any extra key
    through): `/v1/topology` served `stale` and `unreachable_since` the document lacked."""
    while "$ref" in schema or "anyOf" in schema:  # a reference, or nullable: the object
        if "$ref" in schema:
            schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        else:
            options = [o for o in schema["anyOf"] if o.get("type") != "null"]
            if len(options) != 1:
                return  # a union: which branch a value took is not decided here
            schema = options[0]
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _undocumented(doc, schema["items"], item, f"{at}[{i}]")
    elif isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        for key, item in value.items():
            if key not in props and not schema.get("additionalProperties"):
                yield f"{at}.{key}"
            elif key in props:
                yield from _undocumented(doc, props[key], item, f"{at}.{key}")


def test_answers_match_their_documented_schemas(doc: dict[str, Any], server: LiveServer) -> None:
    """What a generated client would parse: every answer of a full session, errors included."""
    job = "/v1/jobs/{job_id}"
    with server.client() as c:

        def call(method: str, path: str, url: str | None = None, **kw: Any) -> Any:
            answer = c.request(method, url or path, **kw)
            _conforms(doc, method, path, answer)
            return answer

        body = {"job_id": "s-1", "parallelism": {"dp": 16, "pp": 2}, "lease_s": 30}
        assert call("post", "/v1/jobs", json=body).status_code == 201
        assert call("post", "/v1/jobs", json=body).status_code == 200
        assert call("post", "/v1/jobs", json={**body, "priority": 5}).status_code == 409
        queued = {"job_id": "s-2", "parallelism": {"dp": 2, "pp": 1}}
        assert call("post", "/v1/jobs", json=queued).status_code == 202
        malformed = {"content": b"{", "headers": {"content-type": "application/json"}}
        assert call("post", "/v1/jobs", **malformed).status_code == 400
        assert call("post", "/v1/jobs", json={"job_id": "a/b"}).status_code == 422
        assert call("get", "/v1/jobs", params={"limit": 1}).json()["next"] is not None
        # two jobs, a page of two: that page is the last, so no `next` (it was the
        # second job's order, and the page after it was empty)
        assert call("get", "/v1/jobs", params={"limit": 2}).json()["next"] is None
        assert call("get", "/v1/jobs", params={"state": "nope"}).status_code == 422
        call("get", job, "/v1/jobs/s-1")
        call("get", job, "/v1/jobs/s-2", params={"wait_for": "placed", "timeout_s": 0.2})
        assert call("get", job, "/v1/jobs/nope").status_code == 404
        call("post", job + "/heartbeat", "/v1/jobs/s-1/heartbeat")
        assert call("post", job + "/complete", "/v1/jobs/s-2/complete").status_code == 409
        call("delete", job, "/v1/jobs/s-2")
        traffic = {
            "reports": [
                {
                    "job_id": "s-1",
                    "phase_started_at": 1.0,
                    "demands": [
                        {"src": "pod-0/tor-0/srv-0", "dst": "pod-1/tor-0/srv-0", "bytes": 1}
                    ],
                }
            ]
        }
        assert call("post", "/v1/traffic", json=traffic).status_code == 202
        call("get", "/v1/predictions/{job_id}", "/v1/predictions/s-1")
        call("post", "/v1/jobs/{job_id}/fail", "/v1/jobs/s-1/fail", json={"exit_code": 1})
        advice = {"model": {"parameters": 1e9}, "parallelism": {"dp": 1}, "gpu_memory_bytes": 8e10}
        call("post", "/v1/advice/batch-size", json=advice)
        for path in (
            "/v1/cluster",
            "/v1/topology",
            "/v1/decisions",
            "/v1/traffic/dead-letters",
            "/healthz",
            "/readyz",
        ):
            assert call("get", path).status_code == 200, path


def _properties(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The properties of an object schema, through $ref, anyOf (nullable) and array items."""
    if "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    for option in schema.get("anyOf", ()):
        if option.get("type") != "null":
            return _properties(doc, option)
    if schema.get("type") == "array":
        return _properties(doc, schema["items"])
    return dict(schema.get("properties", {}))


def test_decision_payloads_document_the_fields_the_contract_names(doc: dict[str, Any]) -> None:
    """API.md names the fields of a decision's `oxc` and `routing` objects; the document
    showed both as free-form objects (an untyped dict), so a generated client knew none."""
    decision = doc["components"]["schemas"]["DecisionOut"]["properties"]
    assert {"id", "connect", "disconnect"} <= set(_properties(doc, decision["oxc"]))
    routing = _properties(doc, decision["routing"])
    assert {"phase", "algorithm", "inc", "aggregators", "routes", "layer"} <= set(routing)
    assert {"src", "dst", "path"} <= set(_properties(doc, routing["routes"]))
    assert {"units", "reason"} <= set(_properties(doc, decision["placement"]))
