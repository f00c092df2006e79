"""The command line: offline tools through `python -m app.cli`, operator commands through
the installed `lightpath` against a live server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from app.settings import Settings
from lightpath_client import Client
from tests.support import LiveServer


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_predict_prints_one_line_per_step_and_the_misses() -> None:
    for algorithm in ("seed", "lightpath"):
        result = _run("predict", "--algorithm", algorithm, "P", "D", "P", "D", "P", "D")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 7
        assert lines[0].startswith("1 observed=P installed=-") and lines[0].endswith("miss")
        assert lines[-1].startswith("misses=")
        misses = int(lines[-1].split("=")[1])
        assert misses == sum(1 for line in lines[:-1] if line.endswith(" miss"))
        assert lines[-2].endswith("hit"), "a period of 2 is learned within six steps"


def test_seed_fails_on_a_nested_pattern_where_lightpath_learns() -> None:
    plans = "E A E " * 6
    seed = _run("predict", "--algorithm", "seed", *plans.split())
    light = _run("predict", "--algorithm", "lightpath", *plans.split())
    misses = {
        name: int(r.stdout.strip().splitlines()[-1].split("=")[1])
        for name, r in (("seed", seed), ("lightpath", light))
    }
    assert misses["lightpath"] <= 2 * 3 + 1
    assert misses["lightpath"] < misses["seed"]


def _migrate_with(**env: str) -> subprocess.CompletedProcess[str]:
    """`lightpath migrate` with these settings on top of the environment."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "migrate"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_an_unreachable_database_is_one_error_line_not_a_traceback() -> None:
    # `lightpath migrate` (and serve) printed a 500-line traceback for a database that
    # is down, named wrongly or refuses the user; the password is never printed
    result = _migrate_with(
        LIGHTPATH_DATABASE_URL="postgresql://postgres:pw-not-printed@127.0.0.1:1/nowhere"
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: cannot reach the database: "), result.stderr
    assert len(result.stderr.strip().splitlines()) <= 3, result.stderr
    assert "Traceback" not in result.stderr and "pw-not-printed" not in result.stderr


@pytest.mark.parametrize(
    ("variable", "url", "rule"),
    [
        ("DATABASE_URL", "postgresql://ops:pw-not-printed@db:notaport/x", "port must be"),
        ("DATABASE_URL", "postgresql://ops:pw-not-printed@[::1/x", "malformed IPv6"),
        ("DATABASE_URL", "postgresql://ops:pw-not-printed@db/x?bogus=1", '"bogus"'),
        ("REDIS_URL", "redis://:pw-not-printed@cache:99999/0", "port must be"),
    ],
)
def test_a_malformed_url_setting_names_the_variable_and_the_rule_not_its_value(
    variable: str, url: str, rule: str
) -> None:
    """A fault sweep: a bad port, an unclosed IPv6 bracket or a query parameter libpq
    refuses was a traceback from deep in `migrate` and `api`, after the settings said
    the URL was fine (the promise: the variable and the rule, never the value)."""
    result = _migrate_with(**{f"LIGHTPATH_{variable}": url})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "error: invalid LIGHTPATH_* setting:", result.stderr
    assert lines[1].startswith(f"  LIGHTPATH_{variable}: ") and rule in lines[1], result.stderr
    assert len(lines) == 2 and "pw-not-printed" not in result.stderr


def test_unknown_algorithm_is_refused() -> None:
    result = _run("predict", "--algorithm", "oracle", "P")
    assert result.returncode == 2
    assert "seed" in result.stderr


@pytest.mark.parametrize(
    ("files", "args"),
    [
        # no trace job fits a 32-server cluster in bigspan (1,024 GPUs and up)
        ({}, ["workload", "generate", "--family", "bigspan", "--load", "1", "--jobs", "5",
              "--seed", "1", "--cluster", "small", "--out", "x.jsonl"]),
        ({"bin.csv": b"job_id,arrival_s,duration_s,num_gpus\n\xff\xfe,1,2,3\n"},
         ["workload", "from-trace", "--trace", "bin.csv", "--out", "y.jsonl"]),
        ({"dup.csv": b"job_id,arrival_s,duration_s,num_gpus\na,1,600,8\na,2,600,8\n"},
         ["workload", "from-trace", "--trace", "dup.csv", "--out", "y.jsonl"]),
        ({"nan.csv": b"job_id,arrival_s,duration_s,num_gpus\na,nan,600,8\n"},
         ["workload", "from-trace", "--trace", "nan.csv", "--out", "y.jsonl"]),
        ({"slash.csv": b"job_id,arrival_s,duration_s,num_gpus\na/b,1,600,8\n"},
         ["workload", "from-trace", "--trace", "slash.csv", "--out", "y.jsonl"]),
        ({"afile": b""}, ["simulate", "--cluster", "small", "--workload", "w.jsonl",
                          "--policy", "ideal", "--out", "afile"]),
        ({}, ["simulate", "--cluster", "small", "--workload", "w.jsonl", "--policy", "ideal",
              "--reconfig-ms", "nan"]),
        # past an hour (1e18 ms ran lightpath as if every circuit were already there)
        ({}, ["simulate", "--cluster", "small", "--workload", "w.jsonl", "--policy", "ideal",
              "--reconfig-ms", "1e18"]),
        ({}, ["simulate", "--cluster", "small", "--workload", "w.jsonl",
              "--compare", "ideal,ideal"]),
        ({}, ["simulate", "--cluster", "small", "--workload", "w.jsonl",
              "--compare", "ideal,,ecmp"]),
    ],
)  # fmt: skip
def test_bad_offline_input_is_one_error_line_and_exit_2(
    tmp_path: Path, files: dict[str, bytes], args: list[str]
) -> None:
    line = {"job_id": "w-1", "parallelism": {"dp": 1, "pp": 1}, "arrival_s": 0, "iterations": 2}
    (tmp_path / "w.jsonl").write_text(json.dumps(line) + "\n")
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr, done.stderr


# -- operator commands through the client, against a live server ---------------------------

LIGHTPATH = Path(sys.executable).with_name("lightpath")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    from app.store.migrate import upgrade_to_head

    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'lp.db'}",
        cluster="small",
        admit_wait_s=2.0,
        worker_tick_s=0.2,
        api_tokens=SecretStr("launcher=tok-launch-1,operator=tok-oper-2"),
    )
    upgrade_to_head(settings)
    server = LiveServer(settings)
    server.start()
    yield server
    server.stop()


