"""`lightpath launch` as a real subprocess against a running server (local runner)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.job_body import JOB_ID_PATTERN
from app.settings import Settings
from lightpath_client import Client
from lightpath_client.launch import workdir_name
from tests.support import LiveServer

TRAINER = Path(__file__).with_name("launch_trainer.py")
LIGHTPATH = Path(sys.executable).with_name("lightpath")
SMALL_SERVERS = 32


def small_settings(tmp_path: Path) -> Settings:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'lp.db'}",
        cluster="small",
        admit_wait_s=2.0,
        worker_tick_s=0.2,
    )
    from app.store.migrate import upgrade_to_head

    upgrade_to_head(settings)
    return settings


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(small_settings(tmp_path))
    server.start()
    yield server
    server.stop()


def restart(server: LiveServer, down_s: float) -> LiveServer:
    """The service down for `down_s` (a restart, a redeploy), then back on the same port.

    Longer than the client's ~3-6 s of counted retries, shorter than the launcher's
    budget for its final calls."""
    server.stop()
    time.sleep(down_s)
    again = LiveServer(server.settings, port=server.port)
    again.start()
    return again


def launch_argv(server: LiveServer, job_id: str, out: Path, mode: str, *extra: str) -> list[str]:
    return [
        str(LIGHTPATH),
        "launch",
        "--server",
        server.url,
        "--job-id",
        job_id,
        "--dp",
        "2",
        "--pp",
        "2",
        "--lease-s",
        "2",
        "--grace-s",
        "3",
        "--workdir",
        str(out / "launch"),
        *extra,
        "--",
        sys.executable,
        str(TRAINER),
        str(out),
        mode,
        "2",
        "1",
    ]


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_exit_0_completes_the_job_with_every_rank_placed(live: LiveServer, tmp_path: Path) -> None:
    done = run(launch_argv(live, "ok-1", tmp_path, "ok"), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ok-1 placed on 4 servers" in done.stderr and "ok-1 completed" in done.stderr
    with Client(live.url) as c:
        job = c.get_job("ok-1")
        assert job.state == "completed"
        assert c.cluster().free_servers == SMALL_SERVERS
    ranks = [json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in range(4)]
    # Each rank ran with its own unit's coordinates, in Megatron's node-rank order.
    by_server = {u.server: u for u in job.units}
    for i, env in enumerate(ranks):
        unit = by_server[env["LIGHTPATH_SERVER"]]
        assert (int(env["LIGHTPATH_STAGE"]), int(env["LIGHTPATH_DP_RANK"])) == (
            unit.stage,
            unit.dp_rank,
        )
        assert int(env["NODE_RANK"]) == i == unit.dp_rank + 2 * unit.stage
        assert env["NNODES"] == "4" and env["MASTER_ADDR"] == "127.0.0.1"
        assert env["LIGHTPATH_JOB_ID"] == "ok-1"
    assert len({env["LIGHTPATH_SERVER"] for env in ranks}) == 4
    hosts = Path(ranks[0]["LIGHTPATH_HOSTFILE"]).read_text().splitlines()
    assert hosts == [f"{env['LIGHTPATH_SERVER']} slots=8" for env in ranks]


def test_a_failing_rank_fails_the_job_with_its_exit_code(live: LiveServer, tmp_path: Path) -> None:
    done = run(launch_argv(live, "bad-1", tmp_path, "fail"), tmp_path)
    assert done.returncode == 3, done.stderr
    with Client(live.url) as c:
        job = c.get_job("bad-1")
        assert (job.state, job.exit_code) == ("failed", 3)
        assert job.end_reason == "rank 1 exited 3"
        assert c.cluster().free_servers == SMALL_SERVERS
    # The other ranks were stopped rather than left running.
    assert {p.name for p in tmp_path.glob("term-*")} == {"term-0", "term-2", "term-3"}


def test_a_rank_killed_by_a_signal_fails_the_job_with_128_plus_it(
    live: LiveServer, tmp_path: Path
) -> None:
    """A SIGKILLed (OOM-killed) rank: the job recorded exit_code -9 while the launcher
    exited 137; both now say 137, as a shell, Slurm and Kubernetes do."""
    done = run(launch_argv(live, "k9-1", tmp_path, "kill"), tmp_path)
    assert done.returncode == 137, done.stderr
    assert "k9-1 failed: rank 1 killed by SIGKILL" in done.stderr
    with Client(live.url) as c:
        job = c.get_job("k9-1")
        assert (job.state, job.exit_code) == ("failed", 137)
        assert job.end_reason == "rank 1 killed by SIGKILL"
        assert c.cluster().free_servers == SMALL_SERVERS
    assert {p.name for p in tmp_path.glob("term-*")} == {"term-0", "term-2", "term-3"}


@pytest.mark.parametrize(
    ("program", "code", "why"),
    [("missing", 127, "No such file or directory"), ("not-executable", 126, "Permission denied")],
)
def test_a_command_that_cannot_start_fails_the_job(
    live: LiveServer, tmp_path: Path, program: str, code: int, why: str
) -> None:
    """It was a FileNotFoundError traceback, and the job kept its servers until its
    lease ran out; now the shell's 127 (not found) or 126 (not executable)."""
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    argv = launch_argv(live, "nocmd-1", tmp_path, "ok")
    argv[argv.index("--") + 1 :] = [str(tmp_path / program), "--lr", "1e-4"]
    done = run(argv, tmp_path)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    error = f"error: cannot run {tmp_path / program}: {why} (job nocmd-1 failed, exit {code})"
    assert done.stderr.splitlines()[-1] == error
    with Client(live.url) as c:
        job = c.get_job("nocmd-1")
        assert (job.state, job.exit_code) == ("failed", code)
        assert job.end_reason == f"cannot run {tmp_path / program}: {why}"
        assert c.cluster().free_servers == SMALL_SERVERS


