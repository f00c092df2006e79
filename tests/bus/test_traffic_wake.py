"""The worker's wake-up after traffic ingest: paced, newest seq, best effort."""

from __future__ import annotations

import threading
import time

from app.bus.messages import Message, ReportTraffic
from app.bus.traffic_wake import TrafficWake


class _Recorder:
    def __init__(self, fail_first: int = 0) -> None:
        self.sent: list[tuple[float, Message]] = []
        self.fail_first = fail_first
        self.sent_one = threading.Event()

    def __call__(self, message: Message) -> None:
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("bus down")
        self.sent.append((time.monotonic(), message))
        self.sent_one.set()


def test_a_burst_of_commits_wakes_the_worker_once_per_interval_with_the_newest_seq() -> None:
    bus = _Recorder()
    wake = TrafficWake(bus, interval_s=0.2)
    start = time.monotonic()
    wake(1)
    assert bus.sent_one.wait(1), "the first wake-up after a quiet spell goes at once"
    assert bus.sent[0][0] - start < 0.1
    for seq in range(2, 200):
        wake(seq)
    deadline = time.monotonic() + 2
    while len(bus.sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # nothing more is due
    wake.close()
    messages = [m for _, m in bus.sent]
    assert messages == [ReportTraffic(1), ReportTraffic(199)]
    assert bus.sent[1][0] - bus.sent[0][0] >= 0.19, "paced: one per interval"


def test_a_failing_bus_is_not_the_caller_s_problem_and_later_wake_ups_go_out() -> None:
    bus = _Recorder(fail_first=1)
    wake = TrafficWake(bus, interval_s=0.01)
    wake(5)  # lost: the worker's tick reads the reports anyway
    time.sleep(0.1)
    wake(6)
    assert bus.sent_one.wait(1)
    wake.close()
    assert [m for _, m in bus.sent] == [ReportTraffic(6)]


def test_close_sends_what_is_held_and_nothing_twice() -> None:
    bus = _Recorder()
    wake = TrafficWake(bus, interval_s=10)
    wake(1)
    assert bus.sent_one.wait(1)
    wake(2)  # held: the interval has not ended
    wake.close()
    assert [m for _, m in bus.sent] == [ReportTraffic(1), ReportTraffic(2)]


def test_no_thread_until_the_first_commit() -> None:
    wake = TrafficWake(_Recorder(), interval_s=0.01)
    assert wake._thread is None
    wake.close()
