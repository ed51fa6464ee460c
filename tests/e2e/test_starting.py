"""Starting against a real PostgreSQL (issue 30): a failed start exits non-zero with any number of workers,
and `migrate` says what to do when the database does not exist and what partitions exist when it does."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.e2e.server import cli, free_port, service_env

pytestmark = pytest.mark.e2e

STARTUP_FAILURE = 3  # uvicorn's exit status of a worker that could not start


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_start_exits_non_zero_whatever_the_worker_count(
    tmp_path: Path, redis_url: str, redis_prefix: str, postgres_url: str, workers: int
) -> None:
    """The database is not migrated: every worker refuses at start. With several, uvicorn's supervisor
    stopped them all and returned normally, and `serve` exited 0 (a clean stop to a process manager)."""
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url)
    exited = cli(env, tmp_path, "serve", "--port", str(free_port()), "--workers", str(workers), check=False)
    assert exited.returncode == STARTUP_FAILURE, exited.stdout + exited.stderr
    assert "run `latebandit migrate` first" in exited.stdout + exited.stderr


def test_migrate_says_how_to_create_a_missing_database(tmp_path: Path, postgres_url: str) -> None:
    missing = f"lbmissing_{uuid.uuid4().hex[:12]}"
    url = postgres_url.rsplit("/", 1)[0] + "/" + missing
    refused = cli(service_env(tmp_path, database_url=url), tmp_path, "migrate", check=False)
    assert refused.returncode != 0
    said = " ".join(refused.stderr.split())  # the console wraps long lines
    assert f'has no database "{missing}"' in said
    assert f"createdb -h 127.0.0.1 -p 5432 -U postgres {missing}" in said and f'CREATE DATABASE "{missing}"' in said


def test_migrate_says_which_day_partitions_exist(tmp_path: Path, postgres_url: str) -> None:
    env = service_env(tmp_path, database_url=postgres_url)
    cli(env, tmp_path, "migrate")  # the migration itself creates the days
    again = " ".join(cli(env, tmp_path, "migrate").stderr.split())
    found = re.search(r"day partitions up to (\d{4}-\d{2}-\d{2}) exist \((\d+) days ahead\); 0 created", again)
    assert found is not None, again
    today = datetime.now(UTC).date()
    assert datetime.fromisoformat(found[1]).date() == today + timedelta(days=int(found[2]))
    assert int(found[2]) == 3  # DAYS_AHEAD
