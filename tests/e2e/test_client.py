"""latebandit.client against real uvicorn servers on a real Redis: decisions and feedback round trips with
``Client`` and ``AsyncClient`` (contextual campaigns' actions and contexts too), retries on a 503 and on lost
connections but never on a 4xx, background batches leaving by size, interval and close, and (issue 31) a
client that sends its conversions through a server killed mid-batch and restarted counts every one of them
exactly once."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx
import numpy as np
import pytest
import redis

from latebandit.client import (
    AsyncClient,
    Batching,
    Client,
    Decision,
    FeedbackNotDelivered,
    RetryPolicy,
    ServiceError,
    Unreachable,
    conversion,
)  # fmt: skip
from latebandit.client.batching import BufferFull
from latebandit.store.keys import Keys
from tests.conftest import REDIS_URL, unavailable
from tests.e2e.server import LATEBANDIT, Server, free_port, running, service_env, started
from tests.e2e.traffic import until
from tests.faults import TcpProxy, tcp_proxy

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

ADMIN, DECIDE = "admin-key-1b7c22d9e0", "decide-key-4f0a9c3e21"
PATIENT = RetryPolicy(attempts=10_000, total=180.0, first_wait=0.05, max_wait=0.5)  # outlasts a restart
# A contextual campaign whose requests offer their own actions (no arms), and an offer of two of them.
RANKED = {"id": "ranked", "policy": {"name": "otf-linucb"}, "features": 2, "window": 3600}
OFFER = [{"id": "top", "features": [0.6, 0.0]}, {"id": "side", "features": [0.0, 0.6]}]


def campaign(name: str) -> dict:
    return {"id": name, "arms": ["a", "b", "c"], "policy": {"name": "delayed-ucb"},
            "delay": {"family": "exponential", "mean": 60.0}, "window": 3600}  # fmt: skip


def conversions_counted(http: httpx.Client, name: str) -> int:
    return sum(arm["conversions"] for arm in http.get(f"/campaigns/{name}/state").json()["arms"].values())


@pytest.fixture(scope="module")
def redis_store() -> Iterator[tuple[str, str]]:
    """(Redis URL, a key prefix of this module's own), its keys deleted afterwards."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as error:
        unavailable(f"Redis at {REDIS_URL}", error)
    prefix = f"lbtest{uuid.uuid4().hex[:12]}"
    yield REDIS_URL, prefix
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)


@pytest.fixture(scope="module")
def server(tmp_path_factory, redis_store) -> Iterator[Server]:
    """One service with API keys, shared by the tests that need no fault (each uses campaigns of its own)."""
    workdir = tmp_path_factory.mktemp("client")
    url, prefix = redis_store
    env = service_env(workdir, redis_url=url, redis_prefix=prefix, api_keys=f"admin:{ADMIN},decide:{DECIDE}")
    with running(env, workdir) as serving:
        yield serving


@pytest.fixture
def admin(server: Server) -> Iterator[httpx.Client]:
    with server.client(headers={"authorization": f"Bearer {ADMIN}"}) as http:
        yield http


def create(admin: httpx.Client, name: str) -> str:
    assert admin.post("/campaigns", json=campaign(name)).status_code == 201
    return name


def test_sync_client_round_trip(server: Server, admin: httpx.Client) -> None:
    name = create(admin, "sync")
    with Client(server.url, api_key=DECIDE) as client:
        decision = client.choose(name, request_id="imp-1")
        assert decision.campaign == name and decision.arm in {"a", "b", "c"} and not decision.fallback
        assert client.choose(name, request_id="imp-1") == decision  # the same request, the same decision
        other = client.choose(name)
        assert other.request_id and other.decision_id != decision.decision_id
        events = [conversion(decision), conversion(decision), conversion("forged"), conversion(other)]
        result = client.feedback(events)
        assert (result.accepted, result.repeats, result.duplicates, result.censored) == (3, 1, 0, 0)
        [rejected] = result.rejected
        assert (rejected.index, rejected.reason, rejected.event) == (2, "bad_decision_id", events[2])
        again = client.feedback(events)  # a retry of the whole list: every event was seen
        assert (again.accepted, again.duplicates, len(again.rejected)) == (0, 3, 1)
    assert admin.get(f"/campaigns/{name}/state").json()["decisions"] == 2
    assert conversions_counted(admin, name) == 2