def _default_stop_signals() -> None:
    """In the launcher's child: the stop signals at their defaults and unblocked,
    whatever the test runner inherited (under `nohup`, or a shell's `&`, SIGHUP or
    SIGINT are ignored, and a launcher started ignoring one keeps ignoring it)."""
    stop = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for s in stop:
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)


def _started(
    live: LiveServer, tmp_path: Path, job_id: str, ignored: Any = None, blocked: Any = None
) -> subprocess.Popen[str]:
    """A launcher whose four ranks are running; `ignored`: a signal it starts ignoring,
    `blocked`: one it starts with blocked."""

    def dispositions() -> None:
        _default_stop_signals()
        if ignored is not None:
            signal.signal(ignored, signal.SIG_IGN)
        if blocked is not None:
            signal.pthread_sigmask(signal.SIG_BLOCK, {blocked})

    proc = subprocess.Popen(
        launch_argv(live, job_id, tmp_path, "wait"),
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=dispositions,
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("rank-*.json"))) < 4:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_cancels_the_job_and_stops_the_ranks(
    live: LiveServer, tmp_path: Path, signum: signal.Signals
) -> None:
    proc = _started(live, tmp_path, "sig-1")
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, stderr
    assert f"sig-1 cancelled ({signum.name})" in stderr
    with Client(live.url) as c:
        assert c.get_job("sig-1").state == "cancelled"
        assert c.cluster().free_servers == SMALL_SERVERS
    assert len(list(tmp_path.glob("term-*"))) == 4


def test_a_hangup_with_the_terminal_gone_still_stops_the_ranks(
    live: LiveServer, tmp_path: Path
) -> None:
    """A closed terminal or dropped ssh session: SIGHUP, and stderr leads nowhere. The
    launcher died of the SIGHUP, leaving its ranks (in sessions of their own) running
    and the job placed until its lease ran out."""
    proc = _started(live, tmp_path, "hup-1")
    assert proc.stderr is not None
    proc.stderr.close()
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=60) == 128 + signal.SIGHUP
    assert len(list(tmp_path.glob("term-*"))) == 4
    with Client(live.url) as c:
        assert c.get_job("hup-1").state == "cancelled"
        assert c.cluster().free_servers == SMALL_SERVERS


