"""The HTTP driver against the real mock-oxc app served by uvicorn (real sockets)."""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import Callable

import httpx
import pytest

from app.engine.cluster import Cluster
from app.logs import configure_logging
from app.southbound.driver import HttpDriver, SouthboundDriver
from app.southbound.errors import (
    CommandRefused,
    NotConnected,
    PortBusy,
    PortFailed,
    PortOutOfRange,
    RequestIdReused,
    SwitchFault,
    SwitchProtocolError,
    SwitchTimeout,
    SwitchUnreachable,
    TransientError,
    UnknownSwitch,
)
from app.southbound.reconcile import RetryPolicy, reconcile

from .conftest import ServedMockOxc

Serve = Callable[..., ServedMockOxc]


@pytest.fixture
def mock(serve_mock_oxc: Serve, small_cluster: Cluster) -> ServedMockOxc:
    return serve_mock_oxc(small_cluster, reconfig_ms=2.0, fault_rate=0.0, seed=0)


def test_http_driver_is_a_southbound_driver(mock: ServedMockOxc) -> None:
    with HttpDriver(mock.url) as driver:
        assert isinstance(driver, SouthboundDriver)
        assert driver.list_oxcs() == ["oxc-0", "oxc-1"]


def test_apply_then_read_round_trip(mock: ServedMockOxc) -> None:
    with HttpDriver(mock.url) as driver:
        driver.apply("oxc-0", [(17, 0), (1, 18)], [], "r1")
        state = driver.read("oxc-0")
        assert state.oxc_id == "oxc-0" and state.ports == 64
        assert state.cross_connects == {(0, 17), (1, 18)}
        driver.apply("oxc-0", [(0, 1)], [(0, 17), (1, 18)], "r2")
        assert driver.read("oxc-0").cross_connects == {(0, 1)}
        assert driver.read("oxc-1").cross_connects == frozenset()


def test_refusals_arrive_as_typed_errors(mock: ServedMockOxc) -> None:
    with HttpDriver(mock.url) as driver:
        driver.apply("oxc-0", [(0, 1)], [], "r1")
        with pytest.raises(PortBusy) as busy:
            driver.apply("oxc-0", [(1, 2)], [], "r2")
        assert busy.value.ports == (1,) and busy.value.oxc_id == "oxc-0"
        assert isinstance(busy.value.__cause__, httpx.HTTPStatusError)
        with pytest.raises(PortOutOfRange):
            driver.apply("oxc-0", [(2, 64)], [], "r3")
        with pytest.raises(NotConnected):
            driver.apply("oxc-0", [], [(5, 6)], "r4")
        with pytest.raises(CommandRefused):
            driver.apply("oxc-0", [(7, 7)], [], "r5")
        with pytest.raises(UnknownSwitch):
            driver.read("oxc-7")
        assert driver.read("oxc-0").cross_connects == {(0, 1)}


def test_failed_port_over_http(mock: ServedMockOxc) -> None:
    with httpx.Client(base_url=mock.url) as client, HttpDriver(mock.url) as driver:
        assert client.post("/oxcs/oxc-1/ports/9/fail").json()["failed"] is True
        assert driver.read("oxc-1").failed_ports == {9}
        with pytest.raises(PortFailed) as failed:
            driver.apply("oxc-1", [(9, 10)], [], "r1")
        assert failed.value.ports == (9,)
        client.post("/oxcs/oxc-1/ports/9/restore").raise_for_status()
        driver.apply("oxc-1", [(9, 10)], [], "r1")
        assert driver.read("oxc-1").cross_connects == {(9, 10)}


def test_request_id_is_idempotent_over_http(mock: ServedMockOxc) -> None:
    with httpx.Client(base_url=mock.url) as client:
        body = {"request_id": "r1", "connect": [[3, 4]], "disconnect": []}
        first = client.post("/oxcs/oxc-0/apply", json=body).json()
        again = client.post("/oxcs/oxc-0/apply", json=body).json()
        assert (first["replayed"], again["replayed"]) == (False, True)
        metrics = client.get("/metrics").text
        assert 'lightpath_oxc_reconfigurations_total{oxc="oxc-0"} 1.0' in metrics
    with HttpDriver(mock.url) as driver:
        driver.apply("oxc-0", [(3, 4)], [], "r1")  # a retry by id is harmless
        with pytest.raises(RequestIdReused):
            driver.apply("oxc-0", [(5, 6)], [], "r1")


def test_errors_are_problem_json(mock: ServedMockOxc) -> None:
    with httpx.Client(base_url=mock.url) as client:
        bad = client.post("/oxcs/oxc-0/apply", json={"request_id": "", "connect": [[1]]})
        assert bad.status_code == 422
        assert bad.headers["content-type"] == "application/problem+json"
        problem = bad.json()
        assert {"type", "title", "status", "detail", "errors"} <= problem.keys()
        assert {tuple(e["loc"]) for e in problem["errors"]} == {
            ("body", "request_id"),
            ("body", "connect", "0"),
        }
        client.post("/oxcs/oxc-0/apply", json={"request_id": "a", "connect": [[1, 2]]})
        busy = client.post("/oxcs/oxc-0/apply", json={"request_id": "b", "connect": [[2, 3]]})
        assert busy.status_code == 409
        assert busy.json()["type"] == "urn:lightpath:southbound:port-busy"
        assert busy.json()["ports"] == [2]
        missing = client.get("/no/such/route")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/problem+json"
        assert client.get("/healthz").json() == {"status": "ok"}


