"""Who may call what, by the address a connection arrived on (issue 19): without API keys only loopback
is served (unless insecure), and /metrics needs a metrics or admin key as LATEBANDIT_METRICS_ACCESS says.
The application is driven in process (tests/inprocess.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from latebandit.config import Settings
from tests.inprocess import LOOPBACK, client, started

KEYS = "admin:admin-key-5e1d28c4,decide:decide-key-93ab6f07,metrics:metrics-key-0c7f41e9"
PUBLIC = "http://192.0.2.7:8000"


@asynccontextmanager
async def served(tmp_path: Path, **values: object) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """One client per address the connection arrives on: loopback (IPv4 and IPv6) and a public one."""
    settings = Settings(_env_file=None, database_url=f"sqlite:///{tmp_path / 'audit.db'}", **values)  # type: ignore[arg-type]
    async with started(settings) as app:
        clients = {name: client(app, url) for name, url in (("loopback", LOOPBACK), ("ipv6", "http://[::1]:8000"),
                                                             ("public", PUBLIC))}  # fmt: skip
        try:
            yield clients
        finally:
            for each in clients.values():
                await each.aclose()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_without_keys_only_loopback_connections_are_served(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        assert (await http["loopback"].get("/campaigns")).status_code == 200
        assert (await http["ipv6"].get("/metrics")).status_code == 200
        for path in ("/campaigns", "/metrics", "/healthz"):
            refused = await http["public"].get(path)
            assert refused.status_code == 403 and refused.json()["error"] == "loopback_only", path


async def test_insecure_serves_every_address_without_keys(tmp_path: Path) -> None:
    async with served(tmp_path, insecure=True) as http:
        assert (await http["public"].get("/campaigns")).status_code == 200


async def test_metrics_are_open_over_loopback_and_need_a_metrics_or_admin_key_elsewhere(tmp_path: Path) -> None:
    async with served(tmp_path, api_keys=KEYS) as http:
        assert (await http["loopback"].get("/metrics")).status_code == 200
        assert (await http["public"].get("/metrics")).status_code == 401
        assert (await http["public"].get("/metrics", headers=bearer("decide-key-93ab6f07"))).status_code == 403
        for key in ("metrics-key-0c7f41e9", "admin-key-5e1d28c4"):
            assert (await http["public"].get("/metrics", headers=bearer(key))).status_code == 200
        assert (await http["public"].get("/healthz")).status_code == 200  # the probes stay public
        for method, path in (("POST", "/choose"), ("GET", "/campaigns")):  # a metrics key opens nothing else
            refused = await http["loopback"].request(method, path, headers=bearer("metrics-key-0c7f41e9"), json={})
            assert refused.status_code == 403 and refused.json()["error"] == "forbidden"


@pytest.mark.parametrize(("access", "loopback", "public"), [("key", 401, 401), ("open", 200, 200)])
async def test_metrics_access_setting(tmp_path: Path, access: str, loopback: int, public: int) -> None:
    async with served(tmp_path, api_keys=KEYS, metrics_access=access) as http:
        assert (await http["loopback"].get("/metrics")).status_code == loopback
        assert (await http["public"].get("/metrics")).status_code == public
        assert (await http["public"].get("/metrics", headers=bearer("metrics-key-0c7f41e9"))).status_code == 200