async def test_async_client_round_trip(server: Server, admin: httpx.Client) -> None:
    name = create(admin, "async")
    async with AsyncClient(server.url, api_key=DECIDE) as client:
        decision = await client.choose(name, request_id="imp-1")
        assert await client.choose(name, request_id="imp-1") == decision
        result = await client.feedback([conversion(decision), conversion("forged")])
        assert result.accepted == 1 and [r.reason for r in result.rejected] == ["bad_decision_id"]
        await client.send(conversion(decision))
    assert client.report.result.repeats == 1  # the queued event was delivered at close
    assert conversions_counted(admin, name) == 1


def test_a_contextual_choice_sends_the_offered_features(server: Server, admin: httpx.Client) -> None:
    """Pairs with a numpy array or a tuple: after the chosen action's conversion, θ̂ = V⁻¹b = a/(1 + ‖a‖²)
    (λ = 1) is the features of the id the decision names, so they reached the service as given."""
    assert admin.post("/campaigns", json=RANKED).status_code == 201
    with Client(server.url, api_key=DECIDE) as client:
        pairs = [("top", np.array([0.6, 0.0])), ("side", (0, 0.6))]
        decision = client.choose("ranked", request_id="r-1", actions=pairs)
        assert decision.arm in {"top", "side"} and not decision.fallback and decision.request_id == "r-1"
        with pytest.raises(ServiceError) as misfit:
            client.choose("ranked", actions=[("top", [0.9, 0.9])])  # norm above 1
        assert (misfit.value.status, misfit.value.code, misfit.value.attempts) == (422, "invalid_request", 1)
        assert "actions[0]" in misfit.value.detail
        assert client.feedback([conversion(decision)]).accepted == 1
    chosen = np.array(next(action["features"] for action in OFFER if action["id"] == decision.arm))
    model = admin.get("/campaigns/ranked/state").json()["model"]
    assert (model["decisions"], model["conversions"]) == (1, 1)
    np.testing.assert_allclose(model["theta"], chosen / (1 + chosen @ chosen))


async def test_async_client_offers_actions_as_mappings_and_a_context(server: Server, admin: httpx.Client) -> None:
    promo = {"id": "promo", "arms": ["a", "b"], "policy": {"name": "linucb"}, "features": 2}
    for body in ({**RANKED, "id": "async-ranked"}, promo):
        assert admin.post("/campaigns", json=body).status_code == 201
    async with AsyncClient(server.url, api_key=DECIDE) as client:
        assert (await client.choose("async-ranked", actions=OFFER)).arm in {"top", "side"}
        assert (await client.choose("promo", context=np.array([0.3, 0.4]))).arm in {"a", "b"}
    assert admin.get("/campaigns/promo/state").json()["model"]["decisions"] == 1


def test_a_4xx_is_raised_at_once_and_never_retried(server: Server, admin: httpx.Client, caplog) -> None:
    caplog.set_level(logging.WARNING, "latebandit.client")
    with Client(server.url, api_key=DECIDE, retry=PATIENT) as client:
        with pytest.raises(ServiceError) as unknown:
            client.choose("no-such-campaign")
        assert (unknown.value.status, unknown.value.code, unknown.value.attempts) == (404, "unknown_campaign", 1)
    for key in (None, "not-a-key"):
        with Client(server.url, api_key=key, retry=PATIENT) as client, pytest.raises(ServiceError) as refused:
            client.feedback([conversion("d")])
        assert (refused.value.status, refused.value.attempts) == (401, 1)
    with Client(server.url, api_key=ADMIN, retry=PATIENT) as client:  # admin may do everything
        assert client.choose(create(admin, "keys")).campaign == "keys"
    assert not [record for record in caplog.records if "retrying" in record.getMessage()]


def test_a_connection_refused_is_retried_until_the_attempts_run_out(caplog) -> None:
    caplog.set_level(logging.WARNING, "latebandit.client")
    retry = RetryPolicy(attempts=3, total=60.0, first_wait=0.01, max_wait=0.02)
    with Client(f"http://127.0.0.1:{free_port()}", retry=retry) as client, pytest.raises(Unreachable) as gave_up:
        client.choose("c")
    assert gave_up.value.attempts == 3 and isinstance(gave_up.value.__cause__, httpx.ConnectError)
    assert len([record for record in caplog.records if "retrying" in record.getMessage()]) == 2