def test_a_launcher_started_with_sigint_blocked_still_cancels_on_it(
    live: LiveServer, tmp_path: Path
) -> None:
    """exec keeps the parent's signal mask: a CI harness ran the launcher with SIGINT
    blocked, and the SIGINT it was sent waited forever while the job stayed placed."""
    proc = _started(live, tmp_path, "blk-1", blocked=signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, stderr
    assert len(list(tmp_path.glob("term-*"))) == 4
    with Client(live.url) as c:
        assert c.get_job("blk-1").state == "cancelled"


def test_two_stop_signals_at_once_still_stop_the_ranks(live: LiveServer, tmp_path: Path) -> None:
    """systemd sends SIGTERM and SIGHUP together: the second raised inside the first's
    cleanup, the launcher died with a traceback, no rank was stopped and the job stayed
    placed (a review)."""
    proc = _started(live, tmp_path, "two-1")
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=60)
    # whichever Python ran first (pending signals run lowest number first)
    assert proc.returncode in (128 + signal.SIGTERM, 128 + signal.SIGHUP), stderr
    assert "Traceback" not in stderr
    assert len(list(tmp_path.glob("term-*"))) == 4
    with Client(live.url) as c:
        assert c.get_job("two-1").state == "cancelled"


def test_a_nohup_launcher_survives_the_hangup(live: LiveServer, tmp_path: Path) -> None:
    """`nohup lightpath launch ... &` then logging out: the launcher replaced nohup's
    ignored SIGHUP with its own handler and cancelled the training (a review)."""

    proc = _started(live, tmp_path, "nohup-1", ignored=signal.SIGHUP)
    proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert proc.poll() is None
    with Client(live.url) as c:
        assert c.get_job("nohup-1").state == "placed"
    proc.send_signal(signal.SIGTERM)  # still stoppable
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert len(list(tmp_path.glob("term-*"))) == 4


def test_waits_in_the_queue_with_a_progress_line(live: LiveServer, tmp_path: Path) -> None:
    with Client(live.url) as c:
        assert c.submit_job("blocker", dp=16, pp=2).state == "placed"
        proc = subprocess.Popen(
            launch_argv(live, "q-1", tmp_path, "ok"),
            cwd=tmp_path,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("[lightpath] q-1: queued") and "servers" in line, line
        assert not list(tmp_path.glob("rank-*"))
        c.complete_job("blocker")
        _, rest = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert c.get_job("q-1").state == "completed"


def test_print_runner_writes_command_lines_and_leaves_the_job_placed(
    live: LiveServer, tmp_path: Path
) -> None:
    done = run(launch_argv(live, "pr-1", tmp_path, "ok", "--runner", "print"), tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4
    for i, line in enumerate(lines):
        host, command = line.split("\t")
        assert f"NODE_RANK={i} " in command and "LIGHTPATH_HOSTFILE=" in command
        assert command.startswith("cd ") and str(TRAINER) in command
    with Client(live.url) as c:
        assert c.get_job("pr-1").state == "placed"
    # The printed line is runnable as is: rank 0 through a shell.
    shell = subprocess.run(["sh", "-c", lines[0].split("\t")[1]], timeout=60)
    assert shell.returncode == 0
    assert json.loads((tmp_path / "rank-0.json").read_text())["NODE_RANK"] == "0"


FAKE_SSH = """#!{python}
# Stands in for ssh: records its arguments, then runs the remote command (the last one) here.
import json, os, sys
with open(os.environ["FAKE_SSH_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
os.execvp("sh", ["sh", "-c", sys.argv[-1]])
"""


def test_ssh_runner_runs_each_rank_on_its_host(live: LiveServer, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH.format(python=sys.executable))
    ssh.chmod(0o755)
    log = tmp_path / "ssh.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SSH_LOG": str(log)}
    template = "{srv}.{tor}.{pod}.cluster"
    argv = launch_argv(
        live, "ssh-1", tmp_path, "ok", "--runner", "ssh", "--host-template", template
    )
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    with Client(live.url) as c:
        job = c.get_job("ssh-1")
    assert job.state == "completed"
    by_rank = sorted(job.units, key=lambda u: u.dp_rank + 2 * u.stage)
    expected_hosts = ["{2}.{1}.{0}.cluster".format(*u.server.split("/")) for u in by_rank]
    assert sorted(call[2] for call in calls) == sorted(expected_hosts)
    for call in calls:
        assert call[:2] == ["-o", "BatchMode=yes"] and len(call) == 4
        rank = expected_hosts.index(call[2])
        line = call[3]
        assert line.startswith(f"cd {tmp_path} && env ")
        assert f" NODE_RANK={rank} " in line and f"MASTER_ADDR={expected_hosts[0]} " in line
        assert "MASTER_PORT=29500 " in line and f"LIGHTPATH_URL={live.url} " in line
        assert "TOKEN" not in line  # a token never goes on a command line
    for i, host in enumerate(expected_hosts):
        env_i = json.loads((tmp_path / f"rank-{i}.json").read_text())
        assert env_i["MASTER_ADDR"] == expected_hosts[0] and env_i["NODE_RANK"] == str(i)
        assert Path(env_i["LIGHTPATH_HOSTFILE"]).read_text().splitlines()[i] == f"{host} slots=8"


def test_ssh_runner_reports_a_remote_failure(live: LiveServer, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH.format(python=sys.executable))
    ssh.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_SSH_LOG": str(tmp_path / "ssh.log"),
    }
    argv = launch_argv(live, "ssh-2", tmp_path, "fail", "--runner", "ssh")
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 3, done.stderr
    with Client(live.url) as c:
        job = c.get_job("ssh-2")
        assert (job.state, job.exit_code) == ("failed", 3)
        assert c.cluster().free_servers == SMALL_SERVERS


