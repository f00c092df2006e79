"""`lightpath launch`: submit, wait for placement, run the command once per server, report.

Node ranks follow Megatron-LM's default rank order (`tp-cp-ep-dp-pp`: tensor
parallelism fastest, pipeline stage slowest). Lightpath keeps TP (and CP)
inside one server of G GPUs (the cluster's `gpus_per_server`, 8 on the presets), so
the unit (stage, dp_rank, ep_rank) runs as

    NODE_RANK = ep_rank + ep * (dp_rank + dp * stage)

and global rank = NODE_RANK * G + local rank, which is where Megatron-LM
(`--tensor-model-parallel-size G --expert-model-parallel-size E
--pipeline-model-parallel-size P`) puts that unit's ranks.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ._client import Call, Client, _Calls
from ._exceptions import Conflict, LightpathError, WaitTimeout
from ._models import Job, Unit

RUNNERS = ("local", "ssh", "print")
# the job's ending (complete, fail, cancel) is retried through a server restart this
# long, or the job's lease when longer: given up sooner, the launcher would exit 1 and
# a job whose ranks succeeded would end `lease_expired`
FINAL_RETRY_S = 120.0
WATCH_POLL_S = 30.0  # each long-poll for the job's end
WATCH_RETRY_S = 1.0  # pause after a failed one


def node_rank(unit: Unit, dp: int, ep: int) -> int:
    """Megatron-LM's default order: ep fastest, then dp, then pipeline stage."""
    return unit.ep_rank + ep * (unit.dp_rank + dp * unit.stage)


@dataclass(frozen=True, slots=True)
class Rank:
    """One server's share of the job: where it runs and the environment it gets."""

    node_rank: int
    unit: Unit
    host: str
    env: dict[str, str]


def host_of(template: str, server: str) -> str:
    """The host name of a Lightpath server id (`pod-0/tor-1/srv-3`) through `template`."""
    parts = server.split("/")
    fields = {"server": server, "pod": parts[0], "tor": parts[-2] if len(parts) > 1 else ""}
    fields["srv"] = parts[-1]
    return template.format(**fields)


def plan_ranks(
    job: Job,
    *,
    host_template: str,
    master_addr: str | None,
    master_port: int,
    workdir: Path,
    gpus_per_server: int = 8,
    server_url: str | None = None,
) -> list[Rank]:
    """Every rank's environment, in node-rank order; writes the hostfile and placement."""
    units = sorted(job.units, key=lambda u: node_rank(u, job.dp, job.ep))
    hosts = [host_of(host_template, u.server) for u in units]
    workdir.mkdir(parents=True, exist_ok=True)
    hostfile = workdir / "hostfile"
    hostfile.write_text("".join(f"{h} slots={gpus_per_server}\n" for h in hosts))
    placement = workdir / "placement.json"
    placement.write_text(
        json.dumps(
            {
                "job_id": job.job_id,
                "units": [
                    {
                        "node_rank": i,
                        "server": u.server,
                        "host": h,
                        "stage": u.stage,
                        "dp_rank": u.dp_rank,
                        "ep_rank": u.ep_rank,
                    }
                    for i, (u, h) in enumerate(zip(units, hosts, strict=True))
                ],
            },
            indent=1,
        )
    )
    common = {
        "MASTER_ADDR": master_addr or hosts[0],
        "MASTER_PORT": str(master_port),
        "NNODES": str(len(units)),
        "LIGHTPATH_JOB_ID": job.job_id,
        "LIGHTPATH_HOSTFILE": str(hostfile),
        "LIGHTPATH_PLACEMENT": str(placement),
        "LIGHTPATH_GPUS_PER_SERVER": str(gpus_per_server),
    }
    if server_url:  # for the phase reporter; tokens never go on a command line
        common["LIGHTPATH_URL"] = server_url
    return [
        Rank(
            i,
            u,
            h,
            {
                **common,
                "NODE_RANK": str(i),
                "LIGHTPATH_STAGE": str(u.stage),
                "LIGHTPATH_DP_RANK": str(u.dp_rank),
                "LIGHTPATH_EP_RANK": str(u.ep_rank),
                "LIGHTPATH_SERVER": u.server,
            },
        )
        for i, (u, h) in enumerate(zip(units, hosts, strict=True))
    ]


