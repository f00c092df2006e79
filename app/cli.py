"""The `lightpath` command: parses arguments, builds settings, wires parts, starts them."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # imported where used: `lightpath --help` needs neither pydantic nor the engine
    from app.settings import Settings

cli = typer.Typer(
    name="lightpath",
    help="Online scheduler control plane for optically interconnected GPU datacenters.",
    no_args_is_help=True,
    add_completion=False,
)
log = logging.getLogger("lightpath")

HostOpt = Annotated[str, typer.Option(help="address to bind")]
PortOpt = Annotated[int, typer.Option(help="port to bind")]
ClusterOpt = Annotated[
    str | None, typer.Option(help="preset (small, seed-15k) or a YAML/JSON cluster file")
]


def _settings(cluster: str | None) -> Settings:
    from pydantic import ValidationError

    from app.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        # never the offending values: they may be tokens or a database password
        lines = [
            f"  LIGHTPATH_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        ]
        typer.echo("error: invalid LIGHTPATH_* setting:\n" + "\n".join(lines), err=True)
        raise typer.Exit(2) from None
    if cluster is not None:
        settings = settings.model_copy(update={"cluster": cluster})
    from app.logs import configure_logging

    configure_logging(settings.log_level)
    return settings


def _refuse_open_bind(settings: Settings, host: str) -> None:
    from app.settings import is_loopback

    if not settings.token_scopes() and not is_loopback(host):
        typer.echo(
            f"error: refusing to bind {host} without LIGHTPATH_API_TOKENS; "
            "auth is off only on a loopback address",
            err=True,
        )
        raise typer.Exit(2)


def _load_cluster(settings: Settings):  # type: ignore[no-untyped-def]
    from app.cluster_files import ConfigError, load_cluster

    # LIGHTPATH_RECONFIG_MS overrides a cluster file's latencies only when it is set
    reconfig_ms = settings.reconfig_ms if "reconfig_ms" in settings.model_fields_set else None
    try:
        return load_cluster(settings.cluster, reconfig_ms)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _refuse_wrong_cluster(settings: Settings, topology: object) -> None:
    """Exit 2 when the database's placed jobs or circuits do not fit the cluster file: a
    worker on the wrong one (one started without LIGHTPATH_CLUSTER reads the `small`
    preset) left those jobs out of its plan and tore down every circuit they held on
    switches with the same ids. A database not reachable or not migrated yet is the
    runtime's to wait for: nothing is checked then (at most 5 s are spent on it, on a
    daemon thread: a host that never answers does not hold up start-up or SIGTERM)."""
    import threading

    from app.store.fabric_repository import FabricRepository
    from app.wiring import build_store
    from app.worker.loop import wrong_cluster_file

    found: list[str | None] = []

    def read() -> None:
        store = build_store(settings)
        try:
            holders = store.server_holders()
            desired = FabricRepository(store).load_desired()
            found.append(wrong_cluster_file(topology, holders, desired))  # type: ignore[arg-type]
        except Exception:
            return
        finally:
            store.dispose()

    thread = threading.Thread(target=read, name="cluster-check", daemon=True)
    thread.start()
    thread.join(5.0)
    reason = found[0] if found else None
    if reason is not None:
        typer.echo(f"error: {reason} (refusing to drive the switches)", err=True)
        raise typer.Exit(2)


# seconds SIGTERM waits for requests in flight (long-polls answer at once on shutdown)
GRACEFUL_SHUTDOWN_S = 5


def _serve_http(
    app: object,
    host: str,
    port: int,
    on_listening: Callable[[], None] | None = None,
    on_stopping: Callable[[], None] | None = None,
) -> None:
    """Serve `app`; `on_listening` runs once the socket accepts connections,
    `on_stopping` when shutdown begins (before requests in flight are awaited).

    SIGTERM shuts the server down gracefully, then ends the process through
    `SystemExit`, so the caller's `finally` (`Runtime.stop`: release the lease, stop
    the fabric process) runs: uvicorn raises the signal again once it has shut down,
    to the handler in place before it started, which by default killed the process
    on the spot.
    """
    import signal

    import uvicorn

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if on_listening is not None and not self.should_exit:
                on_listening()

        async def shutdown(self, sockets: Any = None) -> None:
            if on_stopping is not None:
                on_stopping()
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    Server(config).run()


@cli.command()
def serve(host: HostOpt = "127.0.0.1", port: PortOpt = 8080, cluster: ClusterOpt = None) -> None:
    """API + worker + mock optical switches in one process (SQLite and an in-process bus
    unless LIGHTPATH_DATABASE_URL / LIGHTPATH_REDIS_URL are set)."""
    settings = _settings(cluster)
    _refuse_open_bind(settings, host)
    topology = _load_cluster(settings)
    from app.api import create_app
    from app.store.migrate import upgrade_to_head
    from app.wiring import build_runtime

    upgrade_to_head(settings)
    _refuse_wrong_cluster(settings, topology)
    runtime = build_runtime(settings, topology)
    runtime.start(load_solver_now=False)  # once serving: start-up stays short
    log.info(
        "serving",
        extra={
            "host": host,
            "port": port,
            "cluster": topology.name,
            "database": "sqlite" if settings.is_sqlite else "postgresql",
            "bus": "redis-streams" if settings.redis_url else "in-process",
        },
    )
    try:
        _serve_http(
            create_app(runtime.services),
            host,
            port,
            on_listening=runtime.load_solver,
            on_stopping=runtime.services.waiters.close,
        )
    finally:
        runtime.stop()


@cli.command()
def api(host: HostOpt = "127.0.0.1", port: PortOpt = 8080, cluster: ClusterOpt = None) -> None:
    """The API process alone (records requests; a separate worker acts on them)."""
    settings = _settings(cluster)
    _refuse_open_bind(settings, host)
    topology = _load_cluster(settings)
    from app.api import create_app
    from app.wiring import build_api_runtime

    runtime = build_api_runtime(settings, topology)
    runtime.start()
    log.info("api serving", extra={"host": host, "port": port, "cluster": topology.name})
    try:
        _serve_http(
            create_app(runtime.services),
            host,
            port,
            on_listening=_freeze_start_up_heap,
            on_stopping=runtime.services.waiters.close,
        )
    finally:
        runtime.stop()


def _freeze_start_up_heap() -> None:
    """Take what start-up built (modules, the app, the cluster) out of the collector's
    generations: a traffic batch allocates objects per demand entry, and the full
    collections they trigger walked that whole heap each time (gc.freeze cut the API's
    CPU per 1,000-entry batch from ~8 to ~5 ms)."""
    import gc

    gc.collect()
    gc.freeze()


@cli.command()
def worker(
    cluster: ClusterOpt = None,
    metrics_host: Annotated[str | None, typer.Option(help="probe/metrics address")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="probe/metrics port")] = None,
) -> None:
    """The worker process: leader-elected scheduler, fabric planner and switch controller."""
    settings = _settings(cluster)
    topology = _load_cluster(settings)
    from app.wiring import build_worker_runtime
    from app.worker.http import create_worker_app

    _refuse_wrong_cluster(settings, topology)
    runtime = build_worker_runtime(settings, topology)
    runtime.start()
    host = metrics_host or settings.worker_metrics_host
    port = metrics_port if metrics_port is not None else settings.worker_metrics_port
    log.info("worker running", extra={"cluster": topology.name, "metrics_port": port})
    try:
        _serve_http(create_worker_app(runtime), host, port)
    finally:
        runtime.stop()


@cli.command("mock-oxc")
def mock_oxc(host: HostOpt = "127.0.0.1", port: PortOpt = 9090, cluster: ClusterOpt = None) -> None:
    """Mock optical circuit switches (one per OXC of the cluster) over HTTP; one replica."""
    settings = _settings(cluster)
    token = settings.southbound_token.get_secret_value() if settings.southbound_token else None
    from app.settings import is_loopback

    if not token and not is_loopback(host):
        typer.echo(
            f"error: refusing to bind {host} without LIGHTPATH_SOUTHBOUND_TOKEN; "
            "the switches' control API is open only on a loopback address",
            err=True,
        )
        raise typer.Exit(2)
    topology = _load_cluster(settings)
    from app.southbound.mock_oxc import create_mock_oxc_app

    app = create_mock_oxc_app(
        topology,
        reconfig_ms=None,
        fault_rate=settings.mock_fault_rate,
        seed=settings.mock_fault_seed,
        token=token,
    )
    log.info("mock-oxc serving", extra={"host": host, "port": port, "oxcs": len(topology.oxcs)})
    _serve_http(app, host, port)


@cli.command()
def predict(
    plans: Annotated[list[str], typer.Argument(help="symbolic plan ids, e.g. P D P D")],
    algorithm: Annotated[str, typer.Option(help="seed or lightpath")] = "lightpath",
) -> None:
    """Run a cycle predictor over a sequence of plans: one line per step, then misses=N."""
    from app.engine.predictor import ALGORITHMS, format_steps, run_predictor

    if algorithm not in ALGORITHMS:
        typer.echo(f"error: --algorithm must be one of {', '.join(ALGORITHMS)}", err=True)
        raise typer.Exit(2)
    # "-" is what a step shows for "nothing installed", and "=" separates its fields: a
    # plan by either name made the output ambiguous
    if any(not p or p == "-" or "=" in p or any(c.isspace() for c in p) for p in plans):
        typer.echo(
            'error: a plan id is a non-empty word without spaces or "=", other than "-"',
            err=True,
        )
        raise typer.Exit(2)
    for line in format_steps(run_predictor(algorithm, plans)):
        print(line)


@cli.command()
def simulate(
    workload: Annotated[str, typer.Option(help="workload JSON Lines file")],
    cluster: Annotated[str, typer.Option(help="preset or cluster file")] = "seed-15k",
    policy: Annotated[str | None, typer.Option(help="one policy")] = None,
    compare: Annotated[str | None, typer.Option(help="comma-separated policies")] = None,
    out: Annotated[str | None, typer.Option(help="directory for summary, plots")] = None,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    reconfig_ms: Annotated[float | None, typer.Option(help="OXC reconfiguration latency")] = None,
    seeds: Annotated[int, typer.Option(help="jittered runs per policy (mean, 95% CI)")] = 1,
    gpu: Annotated[
        str | None, typer.Option(help="a100|h100|b200 (default: the cluster's gpu_model)")
    ] = None,
) -> None:
    """Replay a workload through the engine on simulated time."""
    from app.logs import configure_logging

    settings = _settings(None)  # the service's admission settings apply here too
    configure_logging("WARNING")
    if (policy is None) == (compare is None):
        typer.echo("error: give exactly one of --policy or --compare", err=True)
        raise typer.Exit(2)
    policies = [policy] if policy else [p.strip() for p in (compare or "").split(",")]
    if "" in policies or len(set(policies)) < len(policies):
        typer.echo("error: --compare takes distinct policy names, comma-separated", err=True)
        raise typer.Exit(2)
    from app.sim.commands import run_simulate

    raise typer.Exit(
        run_simulate(
            cluster,
            workload,
            policies,
            out,
            seed,
            reconfig_ms,
            seeds=seeds,
            gpu=gpu,
            gpu_memory_bytes=settings.gpu_memory_bytes,
            default_zero_stage=settings.default_zero_stage,
        )
    )


workload_cli = typer.Typer(help="Build workload files for `simulate`.", no_args_is_help=True)
cli.add_typer(workload_cli, name="workload")


@workload_cli.command("from-trace")
def workload_from_trace(
    trace: Annotated[str, typer.Option(help="a public cluster trace CSV (Acme Kalos)")],
    out: Annotated[str, typer.Option(help="workload JSON Lines to write")],
    jobs: Annotated[int | None, typer.Option(help="keep the first N jobs")] = None,
    seed: Annotated[int, typer.Option(help="random seed for plan choice")] = 0,
    load: Annotated[float, typer.Option(help="load factor: arrival times / load")] = 1.0,
) -> None:
    """Build a workload from a public trace and the model tables vendored in data/."""
    from app.sim.commands import run_from_trace

    raise typer.Exit(run_from_trace(trace, out, jobs, seed, load))


@workload_cli.command("generate")
def workload_generate(
    family: Annotated[str, typer.Option(help="dense|bigspan|moe|comm-heavy|fleet|fleet-stress")],
    out: Annotated[str, typer.Option(help="workload JSON Lines to write")],
    load: Annotated[float, typer.Option(help="offered load (1 = the cluster's servers)")] = 1.0,
    jobs: Annotated[int, typer.Option(help="number of jobs")] = 160,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    cluster: Annotated[str, typer.Option(help="preset or cluster file")] = "seed-15k",
) -> None:
    """Generate a workload family with Kalos-trace sizes, run times and Poisson arrivals."""
    from app.sim.commands import run_generate

    raise typer.Exit(run_generate(family, cluster, load, jobs, seed, out))


@cli.command()
def migrate() -> None:
    """Apply database migrations (Alembic) to LIGHTPATH_DATABASE_URL."""
    settings = _settings(None)
    from app.store.migrate import upgrade_to_head

    upgrade_to_head(settings)
    typer.echo("database is at the newest schema")


def main() -> None:
    try:
        cli()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        reason = _database_unreachable(exc)
        if reason is None:
            raise
        # one line, not the traceback (the driver's message never holds the password)
        typer.echo(f"error: cannot reach the database: {reason}", err=True)
        sys.exit(1)


def _database_unreachable(exc: BaseException) -> str | None:
    """The driver's first line when `exc` is the database refusing or missing; else None."""
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")  # loaded by whatever raised it
    if sqlalchemy_exc is None or not isinstance(exc, sqlalchemy_exc.OperationalError):
        return None
    lines = str(exc.orig).strip().splitlines()
    return lines[0] if lines else type(exc.orig).__name__


if __name__ == "__main__":
    main()
