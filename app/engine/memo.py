"""Bounded memos for the engine's pure functions.

The controller re-plans the same few jobs on every arrival and completion (the
ones whose ports changed), and most of what it derives for them (traffic, DP
group shapes, demand matrices, circuit evaluations) is the same as last time.
These memos remember such answers. Both are dropped wholesale when they hold
`size` answers: no eviction bookkeeping on the hot path, and a cold memo only
costs the recomputation.

- `Memo`: keyed by value (the arguments are hashable and cheap to compare).
- `IdentityMemo`: keyed by the identity of immutable arguments (frozen domain
  objects that are expensive to hash, such as a placement of 1,000 servers),
  plus an optional value key. An entry holds its arguments alive, so an id
  cannot be reused by another object while its answer is remembered.

A memo made `transient` keeps no new answers inside `scratch()`: they go to a
scratch space dropped at its end (answers still come from what the memo
holds). Placement weighs several candidate layouts per job, each a new object
no later call asks about again; kept, their shapes and traffic filled the
memos with garbage (500,000 objects after a placement benchmark) that every
full garbage collection then walked (150-700 ms pauses).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

V = TypeVar("V")


# while set (`scratch`): transient memos' new answers, by (memo, key), dropped at its end
_SCRATCH: ContextVar[dict[tuple[int, Hashable], Any] | None] = ContextVar(
    "memo_scratch", default=None
)


@contextmanager
def scratch() -> Iterator[None]:
    """New answers of `transient` memos computed inside are kept only until it ends."""
    token = _SCRATCH.set({})
    try:
        yield
    finally:
        _SCRATCH.reset(token)


class Memo(Generic[V]):
    """Answers of a pure function by a hashable key."""

    __slots__ = ("_answers", "_size", "_transient")

    def __init__(self, size: int, *, transient: bool = False) -> None:
        self._answers: dict[Hashable, V] = {}
        self._size = size
        self._transient = transient

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        """The answer for `key`, computed once."""
        hit = self._answers.get(key, _MISSING)
        if hit is _MISSING:
            space = _SCRATCH.get() if self._transient else None
            if space is not None:
                return _scratch_get(space, (id(self), key), compute)  # type: ignore[no-any-return]
            hit = compute()
            if len(self._answers) >= self._size:
                self._answers.clear()
            self._answers[key] = hit
        return hit  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._answers)


class IdentityMemo(Generic[V]):
    """Answers of a pure function of immutable objects, by their identity."""

    __slots__ = ("_answers", "_size", "_transient")

    def __init__(self, size: int, *, transient: bool = False) -> None:
        self._answers: dict[tuple[Hashable, ...], tuple[tuple[object, ...], V]] = {}
        self._size = size
        self._transient = transient

    def get(self, objs: tuple[object, ...], compute: Callable[[], V], key: Hashable = None) -> V:
        """The answer for these very objects (and `key`), computed once."""
        k = (*map(id, objs), key)
        hit = self._answers.get(k)
        if hit is not None:
            return hit[1]
        space = _SCRATCH.get() if self._transient else None
        if space is not None:  # the entry holds `objs` alive while the scratch lives
            return _scratch_get(space, (id(self), k), lambda: (objs, compute()))[1]  # type: ignore[no-any-return]
        value = compute()
        if len(self._answers) >= self._size:
            self._answers.clear()
        self._answers[k] = (objs, value)
        return value

    def peek(self, objs: tuple[object, ...], key: Hashable = None) -> V | None:
        """The answer remembered for these objects, or None (nothing is computed or kept)."""
        hit = self._answers.get((*map(id, objs), key))
        return None if hit is None else hit[1]

    def __len__(self) -> int:
        return len(self._answers)


_MISSING = object()


def _scratch_get(
    space: dict[tuple[int, Hashable], Any], key: tuple[int, Hashable], compute: Callable[[], Any]
) -> Any:
    got = space.get(key, _MISSING)
    if got is _MISSING:
        got = space[key] = compute()
    return got


__all__ = ["IdentityMemo", "Memo", "scratch"]
