"""A traffic batch read from its bytes accepts only what FastAPI's way accepts, as the same value.

`read_json_body` answers refusals FastAPI's way (json.loads, then validation), so
the property that matters is the other direction: whatever pydantic's JSON
parser accepts, json.loads plus validation accepts too, with an equal value.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app.api.schemas import TrafficIn

SERVERS = ["pod-0/tor-0/srv-0", "pod-1/tor-0/srv-0", "", "x" * 201, "\u00e9", "a\u0000"]

_odd_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from(["12", "1e3", "-1", "nan", "", "0x10", " 5", "1_000"]),
    st.booleans(),
    st.none(),
)
_fine_numbers = st.one_of(st.floats(min_value=0, max_value=1e20), st.integers(0, 10**12))
# mostly valid values, so that many batches are accepted and compared
numbers = st.one_of(_fine_numbers, _fine_numbers, _fine_numbers, _odd_numbers)
_odd_names = st.one_of(st.text(max_size=5), st.integers(), st.none())
names = st.one_of(st.sampled_from(SERVERS[:2]), st.sampled_from(SERVERS), _odd_names)


@st.composite
def _demand(draw: st.DrawFn) -> Any:
    demand: dict[str, Any] = {"src": draw(names), "dst": draw(names), "bytes": draw(numbers)}
    if draw(st.integers(0, 7)) == 7:
        del demand[draw(st.sampled_from(["src", "dst", "bytes"]))]
    if draw(st.integers(0, 7)) == 7:
        demand["extra"] = 1
    if draw(st.integers(0, 7)) == 7:
        return draw(st.sampled_from([[1, 2], "d", None]))
    return demand


@st.composite
def _report(draw: st.DrawFn) -> Any:
    report: dict[str, Any] = {
        "phase_started_at": draw(numbers),
        "demands": draw(st.lists(_demand(), min_size=draw(st.sampled_from([1, 0])), max_size=3)),
    }
    if draw(st.integers(0, 3)) == 3:
        report["job_id"] = draw(
            st.one_of(st.sampled_from(["gpt-1", "a/b", "", "-x"]), st.none(), st.integers())
        )
    if draw(st.integers(0, 7)) == 7:
        del report["phase_started_at"]
    return report


@st.composite
def _body(draw: st.DrawFn) -> bytes:
    batch: Any = {"reports": draw(st.lists(_report(), min_size=1, max_size=3))}
    if draw(st.integers(0, 7)) == 7:
        batch = draw(st.sampled_from([[], None, "x", {"reports": None}, {"other": 1}]))
    raw = json.dumps(batch, allow_nan=True)
    if draw(st.integers(0, 7)) == 7:
        raw = raw[: draw(st.integers(0, len(raw)))]  # cut short: not JSON any more
    return raw.encode()


@settings(max_examples=1500, deadline=None)
@given(_body())
def test_what_pydantic_reads_from_bytes_json_loads_reads_the_same(body: bytes) -> None:
    try:
        fast = TrafficIn.model_validate_json(body)
    except ValidationError:
        return  # refused: the route answers FastAPI's way, whatever that says
    slow = TrafficIn.model_validate(json.loads(body), from_attributes=True)
    assert fast == slow


def _one(size: Any) -> bytes:
    demand = {"src": SERVERS[0], "dst": SERVERS[1], "bytes": size}
    return json.dumps({"reports": [{"phase_started_at": 1, "demands": [demand]}]}).encode()


def test_the_generator_makes_batches_both_ways_accept() -> None:
    body = _one(12)  # an integer is a number
    assert TrafficIn.model_validate_json(body) == TrafficIn.model_validate(json.loads(body))
    for odd in ("12", True):  # a numeric string or a boolean is not, either way
        for read in (
            TrafficIn.model_validate_json,
            lambda b: TrafficIn.model_validate(json.loads(b)),
        ):
            try:
                read(_one(odd))
            except ValidationError:
                continue
            raise AssertionError(f"bytes {odd!r} was accepted")