def shell_line(rank: Rank, command: Sequence[str], cwd: str) -> str:
    """One rank as a shell command line (what `ssh` runs and `print` writes)."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(rank.env.items()))
    return f"cd {shlex.quote(cwd)} && env {env} {shlex.join(command)}"


def start_local(rank: Rank, command: Sequence[str], cwd: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(command), env={**os.environ, **rank.env}, cwd=cwd, start_new_session=True
    )


def start_ssh(rank: Rank, command: Sequence[str], cwd: str) -> subprocess.Popen[bytes]:
    argv = ["ssh", "-o", "BatchMode=yes", rank.host, shell_line(rank, command, cwd)]
    return subprocess.Popen(argv, start_new_session=True)


STARTERS: dict[str, Callable[[Rank, Sequence[str], str], subprocess.Popen[bytes]]] = {
    "local": start_local,
    "ssh": start_ssh,
}


# what stops the launcher: Ctrl-C, kill, and a closed terminal or dropped ssh session
# (SIGHUP: the ranks run in sessions of their own, so nothing else would stop them)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stop(Exception):
    """SIGINT, SIGTERM or SIGHUP reached the launcher."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum: int, _frame: object) -> None:
    # the others first: a second signal (systemd sends SIGTERM and SIGHUP together)
    # raised a second Stop inside the first one's cleanup, which then never ran. A
    # handler, not SIG_IGN: CPython raises "ignored due to race condition" for a
    # signal already pending when its handler becomes SIG_IGN
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is _raise_stop:
            signal.signal(s, _stopping)
    raise Stop(signum)


def _stopping(_signum: int, _frame: object) -> None:
    """A stop signal while the launcher already stops: nothing more to do."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Progress:
    """The waiting line: rewritten in place on a terminal, one line per 10 s otherwise."""

    def __init__(self, stream: Any = sys.stderr) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last = 0.0

    def __call__(self, job: Job, waited_s: float) -> None:
        line = f"[lightpath] {job.job_id}: {job.state} {waited_s:.0f}s"
        if job.queue_reason:
            line += f" ({job.queue_reason})"
        if self.tty:
            self.stream.write("\r\033[K" + line)
            self.stream.flush()
        elif time.monotonic() - self.last >= 10:
            self.last = time.monotonic()
            self.stream.write(line + "\n")
            self.stream.flush()

    def done(self, message: str) -> None:
        self.write(f"[lightpath] {message}")

    def retrying(self, what: str, pause_s: float, left_s: float | None = None) -> None:
        """One line per retry of a call the server did not answer."""
        line = f"[lightpath] {what}; retrying in {pause_s:.1f}s"
        self.write(line + (f" ({max(0.0, left_s):.0f}s left)" if left_s is not None else ""))

    def write(self, line: str) -> None:
        """One whole line, replacing the waiting line on a terminal."""
        try:
            self.stream.write(("\r\033[K" if self.tty else "") + line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # the terminal is gone (SIGHUP): stopping the ranks matters more


class Heartbeat(threading.Thread):
    """Renews the job's lease; notices when the server ended the job.

    Beside the renewals a second thread long-polls the job (`wait_for=completed`,
    which any ended state answers), so an operator's cancel or a lease expiry reaches
    the ranks within a round trip rather than at the next renewal (every lease / 3:
    20 s at the default lease); a poll that hangs or fails never holds a renewal
    back. A renewal answered 409 (the job ended) says the same.
    """

    def __init__(self, client: Client, job_id: str, every_s: float) -> None:
        super().__init__(name="lightpath-heartbeat", daemon=True)
        self.client = client
        self.job_id = job_id
        self.every_s = every_s
        self.stop = threading.Event()
        self.ended: Job | None = None

    def run(self) -> None:
        threading.Thread(target=self._watch, name="lightpath-job-watch", daemon=True).start()
        # the first renewal at once: the lease ran from placement, and the wait may have
        # seen the placement late (a retry pause, a slow machine)
        while not self.stop.is_set():
            try:
                self.client.heartbeat(self.job_id)
            except Conflict as exc:
                job = exc.body.get("job")
                self._ended(Job.from_dict(job) if isinstance(job, dict) else None)
                return
            except LightpathError as exc:
                print(f"[lightpath] heartbeat failed: {exc}", file=sys.stderr)
            self.stop.wait(self.every_s)

    def _watch(self) -> None:
        """Long-poll the job's end until it comes or `stop` (a pause after a failure)."""
        while not self.stop.is_set():
            try:
                job = self.client.request(
                    _Calls.get_job(self.job_id, "completed", WATCH_POLL_S), retry_for_s=0.0
                )
            except LightpathError:
                # unreachable or refused: the renewals report it; poll again shortly
                self.stop.wait(WATCH_RETRY_S)
                continue
            if job.ended:
                self._ended(job)
                return

    def _ended(self, job: Job | None) -> None:
        if not self.stop.is_set():  # an end the launcher made itself is not news
            self.ended = job
            self.stop.set()


