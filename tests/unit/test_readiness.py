"""GET /readyz says which dependency is unavailable, never why: the route is public (issue 19)."""

from __future__ import annotations

import httpx

from latebandit.api.app import create_app
from latebandit.config import Settings


async def test_readiness_names_what_is_down_without_its_internals() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:1/0", database_url="postgresql://auditor@127.0.0.1:1/nowhere",
                        secret="readiness-test-secret-0123456789abcdef")  # fmt: skip
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client,
    ):
        answer = await client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json() == {"ready": False, "checks": {"store": "unavailable", "audit": "unavailable"}}
    assert not any(secret in answer.text for secret in ("127.0.0.1", "nowhere", "auditor", "refused", ":1"))