def test_print_runner_writes_the_hostfile_and_placement(live: LiveServer, tmp_path: Path) -> None:
    argv = launch_argv(
        live, "pr-2", tmp_path, "ok", "--runner", "print", "--host-template", "{srv}-{pod}"
    )
    done = run(argv, tmp_path)
    assert done.returncode == 0, done.stderr
    hostfile = tmp_path / "launch" / "hostfile"
    assert f"hostfile {hostfile}" in done.stderr
    with Client(live.url) as c:
        job = c.get_job("pr-2")
    by_rank = sorted(job.units, key=lambda u: u.dp_rank + 2 * u.stage)
    hosts = ["{2}-{0}".format(*u.server.split("/")) for u in by_rank]
    assert hostfile.read_text().splitlines() == [f"{h} slots=8" for h in hosts]
    assert [line.split("\t")[0] for line in done.stdout.splitlines()] == hosts
    placement = json.loads((tmp_path / "launch" / "placement.json").read_text())
    assert placement["job_id"] == "pr-2"
    assert [(u["node_rank"], u["host"], u["server"]) for u in placement["units"]] == [
        (i, h, u.server) for i, (h, u) in enumerate(zip(hosts, by_rank, strict=True))
    ]


def test_the_hostfile_has_the_clusters_gpus_per_server(tmp_path: Path) -> None:
    """The launcher wrote `slots=8` and LIGHTPATH_GPUS_PER_SERVER=8 whatever the cluster
    said; it now asks `GET /v1/cluster` (once) for `gpus_per_server`."""
    from app.engine.cluster import cluster_to_dict, preset
    from app.store.migrate import upgrade_to_head

    cluster_file = tmp_path / "four-gpus.json"
    cluster_file.write_text(json.dumps({**cluster_to_dict(preset("small")), "gpus_per_server": 4}))
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'lp.db'}",
        cluster=str(cluster_file),
        admit_wait_s=2.0,
        worker_tick_s=0.2,
    )
    upgrade_to_head(settings)
    server = LiveServer(settings)
    server.start()
    try:
        argv = launch_argv(server, "g4-1", tmp_path, "ok", "--runner", "print")
        done = run(argv, tmp_path)
        assert done.returncode == 0, done.stderr
        hosts = (tmp_path / "launch" / "hostfile").read_text().splitlines()
        assert len(hosts) == 4 and all(h.endswith(" slots=4") for h in hosts), hosts
        for line in done.stdout.splitlines():
            assert " LIGHTPATH_GPUS_PER_SERVER=4 " in line
    finally:
        server.stop()