def _terminate(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM every rank's process group, then SIGKILL what is left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)
    for p in procs:
        p.wait()


def supervise(
    procs: Sequence[subprocess.Popen[bytes]], heartbeat: Heartbeat | None, grace_s: float
) -> tuple[int, int | None]:
    """Wait for the ranks: (exit status, index of the first failing rank or None).

    The first rank to exit non-zero stops the others; so does the server ending
    the job (operator cancel, lease expiry), reported as status 1.
    """
    while True:
        codes = [p.poll() for p in procs]
        failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
        if failed is not None:
            _terminate(procs, grace_s)
            return int(codes[failed]), failed  # type: ignore[arg-type]
        if all(c == 0 for c in codes):
            return 0, None
        if heartbeat is not None and heartbeat.ended is not None:
            _terminate(procs, grace_s)
            return 1, None
        time.sleep(0.05)


def launch(
    client: Client,
    body: Mapping[str, Any],
    command: Sequence[str],
    *,
    runner: str = "local",
    host_template: str = "{server}",
    master_port: int | None = None,
    workdir: Path | None = None,
    wait_timeout_s: float | None = None,
    grace_s: float = 10.0,
    heartbeat_s: float | None = None,
    out: Any = sys.stdout,
) -> int:
    """The whole `lightpath launch`; returns the launcher's exit status."""
    job_id = str(body["job_id"])
    progress = Progress()
    lease_s = float(body.get("lease_s") or 0.0)
    final_s = max(lease_s, FINAL_RETRY_S)
    if lease_s:
        # the lease runs from placement: a wait pausing longer between retries (up to
        # 5 s after a server restart) would see the placement after a short lease ran out
        client.max_backoff_s = min(client.max_backoff_s, max(0.5, lease_s / 3))

    def final(call: Call[Job]) -> Job:
        """The job's ending, retried through a server restart for `final_s`."""
        until = time.monotonic() + final_s
        return client.request(
            call,
            retry_for_s=final_s,
            on_retry=lambda what, pause: progress.retrying(what, pause, until - time.monotonic()),
        )

    # asked once, before there is a job to leave behind: the hostfile's slots and
    # LIGHTPATH_GPUS_PER_SERVER are the cluster's, not an assumed 8
    gpus_per_server = client.cluster().gpus_per_server
    # a signal the launcher was started ignoring stays ignored (`nohup` ignores
    # SIGHUP, a shell's `&` SIGINT): a logout must not cancel a nohup'd job. One
    # it was started with blocked is unblocked: exec keeps a parent's signal mask
    # (a CI harness ran us with SIGINT blocked), and a blocked Ctrl-C never cancels
    previous = {
        s: signal.signal(s, _raise_stop)
        for s in STOP_SIGNALS
        if signal.getsignal(s) is not signal.SIG_IGN
    }
    blocked = set(previous) & signal.pthread_sigmask(signal.SIG_BLOCK, ())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    procs: list[subprocess.Popen[bytes]] = []
    heartbeat: Heartbeat | None = None
    held: list[Any] = []  # the work directory's lock, released on return
    try:
        job = client.request(_Calls.submit_job(dict(body)))
        if not job.ended and job.state != "placed":
            progress(job, 0.0)  # at once: the first long-poll may hold for poll_s
            try:
                # through a server restart too, until --wait-timeout-s (if any)
                job = client.wait_for(
                    job_id,
                    "placed",
                    timeout_s=wait_timeout_s,
                    on_progress=progress,
                    poll_s=10.0,
                    ride_out=True,
                    on_retry=progress.retrying,
                )
            except WaitTimeout as exc:
                # nothing will run it: left queued it would hold servers once placed
                _cancel(final, job_id)
                progress.done(f"{job_id} cancelled: {exc}")
                return 1
        if job.state != "placed":
            progress.done(f"{job_id} is {job.state}; nothing to run")
            return 1
        progress.done(f"{job_id} placed on {len(job.units)} servers")
        cwd = os.getcwd()
        local = runner == "local"
        # absolute: ranks started in another directory (ssh, a Slurm step) read them
        where = Path(cwd) / (workdir or Path(".lightpath") / "launch" / workdir_name(job_id))
        lock = _hold_workdir(where)
        if lock is None:
            # rerun while the first still runs: idempotency hands it the placed job,
            # and a second copy of every rank (and a rewritten hostfile) would follow
            progress.write(
                f"error: another `lightpath launch` of {job_id} is running with work "
                f"directory {where}; nothing started"
            )
            return 1
        held.append(lock)
        ranks = plan_ranks(
            job,
            host_template=host_template,
            master_addr="127.0.0.1" if local else None,
            master_port=master_port or (free_port() if local else 29500),
            workdir=where,
            gpus_per_server=gpus_per_server,
            server_url=client.url,
        )
        if runner == "print":
            for rank in ranks:
                out.write(f"{rank.host}\t{shell_line(rank, command, cwd)}\n")
            out.flush()
            progress.done(
                f"{job_id} stays placed: complete or fail it when the ranks end "
                f"(hostfile {ranks[0].env['LIGHTPATH_HOSTFILE']})"
            )
            return 0
        lease = job.lease_s
        every = heartbeat_s or (max(0.5, lease / 3) if lease else 30.0)
        heartbeat = Heartbeat(client, job_id, every)
        heartbeat.start()
        try:
            procs.extend(STARTERS[runner](rank, command, cwd) for rank in ranks)
        except OSError as exc:
            # not found or not executable: the ranks started so far stop, the job fails
            _terminate(procs, grace_s)
            heartbeat.stop.set()
            code, reason = _cannot_start(runner, command, exc)
            final(_Calls.fail_job(job_id, code, reason))
            progress.write(f"error: {reason} (job {job_id} failed, exit {code})")
            return code
        status, failed = supervise(procs, heartbeat, grace_s)
        heartbeat.stop.set()
        if heartbeat.ended is not None:
            ended = heartbeat.ended
            progress.done(f"{job_id} was ended by the server: {ended.state} ({ended.end_reason})")
            return 1
        if status == 0:
            final(_Calls.complete_job(job_id))
            progress.done(f"{job_id} completed")
            return 0
        code, reason = _failure(status, failed)
        final(_Calls.fail_job(job_id, code, reason))
        progress.done(f"{job_id} failed: {reason}")
        return code
    except Stop as stop:
        _terminate(procs, grace_s)  # further stop signals do nothing now (`_raise_stop`)
        _cancel(final, job_id)
        progress.done(f"{job_id} cancelled ({stop})")
        return 128 + stop.signum
    finally:
        if heartbeat is not None:
            heartbeat.stop.set()
        for lock in held:
            lock.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)