def lp(server: LiveServer, *args: str, token: str | None = "tok-oper-2") -> tuple[int, str, str]:
    """`lightpath ARGS` with the server from LIGHTPATH_URL and the token from LIGHTPATH_TOKEN."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTPATH_")}
    env["LIGHTPATH_URL"] = server.url
    if token:
        env["LIGHTPATH_TOKEN"] = token
    done = subprocess.run(
        [str(LIGHTPATH), *args], capture_output=True, text=True, timeout=60, env=env
    )
    return done.returncode, done.stdout, done.stderr


def test_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version

    done = subprocess.run([str(LIGHTPATH), "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"lightpath {version('lightpath')}"


def test_operator_commands_show_jobs_cluster_and_cancel(live: LiveServer) -> None:
    with Client(live.url, token="tok-launch-1") as c:
        c.submit_job("train-a", dp=4, pp=2)
        c.submit_job("train-b", dp=16, pp=2)  # 32 servers: waits behind train-a
        c.submit_job("done-c", dp=1, pp=1)
        c.fail_job("done-c", exit_code=137, reason="oom")

    code, out, err = lp(live, "jobs")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["JOB_ID", "STATE", "SERVERS", "DPxPPxEP", "AGE", "NOTE"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["train-a"][1:4] == ["placed", "8", "4x2x1"]
    assert rows["train-b"][1:4] == ["queued", "32", "16x2x1"]
    assert rows["done-c"][1] == "failed" and "exit 137: oom" in lines[3]

    code, out, _ = lp(live, "jobs", "--state", "queued")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["train-b"]
    code, out, _ = lp(live, "jobs", "--json")
    assert [j["job_id"] for j in json.loads(out)] == ["train-a", "train-b", "done-c"]

    code, out, _ = lp(live, "job", "train-a")
    assert code == 0 and "state:       placed" in out and "(8 servers)" in out
    table = out.split("\n\n")[1].splitlines()
    assert table[0].split() == ["NODE_RANK", "SERVER", "STAGE", "DP_RANK", "EP_RANK"]
    ranks = [row.split() for row in table[1:]]
    assert [int(r[0]) for r in ranks] == list(range(8))
    # Megatron's order: dp rank fastest (ep = 1), then stage
    assert [(int(r[2]), int(r[3])) for r in ranks] == [(s, d) for s in range(2) for d in range(4)]

    code, out, _ = lp(live, "cluster")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["POD", "STATE", "TORS", "SERVERS", "USED", "FREE"]
    total = lines[-2].split()
    assert total == ["total", "32", "8", "24"]
    assert sum(int(line.split()[4]) for line in lines[1:-2]) == 8
    assert lines[-1].startswith("jobs: 1 placed, 1 queued")

    code, out, _ = lp(live, "cancel", "train-a")
    assert (code, out.strip()) == (0, "train-a: cancelled")
    with Client(live.url, token="tok-oper-2") as c:
        assert c.wait_for("train-b", "placed", timeout_s=20).state == "placed"
    code, out, err = lp(live, "job", "nope")
    assert code == 1 and out == "" and "404" in err and "nope" in err


def test_server_goes_before_or_after_the_command(live: LiveServer) -> None:
    """`lightpath --server URL jobs` was argparse's "invalid choice" (exit 2): only
    `lightpath jobs --server URL` worked. The command's own flag wins."""
    nowhere = "http://127.0.0.1:1"
    for args in (
        ("--server", live.url, "cluster"),
        ("cluster", "--server", live.url),
        ("--server", nowhere, "cluster", "--server", live.url),
    ):
        code, out, err = lp(live, *args)
        assert code == 0 and out.startswith("POD"), (args, err)
    code, _, err = lp(live, "--server", nowhere, "cluster")
    assert code == 1 and "127.0.0.1:1" in err