def test_heartbeats_keep_a_job_longer_than_its_lease(live: LiveServer, tmp_path: Path) -> None:
    argv = launch_argv(live, "hb-1", tmp_path, "slow")
    argv[argv.index("--lease-s") + 1] = "1"
    done = run(argv, tmp_path)
    assert done.returncode == 0, done.stderr
    with Client(live.url) as c:
        job = c.get_job("hb-1")
    assert (job.state, job.end_reason) == ("completed", None)
    assert job.completed_at is not None and job.placed_at is not None
    assert (job.completed_at - job.placed_at).total_seconds() > 3


def test_an_operator_cancel_stops_the_ranks(live: LiveServer, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        launch_argv(live, "op-1", tmp_path, "wait"), cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("rank-*.json"))) < 4:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    with Client(live.url) as c:
        assert c.cancel_job("op-1").state == "cancelled"
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert "op-1 was ended by the server: cancelled" in stderr
    assert len(list(tmp_path.glob("term-*"))) == 4  # every rank was stopped
    with Client(live.url) as c:
        assert c.get_job("op-1").state == "cancelled"
        assert c.cluster().free_servers == SMALL_SERVERS


def test_an_operator_cancel_reaches_the_ranks_long_before_the_next_renewal(
    live: LiveServer, tmp_path: Path
) -> None:
    """At the default 60 s lease the launcher renews every 20 s; a cancel reached the
    ranks only then. The heartbeat thread long-polls the job's end between renewals."""
    argv = launch_argv(live, "op-2", tmp_path, "wait")
    argv[argv.index("--lease-s") + 1] = "60"
    proc = subprocess.Popen(argv, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("rank-*.json"))) < 4:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # the heartbeat thread is in its long-poll
    with Client(live.url) as c:
        cancelled_at = time.monotonic()
        assert c.cancel_job("op-2").state == "cancelled"
    _, stderr = proc.communicate(timeout=60)
    stopped_s = time.monotonic() - cancelled_at
    assert proc.returncode == 1, stderr
    assert "op-2 was ended by the server: cancelled" in stderr
    assert len(list(tmp_path.glob("term-*"))) == 4
    assert stopped_s < 8, stopped_s  # renewals are 20 s apart; --grace-s is 3


def test_a_signal_while_queued_cancels_the_queued_job(live: LiveServer, tmp_path: Path) -> None:
    with Client(live.url) as c:
        assert c.submit_job("blocker", dp=16, pp=2).state == "placed"
        proc = subprocess.Popen(
            launch_argv(live, "q-2", tmp_path, "ok"),
            cwd=tmp_path,
            stderr=subprocess.PIPE,
            text=True,
        )
        started = time.monotonic()
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("[lightpath] q-2: queued")
        # the progress line comes at once, not after the first long-poll (10 s) ran out
        assert time.monotonic() - started < 8
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, rest
        assert c.get_job("q-2").state == "cancelled"
        assert not list(tmp_path.glob("rank-*"))  # nothing ran


def test_giving_up_on_placement_cancels_the_queued_job(live: LiveServer, tmp_path: Path) -> None:
    """Nothing would run a job whose launcher stopped waiting: left queued, it would
    hold servers once placed."""
    with Client(live.url) as c:
        assert c.submit_job("blocker-2", dp=16, pp=2).state == "placed"
        argv = launch_argv(live, "gu-1", tmp_path, "ok", "--wait-timeout-s", "1")
        done = run(argv, tmp_path)
        assert done.returncode == 1, done.stderr
        assert "gu-1 cancelled" in done.stderr
        assert c.get_job("gu-1").state == "cancelled"
        c.complete_job("blocker-2")
        assert c.cluster().free_servers == SMALL_SERVERS


