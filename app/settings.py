"""The one settings object: every `LIGHTPATH_*` environment variable, typed and checked.

Nothing else in the code reads the environment. Defaults run the embedded mode:
SQLite under ./.lightpath/, the in-process event bus and in-process mock switches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.engine.cluster import MAX_RECONFIG_MS
from app.engine.memory import DEFAULT_ZERO_STAGE
from app.engine.placement import OPTICAL_EXTRA_PODS
from app.engine.queue import QueuePolicy

SCOPES = ("launcher", "telemetry", "operator")
DEFAULT_SQLITE = "sqlite:///./.lightpath/lightpath.db"
PLACEHOLDERS = frozenset({"changeme", "secret", "token", "password"})


class Settings(BaseSettings):
    """Service settings; build once at start-up and pass down."""

    model_config = SettingsConfigDict(env_prefix="LIGHTPATH_", extra="ignore")

    database_url: str = DEFAULT_SQLITE
    redis_url: str | None = None
    redis_prefix: str = Field(
        "lightpath",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="names every Redis key and channel (stream, lease, change notices)",
    )
    southbound_url: str | None = None
    api_tokens: SecretStr | None = None
    southbound_token: SecretStr | None = Field(
        None, description="bearer token of the mock switches' control API (both ends)"
    )
    cluster: str = "small"
    queue_policy: QueuePolicy = QueuePolicy.FIFO
    backfill: bool = True
    max_extra_pods: int | None = Field(
        OPTICAL_EXTRA_PODS,
        ge=0,
        description="a job of at most a quarter pod waits rather than span more pods than "
        "this beyond the fewest it needs, when a pod of that layout lacks the free uplinks "
        "its circuits need (each pod a ring passes through takes circuits); 0 on a cluster "
        "whose pods have fewer uplinks than servers; `none`: no limit",
    )
    reconfig_ms: float = Field(25.0, ge=0, le=MAX_RECONFIG_MS)
    mock_fault_rate: float = Field(0.0, ge=0, le=1)
    mock_fault_seed: int = 0
    predictor: Literal["seed", "lightpath"] = "lightpath"
    rewire_guard_ms: float = Field(
        0.0, ge=0, description="margin a per-phase rewiring must leave before its phase"
    )
    turn_ms: float | None = Field(
        None, gt=0, description="a turn on shared ports (default 40 x reconfiguration, >= 250 ms)"
    )
    db_pool_size: int = Field(10, ge=1, description="Postgres pool size (and as many overflow)")
    db_pool_timeout_s: float = Field(
        2.0, gt=0, description="wait for a pooled connection before answering 503"
    )
    db_lock_timeout_ms: int = Field(
        2000, ge=0, description="Postgres lock_timeout: a statement waits this long for a lock"
    )
    db_idle_in_transaction_ms: int = Field(
        3000,
        ge=0,
        description="Postgres idle_in_transaction_session_timeout: a stalled transaction ends",
    )
    retain_decisions_s: float = Field(
        7 * 86400.0, gt=0, description="decisions older than this are deleted"
    )
    retain_reports_s: float = Field(
        86400.0, gt=0, description="consumed traffic reports older than this are deleted"
    )
    idempotency_window_s: float = Field(
        86400.0, gt=0, description="a traffic batch's Idempotency-Key is remembered this long"
    )
    retain_outbox_s: float = Field(
        3600.0, gt=0, description="published outbox rows older than this are deleted"
    )
    retain_jobs_s: float = Field(
        30 * 86400.0,
        gt=0,
        description="ended jobs (and their prediction rows) are deleted this long after ending",
    )
    retention_interval_s: float = Field(
        60.0, gt=0, description="the leader runs retention at most this often"
    )
    log_level: str = "INFO"
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0)
    admit_wait_s: float = Field(2.0, ge=0)
    worker_tick_s: float = Field(1.0, gt=0)
    fabric_process: bool = Field(
        True,
        description="`lightpath worker` runs the fabric pass and the switch controller in a "
        "child process (another core); false: on threads of the worker (as `serve` does)",
    )
    fabric_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="the fabric process's niceness: when the cores are busy the OS runs "
        "admission (and the API, the database) ahead of the fabric pass; 0: no preference",
    )
    traffic_wake_ms: float = Field(
        20.0,
        ge=0,
        description="traffic ingest wakes the worker at most once per this interval (the "
        "reports are read by the next pass whatever happens to the wake-up)",
    )
    read_cache_ttl_s: float = Field(1.0, ge=0)
    worker_metrics_host: str = "127.0.0.1"
    worker_metrics_port: int = Field(9100, ge=0, le=65535)
    # None: the memory of the cluster's GPU model (`gpu_model`: a100/h100 80 GiB, b200 180 GB)
    gpu_memory_bytes: float | None = Field(None, gt=0)
    default_zero_stage: int = Field(DEFAULT_ZERO_STAGE, ge=0, le=3)

    @field_validator("max_extra_pods", mode="before")
    @classmethod
    def _no_limit(cls, value: object) -> object:
        """`none` (or empty) lifts the limit."""
        if isinstance(value, str) and value.strip().lower() in ("", "none"):
            return None
        return value

    @field_validator("database_url")
    @classmethod
    def _normalise_database_url(cls, value: str) -> str:
        """Accept plain `postgresql://` and pick the psycopg 3 driver ourselves."""
        for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
            if value.startswith(prefix):
                value = "postgresql+psycopg://" + value[len(prefix) :]
        if not value.startswith(("postgresql+psycopg://", "sqlite://")):
            raise ValueError("database_url must be postgresql://... or sqlite:///...")
        if value.startswith("postgresql"):
            _check_url_host(value)
            _check_libpq_options(urlsplit(value).query)
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis_url must be redis://, rediss:// or unix://...")
        _check_url_host(value)
        return value

    @field_validator("api_tokens")
    @classmethod
    def _check_tokens(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value().strip():
            parse_tokens(value.get_secret_value())
            return value
        return None

    @field_validator("southbound_token")
    @classmethod
    def _check_southbound_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        if value.get_secret_value().strip().lower() in PLACEHOLDERS:
            raise ValueError("refusing a placeholder token; set a real secret")
        return value

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def sqlite_path(self) -> Path | None:
        if not self.is_sqlite:
            return None
        raw = self.database_url.removeprefix("sqlite:///")
        return None if raw in ("", ":memory:") else Path(raw)

    def token_scopes(self) -> dict[str, str]:
        """Map each bearer token to its scope (empty when auth is off)."""
        if self.api_tokens is None:
            return {}
        return parse_tokens(self.api_tokens.get_secret_value())


def _check_url_host(url: str) -> None:
    """A host and port that parse (messages never repeat the URL: it may hold a password)."""
    try:
        _ = urlsplit(url).port  # parsed on access
    except ValueError as exc:
        if "IPv6" in str(exc):
            raise ValueError("the host is a malformed IPv6 address (a missing ']')") from None
        raise ValueError("the port must be an integer from 0 to 65535") from None


def _check_libpq_options(query: str) -> None:
    """Query parameters PostgreSQL's client library knows (`sslmode`, ...), or the
    first connection failed with a traceback."""
    if not query:
        return
    from psycopg import conninfo

    try:  # parsed on their own: libpq's message may quote the URL it was given
        conninfo.conninfo_to_dict(f"postgresql:///?{query}")
    except Exception as exc:  # psycopg.ProgrammingError
        raise ValueError(f"libpq refuses a query parameter: {str(exc).strip()}") from None


def parse_tokens(raw: str) -> dict[str, str]:
    """Parse `launcher=tok1,telemetry=tok2` into {token: scope}; reject bad entries."""
    tokens: dict[str, str] = {}
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry:
            continue
        scope, sep, token = entry.partition("=")
        scope, token = scope.strip(), token.strip()
        if not sep or scope not in SCOPES or not token:
            raise ValueError(
                "LIGHTPATH_API_TOKENS entries must be scope=token with scope one of "
                + ", ".join(SCOPES)
            )
        if token in tokens and tokens[token] != scope:
            raise ValueError("one token is listed under two scopes")
        if token.lower() in PLACEHOLDERS:
            raise ValueError("refusing a placeholder token; set a real secret")
        tokens[token] = scope
    return tokens


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach."""
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")
