"""The baseline of the /choose benchmark: a bare FastAPI endpoint that parses the same body and makes one
Redis round trip, served by the same uvicorn settings."""

from __future__ import annotations

import os

import orjson
import redis.asyncio as aioredis
from fastapi import FastAPI, Response
from pydantic import BaseModel


class ChooseRequest(BaseModel):
    campaign: str
    request_id: str | None = None


def create_app() -> FastAPI:
    app = FastAPI()
    client = aioredis.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))

    @app.post("/choose")
    async def choose(body: ChooseRequest) -> Response:
        value = await client.get(f"bench:{{{body.campaign}}}:counter")
        return Response(orjson.dumps({"campaign": body.campaign, "value": value and value.decode()}),
                        media_type="application/json")  # fmt: skip

    return app
