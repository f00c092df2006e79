"""The `lightpath` command: parses arguments, builds settings, wires parts, starts them."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from app.settings import Settings, is_loopback

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

    try:
        settings = Settings()
    except ValidationError as exc:
        typer.echo(f"error: invalid LIGHTPATH_* setting:\n{exc}", err=True)
        raise typer.Exit(2) from exc
    if cluster is not None:
        settings = settings.model_copy(update={"cluster": cluster})
    from app.logs import configure_logging

    configure_logging(settings.log_level)
    return settings


def _refuse_open_bind(settings: Settings, host: str) -> None:
    if not settings.token_scopes() and not is_loopback(host):
        typer.echo(
            f"error: refusing to bind {host} without LIGHTPATH_API_TOKENS; "
            "auth is off only on a loopback address",
            err=True,
        )
        raise typer.Exit(2)


def _load_cluster(settings: Settings):  # type: ignore[no-untyped-def]
    from app.wiring import ConfigError, load_cluster

    try:
        return load_cluster(settings.cluster, settings.reconfig_ms)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _serve_http(app: object, host: str, port: int) -> None:
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False)  # type: ignore[arg-type]
    uvicorn.Server(config).run()


@cli.command()
def serve(host: HostOpt = "127.0.0.1", port: PortOpt = 8080, cluster: ClusterOpt = None) -> None:
    """API + worker + mock optical switches in one process (the embedded default)."""
    settings = _settings(cluster)
    _refuse_open_bind(settings, host)
    topology = _load_cluster(settings)
    from app.api import create_app
    from app.store.migrate import upgrade_to_head
    from app.wiring import build_runtime

    upgrade_to_head(settings)
    runtime = build_runtime(settings, topology)
    runtime.start()
    log.info(
        "serving",
        extra={
            "host": host,
            "port": port,
            "cluster": topology.name,
            "database": "sqlite" if settings.is_sqlite else "postgresql",
        },
    )
    try:
        _serve_http(create_app(runtime.services), host, port)
    finally:
        runtime.stop()


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


if __name__ == "__main__":
    main()