def test_commands_need_a_token_when_the_server_has_them(live: LiveServer) -> None:
    code, _, err = lp(live, "cluster", token=None)
    assert code == 1 and "401" in err
    code, _, err = lp(live, "cluster", token="wrong")
    assert code == 1 and "401" in err
    assert "wrong" not in err  # the token is never printed


def test_decisions_and_follow(live: LiveServer) -> None:
    with Client(live.url, token="tok-launch-1") as c:
        c.submit_job("d-1", dp=2, pp=1)
    code, out, err = lp(live, "decisions")
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split() == ["SEQ", "AT", "KIND", "JOB", "REASON", "DETAIL"]
    seqs = [int(line.split()[0]) for line in lines]
    assert seqs == list(range(1, len(seqs) + 1)) and "placement" in out and "d-1" in out
    assert err.strip() == f"next: {seqs[-1]}"
    # --limit: at most that many, and `next` to resume from
    code, out, err = lp(live, "decisions", "--limit", "2", "--after", "1")
    assert [int(line.split()[0]) for line in out.splitlines()[1:]] == [2, 3]
    assert err.strip() == "next: 3"

    env = {**os.environ, "LIGHTPATH_URL": live.url, "LIGHTPATH_TOKEN": "tok-oper-2"}
    follow = subprocess.Popen(
        [str(LIGHTPATH), "decisions", "--follow", "--after", str(seqs[-1])],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        with Client(live.url, token="tok-launch-1") as c:
            c.submit_job("d-2", dp=2, pp=1)
        assert follow.stdout is not None
        assert follow.stdout.readline().split()[0] == "SEQ"
        line = follow.stdout.readline()  # blocks until the new decision is printed
        fields = line.split()
        assert int(fields[0]) == seqs[-1] + 1  # the next one, none skipped
        assert fields[2:4] == ["placement", "d-2"]
        # placed by the pass its AdmitJob woke, or by a tick that saw it queued first
        assert fields[4] in ("arrival", "reconcile")
    finally:
        follow.terminate()
        follow.wait(timeout=10)


def test_following_decisions_rides_out_a_server_restart(tmp_path: Path) -> None:
    """`decisions --follow` exited 1 after ~3-6 s of a server restart; it now retries,
    a line on stderr each time, and goes on with the decisions once the server is back."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'lp.db'}", cluster="small")
    from app.store.migrate import upgrade_to_head

    upgrade_to_head(settings)
    server = LiveServer(settings)
    server.start()
    env = {**os.environ, "LIGHTPATH_URL": server.url}
    follow = subprocess.Popen(
        [str(LIGHTPATH), "decisions", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert follow.stdout is not None and follow.stderr is not None
        assert follow.stdout.readline().split()[0] == "SEQ"
        server.stop()
        time.sleep(8.0)
        assert follow.poll() is None
        server = LiveServer(settings, port=server.port)
        server.start()
        with Client(server.url) as c:
            c.submit_job("after-restart", dp=1, pp=1)
        fields = follow.stdout.readline().split()
        assert fields[2:4] == ["placement", "after-restart"]
        follow.terminate()
        assert "GET /v1/decisions: ConnectError" in follow.stderr.read()
    finally:
        follow.kill()
        follow.wait(timeout=10)
        server.stop()


def test_a_job_id_no_route_can_address_is_an_error_line(live: LiveServer) -> None:
    for bad in ("", ".", "a b", "a/b"):
        for command in ("job", "cancel"):
            code, _, err = lp(live, command, bad)
            assert code == 1 and err.startswith("error: ") and "is not a job id" in err, err
            assert "Traceback" not in err


def test_simulate_admits_with_the_services_memory_settings(tmp_path: Path) -> None:
    """A 175B job that fits 80 GiB only under ZeRO-3: the service admits it when
    LIGHTPATH_DEFAULT_ZERO_STAGE=3, and so must `simulate` (it ignored the setting)."""
    line = {
        "job_id": "z",
        "parallelism": {"dp": 16, "pp": 1},
        "model": {"parameters": 175e9, "bytes_per_parameter": 2},
        "arrival_s": 0.0,
        "iterations": 2,
    }
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps(line) + "\n")
    refused = {}
    for stage in ("1", "3"):
        out = tmp_path / f"out-{stage}"
        env = {**os.environ, "LIGHTPATH_DEFAULT_ZERO_STAGE": stage}
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "simulate", "--cluster", "small", "--workload",
             str(workload), "--policy", "ideal", "--out", str(out)],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        # stderr is not a terminal here: progress comes as plain lines
        assert "ideal: seed 1/1: 1/1 jobs done" in done.stderr
        refused[stage] = json.loads((out / "summary.json").read_text())["jobs_refused"]
    assert refused == {"1": 1, "3": 0}


def test_an_empty_plan_id_is_refused() -> None:
    """`predict ""` printed `observed=`, a step no report can make; a plan named "-"
    read as "nothing installed", and one holding "=" as another field."""
    for plans in ([""], ["P", " "], ["P D"], ["P", "-"], ["a=b"]):
        result = _run("predict", *plans)
        assert result.returncode == 2, plans
        assert "plan id" in result.stderr


def test_a_failure_without_a_reason_shows_its_exit_code_once() -> None:
    """`fail` with only an exit code stores "exit N" as the reason: `lightpath jobs`
    showed `exit -1: exit -1`."""
    from lightpath_client._models import Job
    from lightpath_client.cli import format_jobs

    def failed(code: int, reason: str) -> Job:
        body = {"job_id": "f", "state": "failed", "parallelism": {"dp": 1, "pp": 1}}
        return Job.from_dict({**body, "exit_code": code, "end_reason": reason})

    assert format_jobs([failed(-1, "exit -1")]).splitlines()[1].endswith("exit -1")
    assert "exit -1: exit -1" not in format_jobs([failed(-1, "exit -1")])
    assert format_jobs([failed(137, "oom")]).splitlines()[1].endswith("exit 137: oom")


def test_the_cli_refuses_out_of_range_pages_and_reads_rfc3339_deadlines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A sweep: `decisions --limit -1` printed nothing and exited 0, `--after -5` printed
    the header and then the API's 422, and `launch --deadline` took epoch seconds only
    although the API reads RFC 3339 too."""
    from lightpath_client.cli import _parser

    parser = _parser()
    for argv in (["decisions", "--limit", "-1"], ["decisions", "--limit", "0"],
                 ["decisions", "--after", "-5"]):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 2
        assert "is below" in capsys.readouterr().err
    launch = ["launch", "--job-id", "x", "--dp", "1", "--pp", "1"]
    for given, read in (
        ("2026-12-01T00:00:00Z", "2026-12-01T00:00:00Z"),
        ("1796083200", 1796083200.0),
    ):
        assert parser.parse_args([*launch, "--deadline", given, "--", "true"]).deadline == read
    for bad in ("tomorrow", "nan", "1e400"):
        with pytest.raises(SystemExit):
            parser.parse_args([*launch, "--deadline", bad, "--", "true"])
        assert "--deadline" in capsys.readouterr().err


def test_simulate_prints_user_text_as_written(tmp_path: Path) -> None:
    """A sweep: a job id "[/]" in an error was Rich markup (a MarkupError traceback, exit
    1), a cluster named with "[/]" crashed after the run, one with "$" lost the plots,
    and long errors wrapped at 80 columns."""
    line = {"job_id": "[/]", "parallelism": {"dp": 1, "pp": 1}, "arrival_s": 0, "iterations": 1}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(line) + "\n")
    done = _run("simulate", "--cluster", "small", "--workload", str(bad), "--policy", "ideal")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "[/]" in done.stderr
    error = [x for x in done.stderr.splitlines() if x.startswith("error")]
    assert len(error) == 1 and "job_id" in error[0], done.stderr
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({**line, "job_id": "a"}) + "\n")
    cluster = tmp_path / "c.json"
    spec = {
        "name": "lab [/] rack $^$",
        "pods": [{"id": "p0", "tors": [{"id": "p0/t0", "servers": [{"id": "p0/s0"}]}]}],
    }
    cluster.write_text(json.dumps(spec))
    out = tmp_path / "out"
    done = _run(
        "simulate", "--cluster", str(cluster), "--workload", str(good),
        "--compare", "ideal,lightpath", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "lab [/] rack $^$" in done.stdout
    assert (out / "evaluation.png").stat().st_size > 0


def test_a_worker_on_a_cluster_file_holding_no_placed_job_refuses_to_start(
    tmp_path: Path,
) -> None:
    """An audit restarted a seed-15k worker on the `small` preset: it left every placed
    job out of its plan and disconnected all their circuits on the switches whose ids
    `small` shares (oxc-0, oxc-1: 108 and 106 cross-connects to 0). `worker` and
    `serve` now refuse to start on a cluster file that holds none of two or more placed
    jobs' servers, with an error that says why."""
    from app.engine.cluster import preset
    from app.engine.queue import QueuePolicy
    from app.store.migrate import upgrade_to_head
    from app.wiring import build_store
    from app.worker.scheduler import schedule

    url = f"sqlite:///{tmp_path}/lp.db"
    settings = Settings(database_url=url)
    upgrade_to_head(settings)
    store = build_store(settings)
    for job_id in ("a", "b"):
        body = {"job_id": job_id, "parallelism": {"dp": 64, "pp": 1, "ep": 1}}
        store.submit_job(job_id, body, job_id, servers_needed=64, priority=0, deadline=None)
    schedule(store, preset("seed-15k"), QueuePolicy.FIFO, backfill=True, reason="arrival")
    assert {store.get_job(j).state for j in ("a", "b")} == {"placed"}  # type: ignore[union-attr]
    store.dispose()
    env = {**os.environ, "LIGHTPATH_DATABASE_URL": url, "LIGHTPATH_WORKER_METRICS_PORT": "0"}
    commands = (["worker", "--cluster", "small"], ["serve", "--cluster", "small", "--port", "0"])
    for command in commands:
        result = subprocess.run(
            [sys.executable, "-m", "app.cli", *command],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert result.returncode == 2, result.stderr
        assert "holds none of the 2 placed jobs' servers" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_a_worker_whose_database_never_answers_still_stops_on_sigterm() -> None:
    """A verification pointed the worker at a listener that never answers: the start-up
    cluster check's connection (no connect timeout) kept the process alive 30 s past
    SIGTERM (the tree before it exited 6.4 s after). The check gives up after 5 s on a
    daemon thread, so start-up goes on and SIGTERM stops the worker as before."""
    import signal
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # accepts (the kernel's backlog) and never answers
    port = listener.getsockname()[1]
    env = {
        **os.environ,
        "LIGHTPATH_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/nowhere",
        "LIGHTPATH_WORKER_METRICS_PORT": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--cluster", "small"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        time.sleep(7.0)  # past the check's 5 s
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        listener.close()
