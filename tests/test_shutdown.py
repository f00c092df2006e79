"""SIGTERM with a long-poll open: the server answers it at once and exits promptly.

A `GET /v1/jobs/{id}?wait_for=placed&timeout_s=60` used to hold `lightpath serve`
for its whole 60 s after SIGTERM (uvicorn waits for requests in flight), refusing
connections meanwhile; docker's 10 s and Kubernetes' 30 s grace then SIGKILL it
before the leader lease is released.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.support import free_port


def test_sigterm_answers_open_long_polls_and_exits_promptly(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTPATH_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--cluster", "small"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    answers: list[httpx.Response] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "serve did not start"
            time.sleep(0.2)
        with httpx.Client(base_url=base, timeout=90) as c:
            for name in ("w1", "w2"):  # each takes every server of `small`: w2 waits
                job = {"job_id": name, "parallelism": {"dp": 32, "pp": 1}}
                assert c.post("/v1/jobs", json=job).status_code in (201, 202)
            assert c.get("/v1/jobs/w2").json()["state"] == "queued"

            def poll() -> None:
                answers.append(c.get("/v1/jobs/w2", params={"wait_for": "placed", "timeout_s": 60}))

            waiter = threading.Thread(target=poll)
            waiter.start()
            time.sleep(1.0)  # the long-poll is open
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            took = time.monotonic() - started
            waiter.join(timeout=5)
        assert took < 10, f"SIGTERM took {took:.1f} s"
        assert answers and answers[0].status_code == 200
        assert answers[0].json()["state"] == "queued"  # its state then, at once
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
