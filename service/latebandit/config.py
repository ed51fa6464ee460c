"""Settings from ``LATEBANDIT_*`` environment variables (pydantic-settings), each also a ``serve`` flag
(generated from these fields by latebandit.setting_flags: a new setting gets its flag without more code).

Secrets (the HMAC secrets, API keys, and the URLs, which may hold passwords) are ``SecretStr``: a repr, a
log line or an error shows ``**********``; code reads them with ``get_secret_value()`` where it needs them.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from functools import cache, cached_property
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SQLITE_FILE = "latebandit.db"
MIN_SECRET_BYTES = 32
MIN_SECRET_CHARACTERS = 8  # distinct ones: "x" * 40 is long and still guessable
MIN_KEY_BYTES = 16  # an API key is only compared, never used to sign: half a secret's length
# What shipped examples and habit put where a secret belongs (compared without case and punctuation).
PLACEHOLDER_MARKS = (
    "changeme", "replaceme", "placeholder", "yoursecret", "example", "notsecret", "insecure", "password",
)  # fmt: skip


class UnsafeSettings(ValueError):
    """Settings the service refuses to start with; the message names the setting, never its value."""


@cache
def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address, or the local address a connection arrived on) is loopback."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or address).is_loopback


def weakness(secret: str, min_bytes: int = MIN_SECRET_BYTES) -> str | None:
    """Why ``secret`` must not sign decision ids, or be an API key with ``min_bytes``: anyone who knows or
    guesses it forges conversions or acts as a client."""
    if len(secret.encode()) < min_bytes:
        return f"shorter than {min_bytes} bytes"
    if any(mark in re.sub(r"[^a-z0-9]", "", secret.lower()) for mark in PLACEHOLDER_MARKS):
        return "a placeholder"
    if len(set(secret)) < MIN_SECRET_CHARACTERS:
        return f"made of fewer than {MIN_SECRET_CHARACTERS} distinct characters"
    return None


class Scope(StrEnum):
    """What an API key may do (``admin`` may do everything)."""

    DECIDE = "decide"
    METRICS = "metrics"
    ADMIN = "admin"


class KeyEntry(NamedTuple):
    """One configured API key: ``grant`` is what precedes its first colon, a scope and, after an ``@``, a glob
    on the campaigns it serves (``decide@summer-*:KEY``)."""

    grant: str
    key: str


def revealed(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LATEBANDIT_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="the address `serve` listens on")
    port: int = Field(default=8000, ge=1, le=65535, description="the port `serve` listens on")
    workers: int = Field(default=1, ge=1, description="uvicorn worker processes; more than 1 needs Redis")
    insecure: bool = Field(default=False, description="allow a non-loopback bind without API keys")
    redis_url: SecretStr | None = Field(default=None, description="redis://host:port/db; unset = in-process state")
    database_url: SecretStr | None = Field(default=None, description="postgresql://… or sqlite:///…; unset = SQLite")
    redis_cluster: bool = Field(default=False, description="redis_url names one node of a Redis Cluster")
    redis_prefix: str = Field(default="lb", description="first part of every Redis key (tests isolate by it)")
    secret: SecretStr | None = Field(default=None, description=f"HMAC key for decision ids, {MIN_SECRET_BYTES}+ bytes")
    previous_secrets: SecretStr | None = Field(
        default=None, description="comma-separated earlier secrets: their decision ids still verify (rotation)"
    )
    max_skew: float = Field(default=300.0, description="seconds a feedback time may lie in the future")
    api_keys: SecretStr | None = Field(default=None, description="comma-separated scope:key pairs")
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
    metrics_access: Literal["loopback", "key", "open"] = Field(
        default="loopback",
        description="who may read /metrics without a key: loopback connections, nobody (key), or anyone (open); "
        "a key needs the metrics or admin scope",
    )

    @cached_property
    def sqlalchemy_url(self) -> str:
        """The plain URL (docs/reference/cli.md) with the driver the service uses (psycopg 3 for PostgreSQL)."""
        url = revealed(self.database_url) or f"sqlite:///{DEFAULT_SQLITE_FILE}"
        for plain in ("postgresql://", "postgres://"):
            if url.startswith(plain):
                return "postgresql+psycopg://" + url[len(plain) :]
        return url

    def api_key_pairs(self) -> str:
        """Every configured ``scope:key`` pair, from LATEBANDIT_API_KEYS and LATEBANDIT_API_KEYS_FILE, as one
        comma-separated list (OSError if the file cannot be read)."""
        parts = [revealed(self.api_keys) or ""]
        if self.api_keys_file is not None:
            parts += self.api_keys_file.read_text().split()
        return ",".join(part for part in parts if part)

    def api_key_entries(self) -> list[KeyEntry]:
        """Every configured key entry (a part without a colon has an empty key)."""
        entries = (part.strip().partition(":") for part in self.api_key_pairs().split(","))
        return [KeyEntry(grant, key) for grant, _, key in entries if grant or key]

    def previous_secret_list(self) -> list[str]:
        return [part.strip() for part in (revealed(self.previous_secrets) or "").split(",") if part.strip()]

    def check(self) -> list[str]:
        """Refuse (UnsafeSettings) what must not be served: a weak secret, no secret with Redis, or no API keys
        on a non-loopback host without ``insecure``. Returns the warnings of what may be served but should be
        known.

        Hosts sharing a Redis must verify each other's decision ids. A secret generated per host (the embedded
        default's file) would make host B reject host A's ids, so with Redis the secret must be given. It is not
        generated into Redis instead: Redis may lose its data (the state is then rebuilt from the audit log),
        and a new secret would invalidate every decision id still awaiting its conversion; and a secret read
        from Redis would be readable by whatever may read Redis (a monitoring user, a replica's backup)."""
        named = [("LATEBANDIT_SECRET", revealed(self.secret))]
        named += [
            (f"LATEBANDIT_PREVIOUS_SECRETS (secret {n})", old) for n, old in enumerate(self.previous_secret_list(), 1)
        ]
        for name, value in named:
            why = weakness(value) if value else None
            if why is not None:
                raise UnsafeSettings(f"{name} is {why}: generate one with `openssl rand -hex 32`")
        if not self.embedded and not self.secret:
            raise UnsafeSettings(
                "LATEBANDIT_SECRET is not set: every host and worker sharing LATEBANDIT_REDIS_URL must sign decision "
                "ids with the same secret; set it to the same value on each (generate one with `openssl rand -hex 32`)"
            )
        self.check_keys()
        warnings = []
        if not self.api_key_pairs() and not is_loopback(self.host):
            if not self.insecure:
                raise UnsafeSettings(
                    f"refusing to listen on {self.host} without API keys: set LATEBANDIT_API_KEYS or pass --insecure "
                    "(LATEBANDIT_INSECURE)"
                )
            warnings.append(f"listening on {self.host} with no API keys: anyone who can reach it may act")
        return warnings

    def check_keys(self) -> None:
        """Refuse an API key that is short or a placeholder, by its place and grant, never its value."""
        source = "LATEBANDIT_API_KEYS" + (" and LATEBANDIT_API_KEYS_FILE" if self.api_keys_file else "")
        for number, (grant, key) in enumerate(self.api_key_entries(), 1):
            if not key or grant.partition("@")[0] not in Scope.__members__.values():
                # then what precedes the colon may be the key itself (KEY:decide): never echo it
                raise UnsafeSettings(
                    f"entry {number} of {source} is not scope:key or scope@campaign-glob:key "
                    "(scopes decide, metrics, admin)"
                )
            why = weakness(key, MIN_KEY_BYTES)
            if why is not None:
                raise UnsafeSettings(
                    f"API key {number} of {source} ({grant}) is {why}: generate each key with `openssl rand -hex 16`"
                )

    @property
    def embedded(self) -> bool:
        return not self.redis_url

    @property
    def drains_inline(self) -> bool:
        """Whether API workers drain the audit queue themselves (else a `latebandit audit-writer` does)."""
        return self.embedded or self.audit_writer == "inline"

    def spool_path(self) -> Path:
        """The spool directory of this deployment: one per Redis prefix, so that deployments sharing a machine
        never hand over each other's decisions."""
        return self.spool_dir or Path("latebandit-spool") / self.redis_prefix

    def secret_file(self) -> Path:
        """Where the embedded default keeps its generated secret: beside its SQLite file (one machine, so its
        workers and restarts share it; with Redis the secret must be set, see ``check``)."""
        url = self.sqlalchemy_url
        base = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else Path(DEFAULT_SQLITE_FILE)
        return base.with_name(base.name + ".secret")
