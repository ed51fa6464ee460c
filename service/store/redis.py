"""The production state store: Redis (single node or Cluster), every state change one Lua script.

Scripts are registered once per client and run by EVALSHA; each touches only the keys of one campaign
(one hash tag), so they are legal on a cluster. The audit entry of a change is XADDed by the same script,
so a state change and its audit record are never separated by a crash.

``/choose`` makes one round trip: the decision uses the counters returned by this worker's previous
decision and a histogram of recent pulls that may be up to ``snapshot_interval`` seconds old. Ñ is
evaluated when the histogram is read; pulls made since weigh 0 until the next read and ages stop
advancing meanwhile, which under-counts Ñ by at most (decisions in the interval)·F(interval) +
interval·Σ f(age), an optimistic error (vernade2017.md §3.4f).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources

import numpy as np
import orjson
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.audit.queue import QueueEntry
from service.audit.records import Outcome, Record
from service.campaign import Campaign, CampaignStatus
from service.store.base import (
    CampaignRefused,
    Counters,
    DecisionResult,
    DecisionStatus,
    Histogram,
    PreparedConversion,
    Pull,
    StateSnapshot,
    StoreUnavailable,
)
from service.store.keys import Keys
from service.timeutil import MICROS, Clock, wall_clock

SCRIPTS = ("create_campaign", "set_status", "record_decision", "record_fallback", "apply_conversions", "fold_matured")
CONVERSIONS_PER_SCRIPT = 1_000
MAX_CONNECTIONS = 128


def _load_script(name: str) -> str:
    return resources.files("service.store").joinpath(f"lua/{name}.lua").read_text()


@dataclass
class _Cached:
    counters: Counters
    histogram: Histogram
    read_at: float  # time.monotonic() of the histogram read


def _client(url: str, cluster: bool) -> aioredis.Redis | aioredis.RedisCluster:
    """A blocking pool: a burst of requests waits for a free connection instead of failing. A cluster
    client discovers the other nodes from ``url`` and routes each command (each script) by its hash tag."""
    timeouts = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
    if cluster:
        return aioredis.RedisCluster.from_url(url, max_connections=MAX_CONNECTIONS, **timeouts)
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=MAX_CONNECTIONS, timeout=2.0, **timeouts)
    return aioredis.Redis(connection_pool=pool)


def parse_counters(raw: dict[bytes, bytes], arms: int) -> Counters:
    counters = Counters.zeros(arms)
    columns = {b"n": counters.pulls, b"s": counters.conversions, b"m": counters.matured}
    for field, value in raw.items():
        if field == b"d":
            counters.decisions = int(value)
            continue
        kind, _, arm = field.partition(b":")
        if kind in columns:
            columns[kind][int(arm)] = float(value) if kind == b"s" else int(value)
    return counters


def parse_histogram(raw: dict[bytes, bytes], components: int) -> Histogram:
    """The cells hash as arrays. Counts and offsets stay integers all the way (an offset sum can pass
    2^53, where a float64 would round it); only the moments are floats."""
    counts: dict[tuple[int, int], list[int]] = {}
    moments: dict[tuple[int, int], list[float]] = {}
    slot = {b"c": 0, b"o": 1, b"v": 2}
    for field, value in raw.items():
        arm, bucket, kind = field.split(b":")
        cell = (int(arm), int(bucket))
        if kind in slot:
            counts.setdefault(cell, [0, 0, 0])[slot[kind]] = int(value)
        else:
            moments.setdefault(cell, [0.0] * components)[int(kind[1:]) - 1] = float(value)
    if not counts:
        return Histogram.empty(components)
    keys = np.array(list(counts), dtype=np.int64)
    ints = np.array(list(counts.values()), dtype=np.int64)
    floats = np.array([moments.get(cell, [0.0] * components) for cell in counts], dtype=np.float64)
    return Histogram(
        keys[:, 0], keys[:, 1], ints[:, 0], ints[:, 1], ints[:, 2], floats.reshape(len(counts), components)
    )


class RedisStore:
    def __init__(
        self,
        url: str,
        prefix: str = "lb",
        client: aioredis.Redis | aioredis.RedisCluster | None = None,
        clock: Clock = wall_clock,
        cluster: bool = False,
    ) -> None:
        self._clock = clock  # for the expiry of deduplication entries
        self.client = client or _client(url, cluster)
        # The cluster client's per-node pools raise MaxConnectionsError when full instead of waiting, so
        # the store itself makes a burst wait, as the single-node blocking pool does.
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS) if cluster else contextlib.nullcontext()
        self.keys = Keys(prefix)
        self._scripts: dict[str, AsyncScript] = {
            name: self.client.register_script(_load_script(name)) for name in SCRIPTS
        }
        self._cache: dict[str, _Cached] = {}
        self._refreshing: dict[str, asyncio.Future[StateSnapshot]] = {}
        self._owner = os.urandom(8).hex()  # this process, as holder of audit leases

    async def close(self) -> None:
        await self.client.aclose()

    @asynccontextmanager
    async def _reachable(self) -> AsyncIterator[None]:
        try:
            async with self._slots:
                yield
        except (RedisConnectionError, OSError) as error:
            await self._drop_idle_connections()
            raise StoreUnavailable(f"Redis unreachable: {error}") from error
        except RedisTimeoutError as error:
            raise StoreUnavailable(f"Redis unreachable: {error}") from error
        except RedisError as error:  # READONLY replica, OOM, a failed script: the store cannot take writes
            raise StoreUnavailable(f"Redis refused the operation: {error}") from error

    async def _drop_idle_connections(self) -> None:
        """A broken connection usually means Redis restarted, and then every pooled connection is dead: close
        the idle ones now, or each would fail one later request (a fallback or a 503), possibly long after
        Redis is back. Commands are never retried instead: a script whose reply was lost may have run."""
        pool = getattr(self.client, "connection_pool", None)  # the cluster client manages its nodes itself
        if pool is not None:
            await pool.disconnect(inuse_connections=False)

    async def _run(self, script: str, keys: Sequence[str], args: Sequence[object]) -> object:
        async with self._reachable():
            return await self._scripts[script](keys=list(keys), args=list(args))

    async def ping(self) -> None:
        async with self._reachable():
            await self.client.ping()

    # campaigns ------------------------------------------------------------------------------------

    def _campaign_keys(self, campaign_id: str) -> list[str]:
        return [self.keys.config(campaign_id), self.keys.counters(campaign_id), self.keys.audit(campaign_id)]

    async def create_campaign(self, campaign: Campaign, record: Record) -> bool:
        created = await self._run(
            "create_campaign", self._campaign_keys(campaign.id), [campaign.model_dump_json(), orjson.dumps(record)]
        )
        async with self._reachable():  # also when it existed: repairs a create interrupted before this step
            await self.client.sadd(self.keys.registry(), campaign.id)
        return bool(created)

    async def get_campaign(self, campaign_id: str) -> Campaign | None:
        async with self._reachable(), self.client.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.config(campaign_id))
            pipe.hget(self.keys.counters(campaign_id), "paused")
            config, paused = await pipe.execute()
        if config is None:
            return None
        status = CampaignStatus.PAUSED if paused == b"1" else CampaignStatus.ACTIVE
        return Campaign.model_validate_json(config).model_copy(update={"status": status})

    async def list_campaigns(self) -> list[str]:
        async with self._reachable():
            members = await self.client.smembers(self.keys.registry())
        return sorted(member.decode() for member in members)

    async def set_status(self, campaign_id: str, status: CampaignStatus, record: Record) -> Campaign | None:
        campaign = await self.get_campaign(campaign_id)
        if campaign is None:
            return None
        campaign = campaign.model_copy(update={"status": status})
        paused = int(status is CampaignStatus.PAUSED)
        changed = await self._run(
            "set_status", self._campaign_keys(campaign_id), [paused, campaign.model_dump_json(), orjson.dumps(record)]
        )
        return campaign if changed else None

    # state ----------------------------------------------------------------------------------------

    async def snapshot(self, campaign: Campaign, max_age: float = 0.0) -> StateSnapshot:
        """With ``max_age`` > 0, one read at a time per campaign: while a refresh is in flight, requests
        keep the previous histogram instead of all reading (and parsing) the same hash at once."""
        if max_age <= 0:
            return await self._read(campaign)
        cached = self._cache.get(campaign.id)
        if cached is not None and time.monotonic() - cached.read_at <= max_age:
            return StateSnapshot(cached.counters, cached.histogram)
        refresh = self._refreshing.get(campaign.id)
        if refresh is None:
            refresh = asyncio.ensure_future(self._read(campaign))
            self._refreshing[campaign.id] = refresh
            refresh.add_done_callback(lambda done: self._refreshed(campaign.id, done))
        if cached is not None and not refresh.done():
            return StateSnapshot(cached.counters, cached.histogram)
        return await asyncio.shield(refresh)

    def _refreshed(self, campaign_id: str, done: asyncio.Future[StateSnapshot]) -> None:
        self._refreshing.pop(campaign_id, None)
        if not done.cancelled():
            done.exception()  # retrieved: a failed refresh is retried by the next request, not logged as lost

    async def _read(self, campaign: Campaign) -> StateSnapshot:
        async with self._reachable(), self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.counters(campaign.id))
            pipe.hgetall(self.keys.cells(campaign.id))
            counters_raw, cells_raw = await pipe.execute()
        components = len(campaign.exact_components)
        counters = parse_counters(counters_raw, len(campaign.arms))
        histogram = parse_histogram(cells_raw, components)
        self._cache[campaign.id] = _Cached(counters, histogram, time.monotonic())
        return StateSnapshot(counters, histogram)

    async def record_decision(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> DecisionResult:
        keys = [self.keys.counters(campaign.id), self.keys.cells(campaign.id), self.keys.audit(campaign.id)]
        if request_id is not None:
            keys.append(self.keys.request(campaign.id, request_id))
        args = [
            pull.arm,
            pull.bucket,
            pull.offset,
            pull.decision_id,
            repr(pull.propensity),
            ttl,
            orjson.dumps(pull.record),
        ]
        status, earlier, raw = await self._run("record_decision", keys, [*args, *map(repr, pull.moments)])
        if status == 3:
            return DecisionResult(DecisionStatus.UNKNOWN)
        if status == 2:
            return DecisionResult(DecisionStatus.PAUSED)
        counters = parse_counters(dict(zip(raw[::2], raw[1::2], strict=True)), len(campaign.arms))
        cached = self._cache.get(campaign.id)
        if cached is not None:
            cached.counters = counters
        if status == 1:
            return _earlier(earlier, counters)
        return DecisionResult(DecisionStatus.NEW, pull.decision_id, pull.arm, pull.propensity, counters)

    async def record_fallback(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> DecisionResult:
        keys = [self.keys.audit(campaign.id)]
        if request_id is not None:
            keys.append(self.keys.request(campaign.id, request_id))
        args = [pull.decision_id, pull.arm, repr(pull.propensity), ttl, orjson.dumps(pull.record)]
        repeated, earlier = await self._run("record_fallback", keys, args)
        if repeated:
            return _earlier(earlier)
        return DecisionResult(DecisionStatus.NEW, pull.decision_id, pull.arm, pull.propensity)

    async def apply_conversions(self, campaign: Campaign, events: list[PreparedConversion]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for start in range(0, len(events), CONVERSIONS_PER_SCRIPT):
            try:
                outcomes += await self._apply_chunk(campaign, events[start : start + CONVERSIONS_PER_SCRIPT])
            except CampaignRefused as refused:
                raise CampaignRefused(str(refused), outcomes) from None
        return outcomes

    async def _apply_chunk(self, campaign: Campaign, events: list[PreparedConversion]) -> list[Outcome]:
        cid, now = campaign.id, self._clock()
        keys = [self.keys.counters(cid), self.keys.cells(cid), self.keys.audit(cid)]
        keys += [self.keys.dedup(cid), self.keys.dedup_expiry(cid)]
        params = [
            [event.event_id or "", event.decision_id, event.counts, event.censored, event.arm, event.bucket,
             repr(event.value), now // MICROS + event.dedup_ttl]
            for event in events
        ]  # fmt: skip
        records = b"\n".join(orjson.dumps(event.record) for event in events)
        raw = await self._run("apply_conversions", keys, [now // MICROS, orjson.dumps(params), records])
        if raw in ([b"unknown"], [b"paused"]):
            raise CampaignRefused(raw[0].decode())
        return [Outcome(outcome.decode()) for outcome in raw]

    async def fold_matured(self, campaign: Campaign, arms: np.ndarray, buckets: np.ndarray) -> None:
        components = len(campaign.exact_components)
        pairs = [value for pair in zip(arms.tolist(), buckets.tolist(), strict=True) for value in pair]
        keys = [self.keys.counters(campaign.id), self.keys.cells(campaign.id)]
        await self._run("fold_matured", keys, [components, *pairs])
        self._cache.pop(campaign.id, None)

    # audit queue ----------------------------------------------------------------------------------

    async def audit_campaigns(self) -> list[str]:
        return await self.list_campaigns()

    async def read_audit(self, campaign: str, limit: int) -> list[QueueEntry]:
        async with self._reachable():
            entries = await self.client.xrange(self.keys.audit(campaign), count=limit)
        return [QueueEntry(campaign, entry_id.decode(), _records(fields)) for entry_id, fields in entries]

    async def ack_audit(self, campaign: str, entry_ids: list[str]) -> None:
        if entry_ids:
            async with self._reachable():
                await self.client.xdel(self.keys.audit(campaign), *entry_ids)

    async def claim_audit(self, campaign: str, seconds: float) -> bool:
        """Take the lease, or keep it if this process holds it; never released (it expires), since a
        drain that outlives it is merely repeated."""
        key, ttl = self.keys.audit_lease(campaign), round(seconds * 1000)
        async with self._reachable():
            if await self.client.set(key, self._owner, nx=True, px=ttl):
                return True
            if await self.client.get(key) == self._owner.encode():
                await self.client.pexpire(key, ttl)
                return True
        return False

    async def audit_backlog(self) -> int:
        campaigns = await self.list_campaigns()
        async with self._reachable(), self.client.pipeline(transaction=False) as pipe:
            for campaign in campaigns:
                pipe.xlen(self.keys.audit(campaign))
            return sum(await pipe.execute())

    # rebuild --------------------------------------------------------------------------------------

    async def replace_state(
        self, campaign: Campaign, counters: Counters, histogram: Histogram, expiring: dict[str, tuple[str, int]]
    ) -> None:
        """Overwrite a campaign's state in one transaction (``latebandit rebuild``). ``expiring`` maps what
        the memory store remembers (``req:…`` request ids, ``ev:…``/``cv:…`` dedup entries) to its value and
        remaining seconds."""
        cid, now = campaign.id, self._clock() // MICROS
        async with self._reachable(), self.client.pipeline(transaction=True) as pipe:
            pipe.delete(*self.keys.state(cid))
            pipe.set(self.keys.config(cid), campaign.model_dump_json())
            _write_counters(pipe, self.keys.counters(cid), campaign, counters)
            _write_histogram(pipe, self.keys.cells(cid), histogram)
            for suffix, (value, seconds) in expiring.items():
                if suffix.startswith("req:"):
                    pipe.set(self.keys.tagged(cid, suffix), value, ex=max(1, seconds))
                else:
                    pipe.hset(self.keys.dedup(cid), suffix, value)
                    pipe.zadd(self.keys.dedup_expiry(cid), {suffix: now + seconds})
            await pipe.execute()
            await self.client.sadd(self.keys.registry(), cid)  # another slot: outside the transaction
        self._cache.pop(cid, None)


def _earlier(stored: bytes, counters: Counters | None = None) -> DecisionResult:
    """The decision a request_id already got, stored as ``decision id|arm|propensity``."""
    decision_id, arm, propensity = stored.decode().split("|")
    return DecisionResult(DecisionStatus.REPEATED, decision_id, int(arm), float(propensity), counters)


def _records(fields: dict[bytes, bytes]) -> list[Record]:
    """Decode a stream entry: ``seq``/``r`` for a single record, or ``position:outcome`` fields."""
    records: list[Record] = []
    seq = None
    for name, value in fields.items():
        if name == b"seq":
            seq = int(value)
        elif name == b"r":
            records.append(orjson.loads(value))
        else:
            records.append({**orjson.loads(value), "outcome": name.partition(b":")[2].decode()})
    if seq is not None:
        records[0]["seq"] = seq
    return records


def _write_counters(pipe: Pipeline, key: str, campaign: Campaign, counters: Counters) -> None:
    mapping: dict[str, int | str] = {"d": counters.decisions, "paused": int(campaign.status is CampaignStatus.PAUSED)}
    for arm in range(len(campaign.arms)):
        mapping |= {f"n:{arm}": int(counters.pulls[arm]), f"s:{arm}": repr(float(counters.conversions[arm]))}
        mapping[f"m:{arm}"] = int(counters.matured[arm])
    pipe.hset(key, mapping=mapping)


def _write_histogram(pipe: Pipeline, key: str, histogram: Histogram) -> None:
    mapping: dict[str, float | int] = {}
    for row in range(len(histogram.count)):
        cell = f"{histogram.arm[row]}:{histogram.bucket[row]}:"
        mapping |= {cell + "c": int(histogram.count[row]), cell + "o": int(histogram.offset[row])}
        mapping[cell + "v"] = int(histogram.converted[row])
        for j, moment in enumerate(histogram.moments[row], start=1):
            mapping[f"{cell}e{j}"] = repr(float(moment))
    if mapping:
        pipe.hset(key, mapping=mapping)
