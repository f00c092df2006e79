"""Stands in for a training command under `lightpath launch` (used by tests/test_launch.py).

    python launch_trainer.py OUTDIR MODE DP EP

Checks the environment the launcher gives each rank (exit 97 if wrong), writes
OUTDIR/rank-<NODE_RANK>.json, then by MODE: `ok` exits 0; `fail` makes node rank 1
exit 3 while the others wait to be stopped (`kill`: rank 1 SIGKILLs itself, as the OOM
killer would); `slow` exits 0 after 4 s; `wait` waits for a signal. On SIGTERM a
rank writes OUTDIR/term-<NODE_RANK> and exits 143.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

REQUIRED = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NNODES",
    "NODE_RANK",
    "LIGHTPATH_JOB_ID",
    "LIGHTPATH_STAGE",
    "LIGHTPATH_DP_RANK",
    "LIGHTPATH_EP_RANK",
    "LIGHTPATH_HOSTFILE",
)


def main() -> int:
    out, mode, dp, ep = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    missing = [k for k in REQUIRED if not os.environ.get(k)]
    if missing:
        sys.stderr.write(f"missing {missing}\n")
        return 97
    env = {k: os.environ[k] for k in REQUIRED + ("LIGHTPATH_SERVER", "LIGHTPATH_PLACEMENT")}
    rank = int(env["NODE_RANK"])
    stage, dp_rank, ep_rank = (
        int(env[k]) for k in ("LIGHTPATH_STAGE", "LIGHTPATH_DP_RANK", "LIGHTPATH_EP_RANK")
    )
    hosts = Path(env["LIGHTPATH_HOSTFILE"]).read_text().splitlines()
    if (
        rank != ep_rank + ep * (dp_rank + dp * stage)
        or not 0 <= rank < int(env["NNODES"])
        or len(hosts) != int(env["NNODES"])
        or not 0 < int(env["MASTER_PORT"]) < 65536
    ):
        sys.stderr.write(f"inconsistent environment {env}\n")
        return 97

    def stop(signum: int, _frame: object) -> None:
        (out / f"term-{rank}").write_text(str(signum))
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    (out / f"rank-{rank}.json").write_text(json.dumps(env))
    if mode == "ok":
        return 0
    if mode in ("fail", "kill") and rank == 1:
        # fail once every rank is up (its SIGTERM handler installed), so the test sees
        # each of them stopped rather than some killed while still starting
        deadline = time.monotonic() + 60
        while len(list(out.glob("rank-*.json"))) < int(env["NNODES"]):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return 3
    if mode == "slow":  # outlives the lease several times over: only heartbeats keep the job
        time.sleep(4)
        return 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