def test_a_503_is_retried_until_the_store_is_back(tmp_path, redis_url, redis_prefix, caplog) -> None:
    """Redis cut off: /feedback answers 503 store_unavailable, the client waits and retries; once Redis is
    back its retry is accepted, once."""
    caplog.set_level(logging.WARNING, "latebandit.client")

    def retried_503() -> bool:
        return any("retrying" in r.getMessage() and " 503 " in r.getMessage() for r in caplog.records)

    with tcp_proxy(redis_url) as (proxy, proxied):
        env = service_env(tmp_path, redis_url=proxied, redis_prefix=redis_prefix)
        with running(env, tmp_path) as serving, serving.client() as http, Client(serving.url, retry=PATIENT) as client:
            name = create(http, "cut")
            decision = client.choose(name)
            proxy.cut()
            answers: list = []
            sender = threading.Thread(target=lambda: answers.append(client.feedback([conversion(decision)])))
            sender.start()
            until(retried_503, "a 503 retried")
            proxy.restore()
            sender.join(timeout=120)
            [result] = answers
            assert result.accepted == 1 and result.duplicates == 0
            until(lambda: http.get(f"/campaigns/{name}/state").status_code == 200, "the state readable again")
            assert conversions_counted(http, name) == 1


def test_background_batches_leave_by_size_by_interval_and_at_close(server: Server, admin: httpx.Client) -> None:
    name = create(admin, "batches")
    with Client(server.url, api_key=DECIDE) as client:
        decisions = [client.choose(name) for _ in range(9)]
    by_size = Client(server.url, api_key=DECIDE, batching=Batching(size=3, interval=3600.0))
    for decision in decisions[:3]:
        by_size.send(conversion(decision))
    until(lambda: conversions_counted(admin, name) == 3, "a full batch sent without flush or close")
    by_interval = Client(server.url, api_key=DECIDE, batching=Batching(size=1000, interval=0.05))
    by_interval.send(conversion(decisions[3]))
    until(lambda: conversions_counted(admin, name) == 4, "a batch sent when its interval was over")
    at_close = Client(server.url, api_key=DECIDE, batching=Batching(size=1000, interval=3600.0))
    for decision in decisions[4:]:
        at_close.send(conversion(decision))
    at_close.send(conversion("forged"))
    assert conversions_counted(admin, name) == 4  # nothing sent yet: the batch is neither full nor due
    report = at_close.close()
    assert report.result.accepted == 5 and [r.reason for r in report.result.rejected] == ["bad_decision_id"]
    assert conversions_counted(admin, name) == 9
    assert by_size.close().result.accepted == 3 and by_interval.close().result.accepted == 1


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """``until`` for a test on the event loop: it waits without blocking the client's background task."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout}s"
        await asyncio.sleep(0.05)


async def test_async_background_batches_flush_and_leave_by_interval(server: Server, admin: httpx.Client) -> None:
    name = create(admin, "async-batches")
    async with AsyncClient(server.url, api_key=DECIDE, batching=Batching(size=1000, interval=0.05)) as client:
        decisions = [await client.choose(name) for _ in range(3)]
        await client.send(conversion(decisions[0]))
        await eventually(lambda: conversions_counted(admin, name) == 1, "a batch sent when its interval was over")
    async with AsyncClient(server.url, api_key=DECIDE, batching=Batching(size=1000, interval=3600.0)) as client:
        for decision in decisions[1:]:
            await client.send(conversion(decision))
        report = await client.flush()
        assert report.result.accepted == 2 and conversions_counted(admin, name) == 3


def test_a_full_buffer_blocks_and_undelivered_events_are_reported_at_close() -> None:
    """Nothing listens: the first event is in flight, retried; the buffer (room for one) makes the next
    ``send`` wait, here until its timeout; ``close`` reports the event that never got through."""
    retry = RetryPolicy(attempts=20, total=60.0, first_wait=0.01, max_wait=0.05)
    client = Client(f"http://127.0.0.1:{free_port()}", retry=retry, batching=Batching(size=1, capacity=1))
    first = conversion("d1")
    client.send(first)
    with pytest.raises(BufferFull):
        client.send(conversion("d2"), timeout=0.01)
    with pytest.raises(FeedbackNotDelivered) as failed:
        client.close()
    [undelivered] = failed.value.report.undelivered
    assert undelivered.events == [first] and isinstance(undelivered.error, Unreachable)


async def choose_many(url: str, name: str, count: int, concurrency: int = 8) -> list[Decision]:
    """``count`` decisions, ``concurrency`` asked at a time."""
    async with AsyncClient(url) as client:

        async def some(share: int) -> list[Decision]:
            return [await client.choose(name) for _ in range(share)]

        shares = await asyncio.gather(*(some(len(range(k, count, concurrency))) for k in range(concurrency)))
    return [decision for share in shares for decision in share]


def wait_until_applied_past(seen: redis.Redis, dedup_key: str, members: int) -> None:
    """Pause Redis writes as soon as the dedup set grows past ``members``: the batch in flight has had its
    first chunk applied (1,000 conversions per script), and the next one waits (tests/e2e/test_faults.py's
    freeze_after_first_chunk, counting from a set that already holds earlier batches)."""
    deadline = time.monotonic() + 60
    while seen.zcard(dedup_key) <= members:
        assert time.monotonic() < deadline, "the batch was not applied within 60 s"
    seen.client_pause(10_000, all=False)


class AnswerSwallower(TcpProxy):
    """A proxy in front of the service that, while ``swallowing``, passes requests on and drops the answers:
    the service applies a batch and its client never hears of it, whatever the race with a kill."""

    swallowing = False

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        answers = source in self._upstreams.values()
        super()._pump(source, cast(socket.socket, Swallowed(sink, self)) if answers else sink)


@dataclass(eq=False)  # hashable: the proxy keeps its sockets in a set
class Swallowed:
    sock: socket.socket
    proxy: AnswerSwallower

    def sendall(self, data: bytes) -> None:
        if not self.proxy.swallowing:
            self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


@pytest.mark.slow  # 1,300 decisions to convert, two server starts
def test_a_client_retrying_through_a_killed_and_restarted_server_counts_every_conversion_once(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """Three stretches of background feedback: 100 conversions acknowledged; a batch of 1,100 whose answer
    is lost and whose server is killed (SIGKILL) once the batch's first chunk is applied (the rest may be
    too); 100 more queued while no server listens. The service comes back on the same port, the client's
    retries go through, and the state counts each of the 1,300 conversions once: the events the killed
    server had applied came back as duplicates."""
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix)
    port = free_port()
    command = [*LATEBANDIT, "serve", "--port", str(port), "--workers", "1"]
    proxy = AnswerSwallower("127.0.0.1", port)
    proxy.restore()
    client = Client(f"http://127.0.0.1:{proxy.port}", retry=PATIENT,
                    batching=Batching(size=1100, interval=3600.0, capacity=5000))  # fmt: skip
    try:
        with started(command, env, tmp_path, port) as first, first.client() as http:
            name = create(http, "restart")
            decisions = asyncio.run(choose_many(first.url, name, 1300))
            for decision in decisions[:100]:
                client.send(conversion(decision))
            assert client.flush().result.accepted == 100
            seen = redis.Redis.from_url(redis_url)
            proxy.swallowing = True
            for decision in decisions[100:1200]:  # a full batch: it leaves at once
                client.send(conversion(decision))
            wait_until_applied_past(seen, Keys(redis_prefix).dedup(name), 200)  # a conversion holds 2 members
            try:
                os.killpg(first.process.pid, signal.SIGKILL)
                first.process.wait()
            finally:
                seen.client_unpause()
            proxy.swallowing = False
            for decision in decisions[1200:]:
                client.send(conversion(decision))
        with started(command, env, tmp_path, port) as second, second.client() as http:
            report = client.close()
            result = report.result
            assert not report.undelivered and not result.rejected
            assert 0 < result.duplicates <= 1100 and result.accepted + result.duplicates == 1300
            assert conversions_counted(http, name) == 1300
            assert http.get(f"/campaigns/{name}/state").json()["decisions"] == 1300
    finally:
        proxy.cut()
