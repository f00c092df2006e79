"""The `lightpath` command. Client commands run with the client alone (httpx);
every other command is the server's (`app.cli`, typer), imported only when asked for,
so `lightpath launch` works where `lightpath[server]` is not installed."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

from ._client import Client, job_body
from ._exceptions import LightpathError
from ._models import ClusterState, Decision, Job
from ._version import version
from .launch import RUNNERS, launch, node_rank

CLIENT_COMMANDS = ("launch", "jobs", "job", "cancel", "cluster", "decisions")
SERVER_COMMANDS = (
    ("serve", "API + worker + mock optical switches in one process"),
    ("api | worker | mock-oxc", "the same parts as separate processes"),
    ("migrate", "apply database migrations"),
    ("simulate | workload | predict", "offline engine tools"),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightpath",
        description="Online scheduler control plane for optically interconnected GPU datacenters.",
        epilog="server commands (need `pip install 'lightpath[server]'`): "
        + "; ".join(f"{name}: {what}" for name, what in SERVER_COMMANDS)
        + ". The token comes from LIGHTPATH_TOKEN.",
    )
    parser.add_argument("--version", action="version", version=f"lightpath {version()}")
    # before the command or after it: `lightpath --server URL jobs` and
    # `lightpath jobs --server URL` alike (the command's wins when both are given)
    server_help = "API URL (default $LIGHTPATH_URL or http://127.0.0.1:8080)"
    parser.add_argument("--server", dest="global_server", help=server_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--server", help=server_help)
        return p

    p = command("launch", "submit a job, wait for placement, run CMD once per server")
    p.add_argument("--job-id", required=True)
    p.add_argument("--dp", type=int, required=True, help="data-parallel degree")
    p.add_argument("--pp", type=int, required=True, help="pipeline stages")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree")
    for flag, kind in (
        ("--parameters", _finite()),
        ("--bytes-per-parameter", _finite()),
        ("--activation-bytes", _finite()),
        ("--microbatches", int),
        ("--hidden-size", int),
        ("--num-layers", int),
        ("--seq-len", int),
        ("--microbatch-size", int),
        ("--zero-stage", int),
    ):
        p.add_argument(flag, type=kind, dest="model_" + flag[2:].replace("-", "_"))
    for flag in ("--microbatch-forward-s", "--microbatch-backward-s", "--optimizer-s"):
        p.add_argument(flag, type=_finite(), dest="compute_" + flag[2:].replace("-", "_"))
    p.add_argument("--collective", choices=("auto", "inc", "ring", "tree", "hierarchical_ring"))
    p.add_argument("--priority", type=int)
    p.add_argument(
        "--deadline",
        type=_deadline,
        help="RFC 3339 time or epoch seconds (edf queue policy)",
    )
    p.add_argument(
        "--lease-s",
        type=_finite(low=0.0),
        help="heartbeat lease (default 60; 0: none; none with --runner print, since "
        "nothing here heartbeats for ranks started elsewhere)",
    )
    p.add_argument(
        "--schedule",
        choices=("gpipe", "1f1b"),
        help="pipeline schedule the memory check assumes (server default gpipe)",
    )
    p.add_argument(
        "--activation-checkpointing",
        action="store_true",
        default=None,
        dest="model_activation_checkpointing",
        help="the job recomputes activations (the memory check keeps layer inputs only)",
    )
    p.add_argument("--walltime-s", type=_finite(), help="runtime estimate for backfill")
    p.add_argument("--runner", choices=RUNNERS, default="local")
    p.add_argument("--host-template", default="{server}", help="ssh/hostfile host of a server")
    p.add_argument(
        "--master-port",
        type=_at_least(1, 65535),
        help="default: a free port (local), else 29500",
    )
    p.add_argument("--workdir", help="where the hostfile and placement.json go")
    p.add_argument("--wait-timeout-s", type=_finite(low=0.0), help="give up waiting for placement")
    p.add_argument(
        "--grace-s", type=_finite(low=0.0), default=10.0, help="SIGTERM to SIGKILL delay"
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD...")

    p = command("jobs", "list jobs")
    p.add_argument("--state", choices=("queued", "placed", "completed", "failed", "cancelled"))
    p.add_argument("--json", action="store_true")
    p = command("job", "one job in detail")
    p.add_argument("job_id")
    p.add_argument("--json", action="store_true")
    p = command("cancel", "cancel a queued or placed job")
    p.add_argument("job_id")
    command("cluster", "free and used servers per pod")
    p = command("decisions", "the decision log")
    p.add_argument(
        "--after", type=_at_least(0), default=0, help="last seq already seen (0: from the start)"
    )
    p.add_argument(
        "--limit", type=_at_least(1), default=None, help="at most this many (default: all)"
    )
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new decisions")
    return parser


def _deadline(text: str) -> float | str:
    """Epoch seconds, or an RFC 3339 time passed on as written (the API reads both)."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):  # nan, inf: JSON has no such number
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
        return seconds
    try:
        dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither epoch seconds nor an RFC 3339 time (2026-12-01T00:00:00Z)"
        ) from None
    return text  # the server checks it as it checks any body


