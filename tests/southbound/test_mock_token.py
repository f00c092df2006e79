"""The mock switches' control API: a bearer token, and loopback only without one."""

from __future__ import annotations

import os
import subprocess
import sys

from fastapi.testclient import TestClient

from app.engine.cluster import preset
from app.southbound.mock_oxc import create_mock_oxc_app


def test_the_control_api_needs_the_token() -> None:
    app = create_mock_oxc_app(preset("small"), token="t0ken-for-tests")
    with TestClient(app) as c:
        assert c.get("/healthz").status_code == 200
        oxc = "oxc-0"
        denied = c.post(f"/oxcs/{oxc}/ports/1/fail")
        assert denied.status_code == 401
        assert denied.headers["content-type"].startswith("application/problem+json")
        assert c.get("/oxcs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = c.get("/oxcs", headers={"Authorization": "Bearer t0ken-for-tests"})
        assert ok.status_code == 200
        assert oxc in {o["id"] for o in ok.json()["oxcs"]}


def test_binding_all_addresses_without_a_token_is_refused() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LIGHTPATH_SOUTHBOUND_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "mock-oxc", "--host", "0.0.0.0", "--port", "1"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert b"LIGHTPATH_SOUTHBOUND_TOKEN" in done.stderr