def _cannot_start(runner: str, command: Sequence[str], exc: OSError) -> tuple[int, str]:
    """A shell's status for a command it cannot start: 127 not found, 126 not executable."""
    program = "ssh" if runner == "ssh" else command[0]
    code = 127 if isinstance(exc, FileNotFoundError) else 126
    return code, f"cannot run {program}: {exc.strerror or exc}"


def _failure(status: int, failed: int | None) -> tuple[int, str]:
    """The exit code (the launcher's and the job's) and the reason for a rank's status.

    A rank killed by a signal (Popen's -N) is 128 + N, as a shell, Slurm and
    Kubernetes report it: a SIGKILLed (OOM-killed) rank is 137, not -9.
    """
    who = f"rank {failed}" if failed is not None else "the job"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return min(255, 128 - status), f"{who} killed by {name}"
    if failed is None:
        return min(255, status), "exited"
    return min(255, status), f"{who} exited {status}"


def _cancel(final: Callable[[Call[Job]], Job], job_id: str) -> None:
    try:
        final(_Calls.cancel_job(job_id))
    except Conflict:
        pass  # it had already ended


def workdir_name(job_id: str) -> str:
    """The job's work directory under .lightpath/launch: the id percent-encoded, one
    name per id (`co:1`, `co@1` and `co_1` all mapped to `co_1` and shared a hostfile)."""
    return quote(job_id, safe="._-")


def _hold_workdir(workdir: Path) -> Any:
    """An exclusive lock on the work directory for this launch's life (the open lock
    file), or None when another launch holds it."""
    workdir.mkdir(parents=True, exist_ok=True)
    lock = (workdir / "launch.lock").open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return None
    return lock
