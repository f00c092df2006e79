"""The mock switches' control API: a bearer token, and loopback only without one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from app.engine.cluster import preset
from app.southbound.driver import HttpDriver
from app.southbound.errors import SwitchUnauthorized
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


def test_the_driver_names_a_refused_token_as_such() -> None:
    """A 401 from the switches was a `protocol-error` ("a bug on one side"); it is the
    operator's token that is wrong, and no retry helps."""
    app = create_mock_oxc_app(preset("small"), token="t0ken-for-tests")
    with TestClient(app, base_url="http://mock") as c:
        for token in (None, "wrong"):
            driver = HttpDriver("http://mock", transport=c._transport, token=token)
            with pytest.raises(SwitchUnauthorized) as refused:
                driver.list_oxcs()
            assert refused.value.code == "unauthorized" and not refused.value.is_transient
            assert "HTTP 401" in str(refused.value)
        driver = HttpDriver("http://mock", transport=c._transport, token="t0ken-for-tests")
        assert "oxc-0" in driver.list_oxcs()
