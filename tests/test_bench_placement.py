"""bench/bench_placement.py's oracle: the packing check it rests its claims on is exact."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.bench_placement import fits_in_pods


def _fits_by_search(free_per_pod: list[int], sizes: list[int]) -> bool:
    """Every assignment of pieces to pods, largest piece first (the reference)."""
    if not sizes:
        return True
    first, rest = sizes[0], sizes[1:]
    for i, room in enumerate(free_per_pod):
        if room >= first:
            left = [*free_per_pod[:i], room - first, *free_per_pod[i + 1 :]]
            if _fits_by_search(left, rest):
                return True
    return False


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 20), min_size=1, max_size=4),
    st.lists(st.sampled_from([1, 2, 4, 8, 16]), max_size=7),
)
def test_fits_in_pods_agrees_with_exhaustive_search(free: list[int], sizes: list[int]) -> None:
    assert fits_in_pods(free, sizes) == _fits_by_search(free, sorted(sizes, reverse=True))


def test_fits_in_pods_counts_blocks_not_servers() -> None:
    # 33 free servers, 32 needed in groups of 8: three pods of 11 hold one 8-block each
    assert not fits_in_pods([11, 11, 11], [8, 8, 8, 8])
    assert fits_in_pods([16, 11, 6], [8, 8, 8])
    assert fits_in_pods([11, 11], [8, 4, 4, 2, 2, 1, 1])
