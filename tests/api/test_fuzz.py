"""Fuzz every operation of the OpenAPI document: no input the schema admits gets a 5xx.

Schemathesis generates requests from the served document (valid and invalid
bodies, parameters and headers) and sends them over real HTTP to the embedded
service; every answer must be below 500, and every error a problem+json body.
Bounded: a fixed number of examples per operation, with and without tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.settings import Settings
from app.store.migrate import upgrade_to_head
from tests.support import LiveServer

EXAMPLES = 25
TOKENS = "launcher=fuzz-launcher,telemetry=fuzz-telemetry,operator=fuzz-operator"
pytestmark = pytest.mark.timeout(600)


def _server(tmp: Path, tokens: str | None) -> LiveServer:
    url = f"sqlite:///{tmp / 'fuzz.db'}"
    upgrade_to_head(Settings(database_url=url))
    settings = Settings(
        database_url=url, cluster="small", admit_wait_s=0.2, worker_tick_s=0.5, api_tokens=tokens
    )
    return LiveServer(settings)


@pytest.fixture(params=["open", "tokens"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LiveServer, bool]]:
    server = _server(tmp_path, TOKENS if request.param == "tokens" else None)
    server.start()
    yield server, request.param == "tokens"
    server.stop()


def test_no_operation_answers_a_server_error(live: tuple[LiveServer, bool]) -> None:
    server, with_tokens = live
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    auth = st.sampled_from(
        [{}, {"Authorization": "Bearer fuzz-operator"}, {"Authorization": "Bearer wrong"}]
        if with_tokens
        else [{}]
    )
    failures: list[str] = []
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:

        @given(case=operation.as_strategy(), headers=auth)
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def run(case: schemathesis.Case, headers: dict[str, str]) -> None:
            response = case.call(base_url=server.url, headers=headers, timeout=30)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} -> {response.status_code}: "
                    f"{case.body!r:.200} {case.query!r:.200} {response.text[:200]}"
                )
            elif response.status_code >= 400:
                kind = response.headers.get("content-type") or [""]
                assert kind[0].startswith("application/problem+json"), (
                    f"{case.method} {case.formatted_path}: {response.status_code} {kind}"
                )

        run()
    assert not failures, "\n".join(failures[:20])
