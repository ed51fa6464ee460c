"""The baseline of the /choose benchmark: a bare FastAPI endpoint that validates the same body and makes one
Redis round trip (a one-line script: EVALSHA of an HINCRBY), served by the same uvicorn settings."""

from __future__ import annotations

import os

import orjson
import redis.asyncio as aioredis
from fastapi import FastAPI, Response
from pydantic import BaseModel

COUNT = "return redis.call('HINCRBY', KEYS[1], 'n', 1)"


class ChooseRequest(BaseModel):
    campaign: str
    request_id: str | None = None


def create_app() -> FastAPI:
    app = FastAPI()
    client = aioredis.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    count = client.register_script(COUNT)

    @app.post("/choose")
    async def choose(body: ChooseRequest) -> Response:
        value = await count(keys=[f"bench:{{{body.campaign}}}:counter"])
        return Response(orjson.dumps({"campaign": body.campaign, "value": value}), media_type="application/json")

    return app
