"""Settings from ``LATEBANDIT_*`` environment variables (pydantic-settings), each also a ``serve`` flag."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SQLITE_FILE = "latebandit.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LATEBANDIT_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    insecure: bool = False
    redis_url: str | None = Field(default=None, description="redis://host:port/db; unset = in-process state")
    database_url: str | None = Field(default=None, description="postgresql://… or sqlite:///…; unset = SQLite")
    redis_cluster: bool = Field(default=False, description="redis_url names one node of a Redis Cluster")
    redis_prefix: str = Field(default="lb", description="first part of every Redis key (tests isolate by it)")
    secret: str | None = Field(default=None, description="HMAC key for decision ids")
    max_skew: float = Field(default=300.0, description="seconds a feedback time may lie in the future")
    api_keys: str | None = Field(default=None, description="comma-separated scope:key pairs")
    api_keys_file: Path | None = Field(
        default=None, description="a file of scope:key pairs (one per line or comma-separated), e.g. a mounted secret"
    )
    request_ttl: float = Field(default=86_400.0, description="seconds a /choose request_id is remembered")
    dedup_retention: float = Field(
        default=86_400.0, description="seconds an event_id is remembered beyond its decision's window"
    )
    snapshot_interval: float = Field(
        default=1.0, description="seconds a worker may reuse its cached bucket histogram on /choose"
    )
    audit_batch: int = Field(default=5_000, description="audit rows written per transaction")
    audit_interval: float = Field(default=0.2, description="seconds between audit drains")
    audit_writer: Literal["inline", "external"] = Field(
        default="inline",
        description="inline: each API worker drains the audit queue; external: `latebandit audit-writer` does "
        "(the embedded default always drains inline: its queue is in process memory)",
    )
    spool_dir: Path | None = Field(
        default=None,
        description="where API workers spool the audit records of fallback decisions while Redis is away; "
        "unset = ./latebandit-spool/<redis_prefix> (keep it on a volume that outlives the process)",
    )
    spool_limit: int = Field(default=1 << 30, ge=1 << 20, description="bytes one worker may spool before refusing")
    audit_metrics_port: int = Field(default=9101, description="where `latebandit audit-writer` serves /metrics")
    log_level: str = Field(default="info", description="debug, info (one access line per request), warning, error")
    metrics_campaigns: int = Field(default=200, ge=1, description="campaigns with their own metric labels, per worker")
    metrics_arms: int = Field(default=50, ge=1, description="arms per campaign with their own metric labels")

    @cached_property
    def sqlalchemy_url(self) -> str:
        """The plain URL of CONTRACT.md with the driver the service uses (psycopg 3 for PostgreSQL)."""
        url = self.database_url or f"sqlite:///{DEFAULT_SQLITE_FILE}"
        for plain in ("postgresql://", "postgres://"):
            if url.startswith(plain):
                return "postgresql+psycopg://" + url[len(plain) :]
        return url

    def api_key_pairs(self) -> str:
        """Every configured ``scope:key`` pair, from LATEBANDIT_API_KEYS and LATEBANDIT_API_KEYS_FILE, as one
        comma-separated list (OSError if the file cannot be read)."""
        parts = [self.api_keys or ""]
        if self.api_keys_file is not None:
            parts += self.api_keys_file.read_text().split()
        return ",".join(part for part in parts if part)

    @property
    def embedded(self) -> bool:
        return self.redis_url is None

    @property
    def drains_inline(self) -> bool:
        """Whether API workers drain the audit queue themselves (else a `latebandit audit-writer` does)."""
        return self.embedded or self.audit_writer == "inline"

    def spool_path(self) -> Path:
        """The spool directory of this deployment: one per Redis prefix, so that deployments sharing a machine
        never hand over each other's decisions."""
        return self.spool_dir or Path("latebandit-spool") / self.redis_prefix

    def secret_file(self) -> Path:
        """Where the embedded default keeps its generated secret: beside its SQLite file."""
        url = self.sqlalchemy_url
        base = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else Path(DEFAULT_SQLITE_FILE)
        return base.with_name(base.name + ".secret")
