"""Fixtures for the real services the tests run against.

Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432, database ``test``) are real servers. Each test gets
its own Redis key prefix and its own PostgreSQL database, so tests never see each other's data. When a
server cannot be reached the test fails with a clear message if ``CI`` is set, and is skipped (with the
reason shown by ``pytest -rs``) otherwise.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import pytest

# Database 13, not 0: a developer's own Redis data is in 0 (the README names both variables and defaults).
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("LATEBANDIT_TEST_REDIS_URL", DEFAULT_REDIS_URL)
POSTGRES_ADMIN_URL = os.environ.get("LATEBANDIT_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)

SERVICE_FIXTURES = {"redis_url": "redis", "redis_prefix": "redis", "redis_cluster_url": "redis"} | {
    "postgres_url": "postgres"
}
TIERS = ("redis", "postgres", "e2e", "slow")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers from what a test uses, so that test files need not say it: a Redis or PostgreSQL fixture marks
    it redis / postgres, tests/e2e marks it e2e; ``slow`` is set by hand. The rest are ``quick``
    (``pytest -m quick`` runs them alone in seconds; CI runs everything)."""
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if fixture in SERVICE_FIXTURES:
                item.add_marker(SERVICE_FIXTURES[fixture])
        if "e2e" in item.path.parts:
            item.add_marker("e2e")
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker("quick")


def unavailable(what: str, error: Exception) -> None:
    missing(f"{what} is not reachable ({error}); start it or set the LATEBANDIT_TEST_* URL")


def missing(message: str) -> None:
    """Fail under CI, which must have everything a test needs; skip elsewhere, with the reason."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def installed(program: str, package: str) -> str:
    """The path of ``program`` (``missing`` when it is not installed)."""
    path = shutil.which(program)
    if path is None:
        missing(f"{program} is not installed (Debian package {package}; .ci/run installs it)")
    assert path is not None
    return path


@pytest.fixture
def redis_url() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as error:
        unavailable(f"Redis at {REDIS_URL}", error)
    return REDIS_URL


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix owned by one test; its keys are deleted afterwards."""
    import redis

    prefix = f"lbtest{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """The plain URL (as LATEBANDIT_DATABASE_URL) of a fresh, empty PostgreSQL database, dropped afterwards."""
    import psycopg

    name = f"lbtest_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.Error as error:
        unavailable(f"PostgreSQL at {POSTGRES_ADMIN_URL}", error)
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'audit.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request) -> str:
    """Both audit back ends: the embedded SQLite file and a real PostgreSQL database."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory) -> Iterator[str]:
    """A three-master Redis Cluster started from the redis-server binary, shared by the session's tests
    (each uses its own key prefix); stopped at the end."""
    from tests.faults import redis_cluster

    with redis_cluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster.url


async def delete_keys(client, prefix: str) -> None:
    """Delete every key under ``prefix`` (an asyncio redis client): a test's own store, after it."""
    for key in [key async for key in client.scan_iter(match=f"{prefix}:*")]:
        await client.delete(key)
