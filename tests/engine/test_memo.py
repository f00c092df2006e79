"""The engine's memos: an identity memo never answers for a different object."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.engine.memo import IdentityMemo, Memo, scratch
from app.engine.traffic import DemandMatrix


def _matrix(x: float) -> DemandMatrix:
    return DemandMatrix(("a", "b"), ((0.0, x), (x, 0.0)))


def test_identity_memo_answers_once_per_object_and_key() -> None:
    memo: IdentityMemo[float] = IdentityMemo(16)
    calls: list[float] = []

    def total(d: DemandMatrix) -> float:
        calls.append(d.total_bytes)
        return d.total_bytes

    one, same_value = _matrix(1.0), _matrix(1.0)
    assert memo.get((one,), lambda: total(one)) == 2.0
    assert memo.get((one,), lambda: total(one)) == 2.0
    assert len(calls) == 1
    # an equal but distinct object is another entry: identity, not value
    memo.get((same_value,), lambda: total(same_value))
    assert len(calls) == 2
    # the value key separates answers for the same object
    assert memo.get((one,), lambda: -1.0, key="other") == -1.0


@given(st.lists(st.floats(min_value=0.0, max_value=1e12), min_size=1, max_size=60))
def test_identity_memo_stays_bounded_and_right(values: list[float]) -> None:
    memo: IdentityMemo[float] = IdentityMemo(8)
    matrices = [_matrix(v) for v in values]
    for d in matrices + matrices:
        assert memo.get((d,), lambda d=d: d.total_bytes) == d.total_bytes
        assert len(memo) <= 8


def test_value_memo_is_dropped_wholesale_when_full() -> None:
    memo: Memo[int] = Memo(3)
    for k in range(3):
        memo.get(k, lambda k=k: k * k)
    assert len(memo) == 3
    assert memo.get(7, lambda: 49) == 49
    assert len(memo) == 1
    assert memo.get(0, lambda: -1) == -1  # forgotten: computed again


def test_a_transient_memo_keeps_nothing_new_from_a_scratch_block() -> None:
    """Placement's candidate layouts are new objects no later call asks about: kept,
    they filled the memos with ~500,000 objects that every full collection walked."""
    kept: IdentityMemo[float] = IdentityMemo(16)
    transient: IdentityMemo[float] = IdentityMemo(16, transient=True)
    by_value: Memo[int] = Memo(16, transient=True)
    known, candidate = _matrix(1.0), _matrix(2.0)
    transient.get((known,), lambda: 1.0)
    calls: list[str] = []
    with scratch():
        for _ in range(2):  # inside the block each answer is computed once
            assert transient.get((candidate,), lambda: calls.append("t") or 4.0) == 4.0
            assert by_value.get("k", lambda: calls.append("v") or 7) == 7
            assert kept.get((candidate,), lambda: calls.append("k") or 4.0) == 4.0
        assert transient.get((known,), lambda: -1.0) == 1.0  # held answers still answer
    assert calls == ["t", "v", "k"]
    assert len(transient) == 1 and len(by_value) == 0  # only what was held before
    assert len(kept) == 1  # a memo not made transient keeps its answers as ever
    assert transient.get((candidate,), lambda: 5.0) == 5.0  # outside: computed, kept
    assert len(transient) == 2


def test_peek_answers_only_what_is_remembered_and_keeps_nothing() -> None:
    memo: IdentityMemo[int] = IdentityMemo(2)
    a, b = DemandMatrix(("p",), ((0.0,),)), DemandMatrix(("p",), ((0.0,),))
    assert memo.peek((a,)) is None and len(memo) == 0  # a miss stores nothing
    memo.get((a,), lambda: 7)
    assert memo.peek((a,)) == 7
    assert memo.peek((b,)) is None  # equal, but not the same object
    assert len(memo) == 1
