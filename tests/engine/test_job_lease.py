"""Heartbeat leases: when a silent launcher's job is failed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.engine.job_lease import JobLease, expired_leases, lease_deadline


def test_silence_from_before_the_scheduler_listened_does_not_count() -> None:
    """Back from a 68 s outage, a job with a 6 s lease was failed at once although its
    launcher had heartbeated until the service went down: it now has 6 s from then."""
    beat = JobLease("l1", lease_s=6.0, placed_at=100.0, heartbeat_at=110.0)
    assert expired_leases([beat], now=178.0) == [beat]  # judged on the clock alone
    assert expired_leases([beat], now=178.0, listening_since=176.0) == []
    assert expired_leases([beat], now=183.0, listening_since=176.0) == [beat]


@given(
    leases=st.lists(
        st.builds(
            JobLease,
            job_id=st.text(min_size=1, max_size=3),
            lease_s=st.floats(0.5, 100),
            placed_at=st.floats(0, 1000),
            heartbeat_at=st.none() | st.floats(0, 1000),
        ),
        max_size=8,
    ),
    now=st.floats(0, 2000),
    since=st.floats(0, 2000),
)
def test_a_lease_expires_only_past_its_deadline_and_a_lease_after_listening(
    leases: list[JobLease], now: float, since: float
) -> None:
    out = expired_leases(leases, now, since)
    for x in out:
        assert lease_deadline(x) < now and since + x.lease_s < now
    for x in leases:
        if x not in out:
            assert lease_deadline(x) >= now or since + x.lease_s >= now
    assert expired_leases(leases, now, since) == expired_leases(leases, now, since)