def test_print_runner_asks_no_lease_and_passes_the_schedule(
    live: LiveServer, tmp_path: Path
) -> None:
    """Ranks started elsewhere get no heartbeat from here: a default lease would fail
    the job a minute later. A stated lease still holds."""
    argv = launch_argv(live, "pr-3", tmp_path, "ok", "--runner", "print", "--schedule", "1f1b")
    i = argv.index("--lease-s")
    del argv[i : i + 2]
    done = run(argv, tmp_path)
    assert done.returncode == 0, done.stderr
    with Client(live.url) as c:
        job = c.get_job("pr-3")
        assert job.state == "placed" and job.lease_s is None
        assert job.raw["schedule"] == "1f1b"
    stated = launch_argv(live, "pr-4", tmp_path, "ok", "--runner", "print")
    assert run(stated, tmp_path).returncode == 0
    with Client(live.url) as c:
        assert c.get_job("pr-4").lease_s == 2


def test_the_outcome_is_reported_through_a_server_restart(tmp_path: Path) -> None:
    """The ranks exit 0 while the API is down for 8 s: the completion was given up
    after ~3-6 s, the launcher exited 1 and the job later ended `lease_expired`."""
    server = LiveServer(small_settings(tmp_path))
    server.start()
    go = tmp_path / "go"
    argv = launch_argv(server, "out-1", tmp_path, "ok")
    argv[argv.index("--lease-s") + 1] = "30"
    argv[argv.index("--") + 1 :] = ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"]
    proc = subprocess.Popen(argv, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert "out-1 placed on 4 servers" in proc.stderr.readline()
        server.stop()
        go.touch()  # every rank exits 0 while the server is down
        server = restart(server, 8.0)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        assert "POST /v1/jobs/out-1/complete: ConnectError" in stderr and "left)" in stderr
        assert stderr.splitlines()[-1] == "[lightpath] out-1 completed"
        with Client(server.url) as c:
            assert c.get_job("out-1").state == "completed"
            assert c.cluster().free_servers == SMALL_SERVERS
    finally:
        proc.kill()
        server.stop()


def test_waiting_for_placement_rides_out_a_server_restart(tmp_path: Path) -> None:
    """A transport error while waiting in the queue made the launcher exit 1 and left
    its job queued. Now the wait retries until --wait-timeout-s: a launcher with time
    left is placed once the server is back, one whose wait ran out cancels its job."""
    server = LiveServer(small_settings(tmp_path))
    server.start()
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        with Client(server.url) as c:
            assert c.submit_job("blocker", dp=16, pp=2).state == "placed"
        for job_id, extra in (("q-3", ()), ("q-4", ("--wait-timeout-s", "3"))):
            out = tmp_path / job_id
            out.mkdir()
            argv = launch_argv(server, job_id, out, "ok", *extra)
            procs[job_id] = subprocess.Popen(argv, cwd=out, stderr=subprocess.PIPE, text=True)
            stderr = procs[job_id].stderr
            assert stderr is not None
            assert stderr.readline().startswith(f"[lightpath] {job_id}: queued")
        server = restart(server, 8.0)
        _, gave_up = procs["q-4"].communicate(timeout=120)
        assert procs["q-4"].returncode == 1, gave_up
        assert "q-4 cancelled: job q-4 did not reach placed in time" in gave_up
        with Client(server.url) as c:
            assert c.get_job("q-4").state == "cancelled"
            assert c.get_job("q-3").state == "queued"
            c.complete_job("blocker")
            _, placed = procs["q-3"].communicate(timeout=120)
            assert procs["q-3"].returncode == 0, placed
            assert "[lightpath] GET /v1/jobs/q-3: " in placed and "retrying in" in placed
            assert c.get_job("q-3").state == "completed"
            assert c.cluster().free_servers == SMALL_SERVERS
    finally:
        for proc in procs.values():
            proc.kill()
        server.stop()


def test_a_placement_made_while_the_launcher_paused_keeps_its_lease(tmp_path: Path) -> None:
    """After a server restart the queue wait paused up to 5 s between retries; a job
    placed just as the server came back was seen up to 5 s late, and a short lease (it
    runs from placement) had already failed it `lease_expired` (CI, at 2 s). The
    pause is now at most a third of the lease and the first renewal goes at once."""
    server = LiveServer(small_settings(tmp_path))
    server.start()
    proc: subprocess.Popen[str] | None = None
    try:
        with Client(server.url) as c:
            assert c.submit_job("blocker", dp=16, pp=2).state == "placed"
        out = tmp_path / "late"
        out.mkdir()
        argv = launch_argv(server, "late", out, "ok")
        argv[argv.index("--lease-s") + 1] = "1"
        proc = subprocess.Popen(argv, cwd=out, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("[lightpath] late: queued")
        server = restart(server, 9.0)
        with Client(server.url) as c:
            c.complete_job("blocker")  # placed at once, while the launcher may be pausing
            _, said = proc.communicate(timeout=120)
            assert proc.returncode == 0, said
            assert c.get_job("late").state == "completed"
    finally:
        if proc is not None:
            proc.kill()
        server.stop()


@given(st.lists(st.from_regex(JOB_ID_PATTERN, fullmatch=True), min_size=2, max_size=2, unique=True))
def test_every_job_id_has_a_work_directory_of_its_own(ids: list[str]) -> None:
    """`co:1`, `co@1`, `co+1` and `co_1` shared .lightpath/launch/co_1: two launches
    running at once overwrote each other's hostfile and placement.json."""
    a, b = (workdir_name(i) for i in ids)
    assert a != b
    assert "/" not in a and a not in (".", "..")


def test_a_second_launch_of_a_running_job_starts_nothing(live: LiveServer, tmp_path: Path) -> None:
    """Rerunning `launch` while the first still ran got the placed job (idempotency)
    and started a second copy of every rank over the first's hostfile. The work
    directory is relative here: the ranks are given absolute paths."""

    def argv(out: Path, mode: str) -> list[str]:
        args = launch_argv(live, "twice-1", out, mode)
        args[args.index("--workdir") + 1] = "wd"  # relative to the launcher's cwd
        return args

    first = subprocess.Popen(
        argv(tmp_path, "wait"), cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("rank-*.json"))) < 4:
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    env = json.loads((tmp_path / "rank-0.json").read_text())
    assert env["LIGHTPATH_HOSTFILE"] == str(tmp_path / "wd" / "hostfile")
    hostfile = Path(env["LIGHTPATH_HOSTFILE"]).read_text()
    (tmp_path / "elsewhere").mkdir()
    again = run(argv(tmp_path / "elsewhere", "ok"), tmp_path)
    assert again.returncode == 1, again.stderr
    assert "another `lightpath launch` of twice-1 is running" in again.stderr
    assert Path(env["LIGHTPATH_HOSTFILE"]).read_text() == hostfile
    assert not list((tmp_path / "elsewhere").iterdir())  # no rank of the second ran
    with Client(live.url) as c:
        assert c.get_job("twice-1").state == "placed"
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGTERM


@pytest.mark.parametrize(
    "flag",
    [
        ("--lease-s", "nan"),
        ("--walltime-s", "inf"),
        ("--parameters", "inf"),
        ("--microbatch-forward-s", "nan"),
        ("--master-port", "99999"),
        ("--grace-s", "-1"),
        ("--wait-timeout-s", "-1"),
    ],
)
def test_a_flag_value_no_job_could_use_is_a_usage_error(
    tmp_path: Path, flag: tuple[str, str]
) -> None:
    """nan and inf were a traceback (JSON has no such number); port 99999 and a
    negative grace were passed on to the ranks and the signal timer."""
    argv = [str(LIGHTPATH), "launch", "--server", "http://127.0.0.1:9", "--job-id", "f"]
    done = run([*argv, "--dp", "1", "--pp", "1", *flag, "--", "true"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert flag[0] in done.stderr and "Traceback" not in done.stderr