def test_metrics_count_commands_refusals_and_state(mock: ServedMockOxc) -> None:
    with HttpDriver(mock.url) as driver:
        driver.apply("oxc-0", [(0, 1)], [], "r1")
        with pytest.raises(PortBusy):
            driver.apply("oxc-0", [(0, 2)], [], "r2")
        driver.read("oxc-0")
    with httpx.Client(base_url=mock.url) as client:
        client.post("/oxcs/oxc-0/ports/5/fail")
        text = client.get("/metrics").text
    for line in (
        'lightpath_oxc_commands_total{command="apply",outcome="ok",oxc="oxc-0"} 1.0',
        'lightpath_oxc_commands_total{command="apply",outcome="refused",oxc="oxc-0"} 1.0',
        'lightpath_oxc_commands_total{command="read",outcome="ok",oxc="oxc-0"} 1.0',
        'lightpath_oxc_refusals_total{oxc="oxc-0",reason="port-busy"} 1.0',
        'lightpath_oxc_reconfiguration_seconds_count{oxc="oxc-0"} 1.0',
        'lightpath_oxc_cross_connects{oxc="oxc-0"} 1.0',
        'lightpath_oxc_failed_ports{oxc="oxc-0"} 1.0',
    ):
        assert line in text


def test_injected_faults_are_503_or_504_and_transient(
    serve_mock_oxc: Serve, small_cluster: Cluster
) -> None:
    mock = serve_mock_oxc(small_cluster, reconfig_ms=0.0, fault_rate=1.0, seed=4)
    seen: set[type] = set()
    with HttpDriver(mock.url) as driver:
        for i in range(12):
            with pytest.raises(TransientError) as error:
                driver.apply("oxc-0", [], [], f"r{i}")
            seen.add(type(error.value))
    assert seen == {SwitchFault, SwitchTimeout}


def test_unreachable_switch_is_transient_and_chained() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        with HttpDriver(f"http://127.0.0.1:{port}", timeout_s=1.0) as driver:
            with pytest.raises(SwitchUnreachable) as error:
                driver.read("oxc-0")
    assert isinstance(error.value.__cause__, httpx.ConnectError)


def test_client_timeouts_and_garbage_are_translated_at_the_boundary() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/apply"):
            raise httpx.ReadTimeout("slow switch", request=request)
        if request.url.path == "/oxcs/oxc-0":
            return httpx.Response(200, json={"id": "oxc-0", "ports": "many"})
        return httpx.Response(502, text="bad gateway")

    with HttpDriver("http://switch.test", transport=httpx.MockTransport(handler)) as driver:
        with pytest.raises(SwitchTimeout) as timeout:
            driver.apply("oxc-0", [(0, 1)], [], "r1")
        assert isinstance(timeout.value.__cause__, httpx.ReadTimeout)
        with pytest.raises(SwitchProtocolError):
            driver.read("oxc-0")
        with pytest.raises(SwitchUnreachable):
            driver.read("oxc-1")


def test_reconcile_over_http_with_faults_and_a_failed_port(
    serve_mock_oxc: Serve, small_cluster: Cluster
) -> None:
    mock = serve_mock_oxc(small_cluster, reconfig_ms=1.0, fault_rate=0.1, seed=21)
    mock.switches["oxc-0"].fail_port(20)
    desired = {
        "oxc-0": {(p, p + 16, "job-a") for p in range(8)},  # (4, 20) is on the failed port
        "oxc-1": {(p, p + 48, "job-b") for p in range(8)},
    }
    policy = RetryPolicy(max_attempts=8, base_delay_s=0.001, max_delay_s=0.01)
    rng = random.Random(5)
    with HttpDriver(mock.url) as driver:
        for _ in range(20):
            result = reconcile(driver, desired, policy=policy, rng=rng)
            if result.requeue_after_s is None:
                break
        assert result.requeue_after_s is None and result.errors == ()
        assert [(b.oxc_id, b.a, b.b) for b in result.blocked] == [("oxc-0", 4, 20)]
    for oxc_id, pairs in desired.items():
        held = mock.switches[oxc_id].inspect().cross_connects
        assert held == {(a, b) for a, b, _ in pairs} - {(4, 20)}


def test_a_password_in_the_southbound_url_never_reaches_a_log_line(
    mock: ServedMockOxc, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fault sweep found `LIGHTPATH_SOUTHBOUND_URL=http://user:pw@host` printed in
    full by httpx's INFO line for every request."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    quiet = {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    configure_logging("debug")
    try:
        url = mock.url.replace("http://", "http://ops:hunter2@")
        with HttpDriver(url) as driver:
            assert driver.list_oxcs() == ["oxc-0", "oxc-1"]
        logging.getLogger("httpx").warning("HTTP Request: GET %s/oxcs", url)
        logging.getLogger("lightpath.test").info("switches at %s", url)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        for name, was in quiet.items():
            logging.getLogger(name).setLevel(was)
    err = capsys.readouterr().err
    assert "hunter2" not in err
    assert err.count("ops:***@") == 2, err
