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
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class Memo(Generic[V]):
    """Answers of a pure function by a hashable key."""

    __slots__ = ("_answers", "_size")

    def __init__(self, size: int) -> None:
        self._answers: dict[Hashable, V] = {}
        self._size = size

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        """The answer for `key`, computed once."""
        hit = self._answers.get(key, _MISSING)
        if hit is _MISSING:
            hit = compute()
            if len(self._answers) >= self._size:
                self._answers.clear()
            self._answers[key] = hit
        return hit  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._answers)


class IdentityMemo(Generic[V]):
    """Answers of a pure function of immutable objects, by their identity."""

    __slots__ = ("_answers", "_size")

    def __init__(self, size: int) -> None:
        self._answers: dict[tuple[Hashable, ...], tuple[tuple[object, ...], V]] = {}
        self._size = size

    def get(self, objs: tuple[object, ...], compute: Callable[[], V], key: Hashable = None) -> V:
        """The answer for these very objects (and `key`), computed once."""
        k = (*map(id, objs), key)
        hit = self._answers.get(k)
        if hit is not None:
            return hit[1]
        value = compute()
        if len(self._answers) >= self._size:
            self._answers.clear()
        self._answers[k] = (objs, value)
        return value

    def __len__(self) -> int:
        return len(self._answers)


_MISSING = object()

__all__ = ["IdentityMemo", "Memo"]