def _at_least(low: int, high: int | None = None) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is above {high}")
        return value

    return parse


def _finite(low: float | None = None) -> Any:
    """A finite number (JSON has no nan or inf: they were a traceback), at least `low`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if low is not None and value < low:
            raise argparse.ArgumentTypeError(f"{value:g} is below {low:g}")
        return value

    return parse


def _sections(args: argparse.Namespace, prefix: str) -> dict[str, Any] | None:
    values = {
        k[len(prefix) :]: v for k, v in vars(args).items() if k.startswith(prefix) and v is not None
    }
    return values or None


def cmd_launch(args: argparse.Namespace, client: Client) -> int:
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        print("error: give the command to run after --", file=sys.stderr)
        return 2
    body = job_body(
        args.job_id,
        dp=args.dp,
        pp=args.pp,
        ep=args.ep,
        model=_sections(args, "model_"),
        compute=_sections(args, "compute_"),
        collective=args.collective,
        priority=args.priority,
        deadline=args.deadline,
        lease_s=_lease_s(args),
        walltime_s=args.walltime_s,
        schedule=args.schedule,
    )
    from pathlib import Path

    return launch(
        client,
        body,
        command,
        runner=args.runner,
        host_template=args.host_template,
        master_port=args.master_port,
        workdir=Path(args.workdir) if args.workdir else None,
        wait_timeout_s=args.wait_timeout_s,
        grace_s=args.grace_s,
    )


DEFAULT_LEASE_S = 60.0


def _lease_s(args: argparse.Namespace) -> float | None:
    """The lease to ask for: as given (0: none), else 60 s, except for `--runner print`,
    whose ranks run elsewhere with no heartbeat from here (a lease would expire)."""
    if args.lease_s is not None:
        return args.lease_s or None
    return None if args.runner == "print" else DEFAULT_LEASE_S


def _ago(when: dt.datetime | None) -> str:
    if when is None:
        return "-"
    seconds = int((dt.datetime.now(dt.UTC) - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _table(rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def format_jobs(jobs: Sequence[Job]) -> str:
    rows: list[Sequence[Any]] = [("JOB_ID", "STATE", "SERVERS", "DPxPPxEP", "AGE", "NOTE")]
    for j in jobs:
        note = j.queue_reason if j.state == "queued" else (j.end_reason or "")
        if j.exit_code is not None and note != f"exit {j.exit_code}":
            # (a failure with no reason is given "exit N" as its reason: said once)
            note = f"exit {j.exit_code}: {note}" if note else f"exit {j.exit_code}"
        rows.append(
            (
                j.job_id,
                j.state,
                j.servers_needed,
                f"{j.dp}x{j.pp}x{j.ep}",
                _ago(j.submitted_at),
                note,
            )
        )
    return _table(rows)


def format_job(job: Job) -> str:
    lines = [
        f"job_id:      {job.job_id}",
        f"state:       {job.state}",
        f"parallelism: dp={job.dp} pp={job.pp} ep={job.ep} ({job.servers_needed} servers)",
        f"submitted:   {job.submitted_at}",
        f"placed:      {job.placed_at or '-'}",
        f"ended:       {job.completed_at or '-'}",
    ]
    if job.queue_reason and job.state == "queued":
        lines.append(f"waiting:     {job.queue_reason}")
    if job.exit_code is not None or job.end_reason:
        lines.append(f"end:         exit_code={job.exit_code} reason={job.end_reason}")
    if job.lease_s:
        lines.append(f"lease:       {job.lease_s:g}s, expires {job.raw.get('lease_expires_at')}")
    if job.units:
        rows: list[Sequence[Any]] = [("NODE_RANK", "SERVER", "STAGE", "DP_RANK", "EP_RANK")]
        ordered = sorted(job.units, key=lambda u: node_rank(u, job.dp, job.ep))
        rows += [(i, u.server, u.stage, u.dp_rank, u.ep_rank) for i, u in enumerate(ordered)]
        lines += ["", _table(rows)]
    return "\n".join(lines)


def format_cluster(cluster: ClusterState) -> str:
    rows: list[Sequence[Any]] = [("POD", "STATE", "TORS", "SERVERS", "USED", "FREE")]
    for p in cluster.pods:
        state = "idle" if p.used == 0 else "alloc" if p.free == 0 else "mix"
        rows.append((p.pod, state, p.tors, p.servers, p.used, p.free))
    used = cluster.servers - cluster.free_servers
    rows.append(("total", "", "", cluster.servers, used, cluster.free_servers))
    return (
        _table(rows)
        + f"\njobs: {cluster.placed_jobs} placed, {cluster.queued_jobs} queued;"
        + f" {cluster.gpus_per_server} GPUs per server"
    )


DECISIONS_HEADER = f"{'SEQ':>8}  {'AT':<25}  {'KIND':<9}  {'JOB':<24}  {'REASON':<10}  DETAIL"


def format_decision(d: Decision) -> str:
    detail = ""
    if d.kind == "placement":
        detail = f"{len((d.raw.get('placement') or {}).get('units', []))} servers"
    elif d.kind == "oxc":
        oxc = d.raw.get("oxc") or {}
        detail = f"{oxc.get('id')} +{len(oxc.get('connect', []))} -{len(oxc.get('disconnect', []))}"
    elif d.kind == "routing":
        detail = str((d.raw.get("routing") or {}).get("algorithm", ""))
    at = d.at.isoformat(timespec="seconds") if d.at else "-"
    return f"{d.seq:>8}  {at}  {d.kind:<9}  {d.job_id or '-':<24}  {d.reason:<10}  {detail}"


def _retrying(what: str, pause_s: float) -> None:
    print(f"[lightpath] {what}; retrying in {pause_s:.1f}s", file=sys.stderr, flush=True)


def server_url(args: argparse.Namespace) -> str:
    """--server after the command, else before it, else $LIGHTPATH_URL, else local."""
    return str(
        args.server
        or args.global_server
        or os.environ.get("LIGHTPATH_URL")
        or "http://127.0.0.1:8080"
    )


def run_client_command(args: argparse.Namespace) -> int:
    with Client(server_url(args)) as client:
        if args.command == "launch":
            return cmd_launch(args, client)
        if args.command == "jobs":
            jobs = list(client.iter_jobs(args.state))
            print(json.dumps([j.raw for j in jobs], indent=1) if args.json else format_jobs(jobs))
        elif args.command == "job":
            job = client.get_job(args.job_id)
            print(json.dumps(job.raw, indent=1) if args.json else format_job(job))
        elif args.command == "cancel":
            job = client.cancel_job(args.job_id)
            print(f"{job.job_id}: {job.state}")
        elif args.command == "cluster":
            print(format_cluster(client.cluster()))
        elif args.command == "decisions":
            print(DECISIONS_HEADER, flush=True)
            if args.follow:
                # through a server restart too: each retry is a line on stderr
                for d in client.follow_decisions(args.after, ride_out=True, on_retry=_retrying):
                    print(format_decision(d), flush=True)
            # every page to the end (or --limit of them), as `jobs` walks every page
            after, left = args.after, args.limit
            while left is None or left > 0:
                page = client.decisions(after, 1000 if left is None else min(left, 1000))
                for d in page.decisions:
                    print(format_decision(d))
                if not page.decisions:
                    break
                after = page.next
                left = None if left is None else left - len(page.decisions)
            print(f"next: {after}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args_in = list(sys.argv[1:] if argv is None else argv)
    first = args_in[0] if args_in else "--help"
    if first in CLIENT_COMMANDS or first.startswith("-"):
        args = _parser().parse_args(args_in)
        if args.command is None:
            _parser().print_help()
            sys.exit(2)
        try:
            sys.exit(run_client_command(args))
        except LightpathError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)
        except BrokenPipeError:
            # the reader went away (`lightpath jobs | head`): stop quietly, as cat does
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(141)
    try:
        from app.cli import main as server_main
    except ImportError as exc:
        print(
            f"error: `lightpath {first}` is a server command and the server is not installed "
            f"({exc.name} is missing): pip install 'lightpath[server]'",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.argv = ["lightpath", *args_in]
    server_main()


if __name__ == "__main__":
    main()
