"""The production state store: Redis (single node or Cluster), every state change one Lua script.

Scripts are registered once per client and run by EVALSHA; each touches only the keys of one campaign
(one hash tag), so they are legal on a cluster. The audit entry of a change is XADDed by the same script,
so a state change and its audit record are never separated by a crash.

``/choose`` makes one round trip: the decision uses the counters returned by this worker's previous
decision and a histogram of recent pulls that may be up to ``snapshot_interval`` seconds old. Ñ is
evaluated when the histogram is read; pulls made since weigh 0 until the next read and ages stop
advancing meanwhile, which under-counts Ñ by at most (decisions in the interval)·F(interval) +
interval·Σ f(age), an optimistic error (docs/design-notes.md, "How Ñ is computed").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import numpy as np
import orjson
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, FieldT

from latebandit import metrics
from latebandit.audit.queue import QueueEntry
from latebandit.audit.records import Outcome, Record
from latebandit.campaign import Campaign, CampaignStatus
from latebandit.delays.tail import BUCKETS
from latebandit.policies.schedule import Observed, Plan, Segment
from latebandit.store.base import (
    AnonymousEvent,
    CampaignMoved,
    CampaignRefused,
    Counters,
    Decided,
    DecisionResult,
    DecisionStatus,
    Histogram,
    LinearSums,
    PreparedConversion,
    Pull,
    StateSnapshot,
    StateUnreadable,
    StateVersion,
    StoreUnavailable,
    grams_by_block,
)
from latebandit.store.keys import Keys
from latebandit.store.schedule import (
    Claim,
    ClaimStatus,
    PlayedSegment,
    RewardBounds,
    ScheduleBook,
    ScheduleView,
    Uncredited,
    next_slot,
)
from latebandit.store.script_calls import ScriptConnections
from latebandit.timeutil import MICROS, Clock, wall_clock

SCRIPTS = (
    *("create_campaign", "set_status", "change_policy", "change_arms", "archive_campaign", "purge_campaign"),
    *("record_decisions", "record_fallback", "claim_audit"),
    *("apply_conversions", "fold_matured", "claim_slots", "commit_plan", "apply_anonymous", "fold_model"),
)
LIBRARY_MARK = "-- requires: "
CONVERSIONS_PER_SCRIPT = 1_000
# Decisions a contextual campaign's ``decided`` string holds before a worker folds them into its model: a read
# adds them up each time (at d = 50, 512 of them are 200 KB and 1.3·10⁶ multiply-adds, a tenth of a millisecond
# once per read), and a fold costs a read and a write of the grams.
FOLD_AFTER = 512
MAX_CONNECTIONS = 128
SOCKET_TIMEOUT = 2.0  # seconds a Redis call, or the wait for a connection, may take: then Redis is unreachable
# What hset's mapping takes. Annotated so: redis types its key as a union in an (invariant) Mapping, which
# no dict[str, ...] matches.
HashFields = dict[FieldT, EncodableT]

logger = logging.getLogger(__name__)


def _load_script(name: str) -> str:
    """A script's source, with the libraries it names on its first line (``-- requires: lib, lib``), and
    theirs, prepended once each, dependencies first: Redis scripts cannot include each other, and the
    scripts share their refusal order (campaign_lib), the schedule's closing rule, the deduplication sweep."""
    return "".join(_source(part) for part in _with_libraries(name, []))


def _source(name: str) -> str:
    return resources.files("latebandit.store").joinpath(f"lua/{name}.lua").read_text()


def _with_libraries(name: str, done: list[str]) -> list[str]:
    """``name`` after every library it requires, transitively, each listed once (in ``done``)."""
    first = _source(name).partition("\n")[0]
    if first.startswith(LIBRARY_MARK):
        for library in first.removeprefix(LIBRARY_MARK).split(","):
            if library.strip() not in done:
                _with_libraries(library.strip(), done)
    done.append(name)
    return done


@dataclass
class _Cached:
    counters: Counters
    histogram: Histogram
    delays: np.ndarray
    read_at: int  # the store's clock (µs) at the histogram (and delay histogram) read
    read: int  # which read it is: this store numbers its reads, so that a new one is a new StateVersion
    policy: int  # the policy version it was read for: a policy change resets the state
    arms: int  # the arms version it was read for: its arrays have one entry per arm of that arm set
    stamp: bytes  # the counters' write stamp ``w`` they carry (campaign_lib.lua's stamp_counters)
    model: LinearSums | None = None  # a contextual campaign's, as read plus this worker's counted decisions since
    # ``model`` plus the decisions being recorded, summed while their script runs (``sum_ahead``): the sums
    # it was computed from, those decisions, and the result, which ``add_own`` takes if all were new
    ahead: tuple[LinearSums, list[Decided], LinearSums] | None = None

    def version(self) -> StateVersion:
        return StateVersion(self.policy, self.read, self.stamp, self.counters.decisions)

    def snapshot(self) -> StateSnapshot:
        return StateSnapshot(self.counters, self.histogram, self.delays, self.version(), self.model)

    def sum_ahead(self, decisions: list[Decided]) -> None:
        """``model`` plus ``decisions``, computed before the store says they are new: the worker would wait
        for the store's reply meanwhile."""
        if self.model is not None:
            self.ahead = (self.model, decisions, self.model.with_decisions(decisions))

    def add_own(self, decisions: list[Decided], new: list[bool]) -> None:
        """This worker's recorded ``decisions`` (``new``: those the store counted) join its model: summed ahead
        if all were new and the model is the one they were summed on, else (a retried request among them)
        summed now."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead[0] is self.model and ahead[1] is decisions and all(new):
            self.model = ahead[2]
        elif self.model is not None and (counted := [d for d, n in zip(decisions, new, strict=True) if n]):
            self.model = self.model.with_decisions(counted)


def _client(url: str, cluster: bool) -> aioredis.Redis | aioredis.RedisCluster:
    """A blocking pool: a burst of requests waits for a free connection instead of failing. A cluster
    client discovers the other nodes from ``url`` and routes each command (each script) by its hash tag."""
    timeouts = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT}
    if cluster:
        return aioredis.RedisCluster.from_url(url, max_connections=MAX_CONNECTIONS, **timeouts)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=SOCKET_TIMEOUT, **timeouts
    )
    return aioredis.Redis.from_pool(pool)  # owns it: closing the client closes the pool's connections


def parse_counters(raw: dict[bytes, bytes], arms: int) -> Counters:
    """The counters hash (``d``, and ``n:``, ``s:``, ``m:``, ``c:`` per arm) as arrays: each field looked up by
    its name, which a decision's reply makes worth it (a third less than splitting every field's name)."""
    pulls, sums, matured, counted = _counter_fields(arms)
    get = raw.get
    return Counters(
        int(get(b"d", 0)),
        np.array([int(get(field, 0)) for field in pulls], dtype=np.int64),
        np.array([float(get(field, 0)) for field in sums], dtype=np.float64),
        np.array([int(get(field, 0)) for field in matured], dtype=np.int64),
        np.array([int(get(field, 0)) for field in counted], dtype=np.int64),
    )


@functools.cache
def _counter_fields(arms: int) -> tuple[list[bytes], ...]:
    return tuple([f"{kind}:{arm}".encode() for arm in range(arms)] for kind in "nsmc")


def _stamp(counters: dict[bytes, bytes]) -> bytes:
    """The counters' write stamp ``w`` (campaign_lib.lua), '0' before any: record_decisions.lua reads it so."""
    return counters.get(b"w", b"0")


def parse_histogram(raw: dict[bytes, bytes], components: int) -> Histogram:
    """The cells hash as arrays. Counts and offsets stay integers all the way (an offset sum can pass
    2^53, where a float64 would round it); only the moments are floats."""
    counts: dict[tuple[int, int], list[int]] = {}
    moments: dict[tuple[int, int], list[float]] = {}
    footprints: dict[tuple[int, int], float] = {}
    slot = {b"c": 0, b"o": 1, b"v": 2}
    for field, value in raw.items():
        arm, bucket, kind = field.split(b":")
        cell = (int(arm), int(bucket))
        if kind in slot:
            counts.setdefault(cell, [0, 0, 0])[slot[kind]] = int(value)
        elif kind == b"f":
            footprints[cell] = float(value)
        else:
            moments.setdefault(cell, [0.0] * components)[int(kind[1:]) - 1] = float(value)
    if not counts:
        return Histogram.empty(components)
    keys = np.array(list(counts), dtype=np.int64)
    ints = np.array(list(counts.values()), dtype=np.int64)
    floats = np.array([moments.get(cell, [0.0] * components) for cell in counts], dtype=np.float64)
    footprint = np.array([footprints.get(cell, 0.0) for cell in counts]) if footprints else None
    return Histogram(
        keys[:, 0], keys[:, 1], ints[:, 0], ints[:, 1], ints[:, 2], floats.reshape(len(counts), components),
        footprint,
    )  # fmt: skip


def parse_model(raw: dict[bytes, bytes], decided: bytes | None, blocks: int, d: int) -> LinearSums:
    """The model hash (float64 blobs ``g:k``, ``b:k``; store/keys.py) plus the decisions of ``decided`` not
    folded into it yet, as LinearSums; absent: 0. ValueError for what the scripts never write."""
    model = LinearSums.zeros(blocks, d)
    for field, value in raw.items():
        if field == b"fold":
            continue
        kind, block = field.split(b":")
        target = model.gram if kind == b"g" else model.reward
        target[int(block)] = np.frombuffer(value, dtype="<f8").reshape(target.shape[1:])
    if decided:
        for number, gram in decided_grams(decided, blocks, d).items():
            model.gram[number] += gram
    return model


def decided_bytes(campaign: Campaign, decisions: int) -> int:
    """The length of a ``decided`` string holding ``decisions`` entries: d + 1 float64 each."""
    return decisions * ((campaign.features or 0) + 1) * 8


def decided_grams(decided: bytes, blocks: int, d: int) -> dict[int, np.ndarray]:
    """Per block, the Σ AAᵀ of the decisions in a ``decided`` string (record_decisions.lua's entries: block,
    then features; ValueError for a string that is not whole entries of known blocks)."""
    entries = np.frombuffer(decided, dtype="<f8").reshape(-1, d + 1)
    block = entries[:, 0].astype(np.int64)
    if not ((block == entries[:, 0]) & (block >= 0) & (block < blocks)).all():
        raise ValueError("a decided entry names no block of the campaign")
    return grams_by_block(block, entries[:, 1:])


def parse_delays(raw: dict[bytes, bytes], arms: int) -> np.ndarray:
    """The delays hash (``arm:bucket`` → count) as a (K, buckets) int64 array."""
    delays = np.zeros((arms, BUCKETS), dtype=np.int64)
    for field, value in raw.items():
        arm, bucket = field.split(b":")
        delays[int(arm), int(bucket)] = int(value)
    return delays


# a feedback script's answer per event, decoded by lookup
OUTCOMES: dict[bytes, Outcome | Uncredited] = {answer.value.encode(): answer for answer in (*Outcome, *Uncredited)}
BATCH_REFUSALS = {  # a feedback script's whole answer when the campaign refuses the batch (campaign_lib.lua)
    status.value.encode(): status
    for status in (DecisionStatus.UNKNOWN, DecisionStatus.PAUSED, DecisionStatus.MOVED, DecisionStatus.ARCHIVED)
}


def _raise_refusal(raw: list[bytes]) -> None:
    if len(raw) == 1 and raw[0] in BATCH_REFUSALS:
        raise CampaignRefused(BATCH_REFUSALS[raw[0]])


class ScriptProtocolError(RuntimeError):
    """A script answered what its Lua header says it never does: the Python and Lua sides disagree (a bug)."""


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
        # One node: scripts go on connections of their own, past redis-py's per-command layers (store/script_calls.py).
        self._direct = (
            None
            if isinstance(self.client, aioredis.RedisCluster)
            else ScriptConnections(self.client, MAX_CONNECTIONS, SOCKET_TIMEOUT)
        )
        self._cache: dict[str, _Cached] = {}
        self._reads = itertools.count(1)  # numbers each read of a campaign's state (StateVersion.read)
        self._refreshing: dict[tuple[str, int, int], asyncio.Future[StateSnapshot]] = {}  # by campaign, versions
        self._owner = os.urandom(8).hex()  # this process, as holder of audit leases
        self._folding: dict[str, asyncio.Future[bool]] = {}  # per contextual campaign, its fold in flight

    async def close(self) -> None:
        folds = list(self._folding.values())
        for fold in folds:
            fold.cancel()
        await asyncio.gather(*folds, return_exceptions=True)
        await self.client.aclose()
        if self._direct is not None:
            await self._direct.close()

    @asynccontextmanager
    async def _reachable(self, operation: str) -> AsyncIterator[None]:
        """Times the call (``latebandit_store_seconds``) and turns Redis failures into StoreUnavailable."""
        started = time.perf_counter()
        try:
            async with self._slots:
                yield
        except (RedisTimeoutError, TimeoutError) as error:  # redis-py's socket timeout, or a script call's
            raise StoreUnavailable(f"Redis unreachable: {error or 'no reply in time'}") from error
        except (RedisConnectionError, OSError) as error:
            await self._drop_idle_connections()
            raise StoreUnavailable(f"Redis unreachable: {error}") from error
        except RedisError as error:  # READONLY replica, OOM, a failed script: the store cannot take writes
            raise StoreUnavailable(f"Redis refused the operation: {error}") from error
        finally:
            metrics.store_latency(operation).observe(time.perf_counter() - started)

    async def _drop_idle_connections(self) -> None:
        """A broken connection usually means Redis restarted, and then every pooled connection is dead: close
        the idle ones now, or each would fail one later request (a fallback or a 503), possibly long after
        Redis is back. Commands are never retried instead: a script whose reply was lost may have run."""
        pool = getattr(self.client, "connection_pool", None)  # the cluster client manages its nodes itself
        if pool is not None:
            await pool.disconnect(inuse_connections=False)
        if self._direct is not None:
            await self._direct.disconnect()

    async def _run(self, script: str, keys: Sequence[str], args: Sequence[EncodableT]) -> Any:
        """The script's reply: its shape is that script's contract (the Lua header), which Redis leaves untyped."""
        async with self._reachable(script):
            if self._direct is not None:
                return await self._direct.run(self._scripts[script], keys, args)
            return await self._scripts[script](keys=list(keys), args=list(args))

    async def ping(self) -> None:
        async with self._reachable("ping"):
            await self.client.ping()

    # campaigns ------------------------------------------------------------------------------------

    def _campaign_keys(self, campaign_id: str) -> list[str]:
        return [self.keys.config(campaign_id), self.keys.counters(campaign_id), self.keys.audit(campaign_id)]

    async def create_campaign(self, campaign: Campaign, record: Record) -> bool:
        created = await self._run(
            "create_campaign", self._campaign_keys(campaign.id), [campaign.model_dump_json(), orjson.dumps(record)]
        )
        async with self._reachable("campaign"):  # also when it existed: repairs a create interrupted before this step
            await self.client.sadd(self.keys.registry(), campaign.id)
        return bool(created)

    async def get_campaign(self, campaign_id: str) -> Campaign | None:
        """The stored campaign; once an archived campaign's state is purged, its copy in the archived registry."""
        async with self._reachable("campaign"), self.client.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.config(campaign_id))
            pipe.hmget(self.keys.counters(campaign_id), "paused", "archived")
            config, (paused, archived) = await pipe.execute()
        if config is None:
            return await self._archived_copy(campaign_id)
        campaign = Campaign.model_validate_json(config)
        if archived is not None:
            return campaign.archived(int(archived))
        status = CampaignStatus.PAUSED if paused == b"1" else CampaignStatus.ACTIVE
        return campaign.model_copy(update={"status": status})

    async def _archived_copy(self, campaign_id: str) -> Campaign | None:
        async with self._reachable("campaign"):
            stored = await self.client.hget(self.keys.archived(), campaign_id)
        return None if stored is None else Campaign.model_validate_json(stored)

    async def _registered(self) -> list[str]:
        """Every campaign with keys: the live ones and the archived ones not purged yet."""
        async with self._reachable("campaign"):
            members = cast(set[bytes], await self.client.smembers(self.keys.registry()))  # no decode_responses
        return sorted(member.decode() for member in members)

    async def _archived_among(self, campaigns: list[str]) -> dict[str, Campaign]:
        """Those of ``campaigns`` the archived registry holds, as archived."""
        if not campaigns:
            return {}
        async with self._reachable("campaign"):
            stored = await self.client.hmget(self.keys.archived(), campaigns)
        return {cid: Campaign.model_validate_json(raw) for cid, raw in zip(campaigns, stored, strict=True) if raw}

    async def list_campaigns(self) -> list[str]:
        registered = await self._registered()
        archived = await self._archived_among(registered)
        return [campaign for campaign in registered if campaign not in archived]

    async def list_archived(self) -> list[str]:
        async with self._reachable("campaign"):
            names = cast(list[bytes], await self.client.hkeys(self.keys.archived()))
        return sorted(name.decode() for name in names)

    async def set_status(self, campaign_id: str, status: CampaignStatus, record: Record) -> Campaign | None:
        campaign = await self.get_campaign(campaign_id)
        if campaign is None or campaign.archived_at is not None:
            return campaign
        paused = int(status is CampaignStatus.PAUSED)
        changed = await self._run("set_status", self._campaign_keys(campaign_id), [paused, orjson.dumps(record)])
        if changed == -1:  # archived since it was read
            return await self.get_campaign(campaign_id)
        return campaign.model_copy(update={"status": status}) if changed else None

    async def archive(self, campaign: Campaign, record: Record) -> Campaign | None:
        """The script archives the state (atomically with the audit record); the archived registry, in another
        slot, is written after it, again by a repeated archive, and by the purge before the state goes."""
        assert campaign.archived_at is not None and campaign.feedback_until is not None
        args: list[EncodableT] = [campaign.archived_at, campaign.feedback_until, orjson.dumps(record)]
        done = await self._run("archive_campaign", self._campaign_keys(campaign.id), args)
        archived = campaign if done == 1 else await self.get_campaign(campaign.id)
        if archived is not None and archived.archived_at is not None:
            await self._register_archived(archived)
            self._cache.pop(campaign.id, None)
        return archived

    async def _register_archived(self, campaign: Campaign) -> None:
        async with self._reachable("campaign"):
            await self.client.hset(self.keys.archived(), campaign.id, campaign.model_dump_json())

    async def purge_archived(self, now: int) -> list[str]:
        """Per archived campaign due: the script deletes its keys with fixed names, if its audit queue is
        drained; then its request-id keys go (found by SCAN: a sweep is rare, once per archived campaign), and
        last its id leaves the registry, so that a sweep cut short anywhere is finished by the next one."""
        purged = []
        for campaign in (await self._archived_among(await self._registered())).values():
            assert campaign.feedback_until is not None
            if campaign.feedback_until >= now:
                continue
            await self._register_archived(campaign)  # before the state goes: an archive cut short is completed
            cid = campaign.id
            counters, audit = self.keys.counters(cid), self.keys.audit(cid)
            rest = [key for key in self.keys.purged(cid) if key not in (counters, audit)]
            if not await self._run("purge_campaign", [counters, audit, *rest], [now]):
                continue
            async with self._reachable("purge"):
                requests = [
                    key for pattern in (self.keys.requests(cid), self.keys.all_features(cid))
                    async for key in self.client.scan_iter(match=pattern, count=1000)
                ]  # fmt: skip
                for start in range(0, len(requests), 1000):  # one slot: one DEL on a cluster too
                    await self.client.delete(*requests[start : start + 1000])
                await self.client.srem(self.keys.registry(), cid)
            self._cache.pop(cid, None)
            purged.append(cid)
        return purged

    async def change_policy(
        self, campaign: Campaign, record: Record, arms_before: int | None = None
    ) -> Campaign | None:
        cid = campaign.id
        keys = [self.keys.config(cid), self.keys.counters(cid), self.keys.cells(cid), self.keys.audit(cid)]
        keys += [*(name(cid) for name in self.keys.schedule_names()), self.keys.model(cid), self.keys.decided(cid)]
        before = campaign.arms_version if arms_before is None else arms_before
        args: list[EncodableT] = [campaign.model_dump_json(), campaign.version, orjson.dumps(record), before,
                                  campaign.arms_version]  # fmt: skip
        return await self._changed(campaign, await self._run("change_policy", keys, args))

    async def change_arms(self, campaign: Campaign, record: Record) -> Campaign | None:
        args: list[EncodableT] = [campaign.model_dump_json(), campaign.version, campaign.arms_version - 1,
                                  campaign.arms_version, orjson.dumps(record)]  # fmt: skip
        return await self._changed(campaign, await self._run("change_arms", self._campaign_keys(campaign.id), args))

    async def _changed(self, campaign: Campaign, answer: int) -> Campaign | None:
        """The stored campaign after a configuration change's script answered 1; None if it answered 0 (unknown
        campaign), CampaignMoved for -1 (a concurrent change); the stored, archived campaign for -2."""
        if answer == -1:
            raise CampaignMoved(campaign.id)
        if answer == -2:
            return await self.get_campaign(campaign.id)
        self._cache.pop(campaign.id, None)
        return await self.get_campaign(campaign.id) if answer else None

    # state ----------------------------------------------------------------------------------------

    async def snapshot(self, campaign: Campaign, max_age: float = 0.0) -> StateSnapshot:
        """With ``max_age`` > 0, one read at a time per campaign: while a refresh is in flight, requests
        keep the previous histogram instead of all reading (and parsing) the same hash at once."""
        if max_age <= 0:
            return await self._read(campaign)
        held = self.held(campaign, max_age)
        if held is not None:
            return held
        cached = self._cached(campaign)
        key = (campaign.id, campaign.version, campaign.arms_version)
        refresh = self._refreshing.get(key)
        if refresh is None:
            refresh = asyncio.ensure_future(self._read(campaign))
            self._refreshing[key] = refresh
            refresh.add_done_callback(lambda done: self._refreshed(key, done))
        if cached is not None and not refresh.done():
            return cached.snapshot()
        return await asyncio.shield(refresh)

    def held(self, campaign: Campaign, max_age: float) -> StateSnapshot | None:
        """The worker's counters and a histogram read at most ``max_age`` seconds old, if it holds them. The
        store's clock, as the decisions' times: a test's or a replay's clock ages the snapshot too. A clock set
        back makes the age negative: read again rather than keep the snapshot until it catches up."""
        cached = self._cached(campaign)
        if cached is None or not 0 <= self._clock() - cached.read_at <= max_age * MICROS:
            return None
        return cached.snapshot()

    def _cached(self, campaign: Campaign) -> _Cached | None:
        """The cached state, unless it was read under another policy version (whose state a change reset)."""
        cached = self._cache.get(campaign.id)
        current = cached is not None and (cached.policy, cached.arms) == (campaign.version, campaign.arms_version)
        return cached if current else None

    def _refreshed(self, key: tuple[str, int, int], done: asyncio.Future[StateSnapshot]) -> None:
        self._refreshing.pop(key, None)
        # retrieved: a failed refresh is retried by the next request, not logged as lost; one that found the state
        # unreadable also drops the cache, so that the next request waits for its own read and meets the error
        if not done.cancelled() and isinstance(done.exception(), StateUnreadable):
            self._cache.pop(key[0], None)

    async def _read(self, campaign: Campaign) -> StateSnapshot:
        """The campaign's state, read now; StateUnreadable if it is not what the scripts write. Only a read
        is checked for finite sums (the counters a decision's reply brings are the same fields: the next read,
        at most ``snapshot_interval`` later, finds what a reply could)."""
        async with self._reachable("snapshot"), self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.counters(campaign.id))
            pipe.hgetall(self.keys.cells(campaign.id))
            pipe.hgetall(self.keys.delays(campaign.id))
            if campaign.contextual:
                pipe.hgetall(self.keys.model(campaign.id))
                pipe.get(self.keys.decided(campaign.id))
            counters_raw, cells_raw, delays_raw, *model_raw = await pipe.execute()
        if counters_raw and counters_raw.get(b"a", b"0") != b"%d" % campaign.arms_version:
            raise CampaignMoved(campaign.id)  # the caller's arms are not the stored ones: it reloads the campaign
        components = len(campaign.exact_components)
        with _readable(campaign, "counters and histogram"):
            counters = parse_counters(counters_raw, len(campaign.arms))
            histogram = parse_histogram(cells_raw, components)
            delays = parse_delays(delays_raw, len(campaign.arms))
            model = None
            if model_raw:
                model = parse_model(model_raw[0], model_raw[1], len(campaign.arms), campaign.features or 0)
            _finite(counters.conversions, histogram.moments, *(() if model is None else (model.gram, model.reward)))
        cached = _Cached(
            counters,
            histogram,
            delays,
            self._clock(),
            next(self._reads),
            campaign.version,
            campaign.arms_version,
            _stamp(counters_raw),
            model,
        )
        self._cache[campaign.id] = cached
        return cached.snapshot()

    async def record_decision(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> DecisionResult:
        return (await self.record_decisions(campaign, [pull], [request_id], ttl))[0]

    async def record_decisions(
        self, campaign: Campaign, pulls: Sequence[Pull], request_ids: Sequence[str | None], ttl: int
    ) -> list[DecisionResult]:
        """One script call for the whole batch (the group commit of the engine's decisions). It sends the
        counters the worker holds (their decision count and write stamp): while they are current, as at one
        worker between conversions, the script answers only the new decision count and the worker adds the
        batch's pulls itself, sparing Redis and the worker the whole counters hash each call."""
        keys = [self.keys.counters(campaign.id), self.keys.cells(campaign.id), self.keys.audit(campaign.id)]
        held = self._cached(campaign)
        sent = (held.counters, held.version()) if held is not None else None
        args: list[EncodableT] = [campaign.version, ttl, len(campaign.exact_components)]
        args += [held.counters.decisions, held.stamp] if held is not None else [-1, -1]
        contextual = campaign.contextual
        expires = campaign.features_expire_at(pulls[0].bucket) if contextual else 0
        args += [campaign.arms_version, int(contextual), expires]
        for pull, request_id in zip(pulls, request_ids, strict=True):
            if request_id is not None:
                keys.append(self.keys.request(campaign.id, request_id))
            args += [pull.arm, pull.bucket, pull.offset, pull.decision_id, repr(pull.propensity),
                     orjson.dumps(pull.record), int(request_id is not None), *map(repr, pull.moments)]  # fmt: skip
            if contextual:
                assert pull.features is not None and pull.bucket == pulls[0].bucket, "one moment's decisions"
                args += [pull.features.astype("<f8").tobytes(), repr(pull.footprint)]
        decisions: list[Decided] = []
        if contextual:
            keys += [self.keys.decided(campaign.id), self.keys.features(campaign.id, pulls[0].bucket)]
            decisions = [(pull.arm, pull.features) for pull in pulls if pull.features is not None]
            if held is not None:  # summed while the script runs (the callback runs once this call waits)
                asyncio.get_running_loop().call_soon(held.sum_ahead, decisions)
        statuses, earlier, reply, decided = await self._run("record_decisions", keys, args)
        if contextual:
            self._add_own_decisions(campaign, decisions, statuses, None if sent is None else sent[1])
            if decided >= decided_bytes(campaign, FOLD_AFTER):
                self._fold_soon(campaign)
        counters = self._counters_after(campaign, reply, sent, [pull.arm for pull in pulls], statuses)
        return [
            _decision_result(status, stored, pull, counters)
            for status, stored, pull in zip(statuses, earlier, pulls, strict=True)
        ]

    def _add_own_decisions(
        self, campaign: Campaign, decisions: list[Decided], statuses: list[int], sent: StateVersion | None
    ) -> None:
        """This worker's new contextual decisions, for the model it holds: its next decisions see them before
        the next read. Only while it holds the state ``sent`` with them: a read that replaced it meanwhile may
        hold them already (else they count from the read after, at most ``snapshot_interval`` later), and the
        model prepared for a version must be the one that version holds (engine/contextual.py)."""
        cached = self._cached(campaign)
        if cached is not None and cached.model is not None and cached.version() == sent:
            cached.add_own(decisions, [status == 0 for status in statuses])

    def _fold_soon(self, campaign: Campaign) -> None:
        """A fold of the campaign's ``decided`` string (``fold_model``) in the background, one at a time per
        campaign: the decision that found it long is answered meanwhile."""
        if campaign.id in self._folding:
            return
        fold = asyncio.ensure_future(self.fold_model(campaign))
        self._folding[campaign.id] = fold
        fold.add_done_callback(lambda done: self._folded(campaign.id, done))

    def _folded(self, campaign_id: str, done: asyncio.Future[bool]) -> None:
        self._folding.pop(campaign_id, None)
        if not done.cancelled() and done.exception() is not None:  # the next decision recorded asks again
            logger.warning("folding the model of %s failed: %s", campaign_id, done.exception())

    async def fold_model(self, campaign: Campaign, least: int | None = None) -> bool:
        """Fold the decisions of a contextual campaign's ``decided`` string into its model's Σ AAᵀ: read both in
        one transaction, add them up here, and write the sums back (store/lua/fold_model.lua) unless another
        fold, a policy change or a rebuild came first. Only when the string holds ``least`` decisions
        (FOLD_AFTER): the workers that found it long at once fold it once, the others find it short. Only by a
        worker that holds the stored arm set (a context campaign's blocks: an added arm's decisions name a
        block an earlier arm set lacks). Whether it folded."""
        cid, blocks, d = campaign.id, len(campaign.arms), campaign.features or 0
        async with self._reachable("fold_model"), self.client.pipeline(transaction=True) as pipe:
            pipe.hmget(self.keys.counters(cid), ["v", "a"])
            pipe.hgetall(self.keys.model(cid))
            pipe.get(self.keys.decided(cid))
            (version, arms_version), raw, decided = await pipe.execute()
        least = FOLD_AFTER if least is None else least
        current = (int(version or 1), int(arms_version or 0)) == (campaign.version, campaign.arms_version)
        if not current or not decided or len(decided) < decided_bytes(campaign, least):
            return False
        with _readable(campaign, "model"):
            folded = parse_model(raw, decided, blocks, d).gram
        args: list[EncodableT] = [campaign.version, raw.get(b"fold", b""), len(decided), os.urandom(8).hex()]
        for block, gram in enumerate(folded):
            args += [block, gram.astype("<f8").tobytes()]
        keys = [self.keys.counters(cid), self.keys.model(cid), self.keys.decided(cid)]
        return bool(await self._run("fold_model", keys, args))

    def _counters_after(
        self,
        campaign: Campaign,
        reply: int | list[bytes],
        sent: tuple[Counters, StateVersion] | None,
        arms: list[int],
        statuses: list[int],
    ) -> Counters | None:
        """The counters after a batch (none after a refusal), kept for the next decision: the script's whole
        hash, or, where it says the ``sent`` ones were current by answering only the new decision count, those
        plus the batch's new pulls (status 0), under the same write stamp. The cache takes them if it still
        holds the version that was sent (no fresher read replaced it meanwhile)."""
        cached = self._cached(campaign)
        if isinstance(reply, int):
            if sent is None:
                raise ScriptProtocolError("record_decisions answered a decision count to a batch sent no counters")
            new_pulls = (arm for arm, status in zip(arms, statuses, strict=True) if status == 0)
            counters = sent[0].with_pulls(new_pulls, reply)
            if cached is not None and cached.version() == sent[1]:
                cached.counters = counters
            return counters
        if not reply:
            return None
        fields = dict(zip(reply[::2], reply[1::2], strict=True))
        try:
            counters = parse_counters(fields, len(campaign.arms))
            _finite(counters.conversions)  # "inf" parses: policies must never see it from this reply either
        except (ValueError, IndexError):  # unreadable: the decision stands, and the next read says why (_read)
            self._cache.pop(campaign.id, None)
            return None
        if cached is not None:
            cached.counters, cached.stamp = counters, _stamp(fields)
        return counters

    async def record_fallback(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> DecisionResult:
        keys = [self.keys.counters(campaign.id), self.keys.audit(campaign.id)]
        if request_id is not None:
            keys.append(self.keys.request(campaign.id, request_id))
        args: list[EncodableT] = [pull.decision_id, pull.arm, repr(pull.propensity), ttl, orjson.dumps(pull.record),
                                  campaign.version]  # fmt: skip
        status, earlier = await self._run("record_fallback", keys, args)
        if status == 1:
            return _earlier(earlier)
        if status in REFUSALS:
            return DecisionResult(REFUSALS[status])
        return DecisionResult(DecisionStatus.NEW, pull.decision_id, pull.arm, pull.propensity, action=pull.action)

    async def apply_conversions(
        self, campaign: Campaign, events: list[PreparedConversion]
    ) -> list[Outcome | Uncredited]:
        outcomes: list[Outcome | Uncredited] = []
        for start in range(0, len(events), CONVERSIONS_PER_SCRIPT):
            try:
                outcomes += await self._apply_chunk(campaign, events[start : start + CONVERSIONS_PER_SCRIPT])
            except CampaignRefused as refused:
                raise CampaignRefused(refused.reason, outcomes) from None
        return outcomes

    async def _apply_chunk(self, campaign: Campaign, events: list[PreparedConversion]) -> list[Outcome | Uncredited]:
        cid, now = campaign.id, self._clock()
        keys = [self.keys.counters(cid), self.keys.cells(cid), self.keys.audit(cid)]
        keys += [self.keys.dedup(cid), self.keys.delays(cid), self.keys.credited(cid)]
        kept = {}  # a contextual campaign's features hash per bucket: its index in KEYS (Lua counts from 1)
        if campaign.contextual:
            keys.append(self.keys.model(cid))
            for bucket in sorted({event.bucket for event in events}):
                keys.append(self.keys.features(cid, bucket))
                kept[bucket] = len(keys)
        params = [
            [event.event_id or "", event.decision_id, event.counts, event.censored, event.arm, event.bucket,
             repr(event.value), now // MICROS + event.dedup_ttl, event.delay_bucket, kept.get(event.bucket, 0)]
            for event in events
        ]  # fmt: skip
        records = orjson.dumps([event.record for event in events])
        reward = campaign.reward
        args: list[EncodableT] = [now // MICROS, orjson.dumps(params), records, campaign.version]
        args += [repr(reward.max), int(reward.sums), now]
        raw: list[bytes] = await self._run("apply_conversions", keys, args)
        _raise_refusal(raw)
        return [OUTCOMES[outcome] for outcome in raw]

    async def fold_matured(self, campaign: Campaign, arms: np.ndarray, buckets: np.ndarray) -> None:
        components = len(campaign.exact_components)
        pairs = [value for pair in zip(arms.tolist(), buckets.tolist(), strict=True) for value in pair]
        keys = [self.keys.counters(campaign.id), self.keys.cells(campaign.id)]
        await self._run("fold_matured", keys, [components, *pairs])
        self._cache.pop(campaign.id, None)

    # schedules (planning policies) ---------------------------------------------------------------------

    def _schedule_keys(self, cid: str) -> list[str]:
        keys = self.keys
        return [keys.counters(cid), keys.sched(cid), keys.segments(cid), keys.starts(cid), keys.closed(cid)]

    async def claim_slot(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> Claim:
        return (await self.claim_slots(campaign, [pull], [request_id], ttl))[0]

    async def claim_slots(
        self, campaign: Campaign, pulls: Sequence[Pull], request_ids: Sequence[str | None], ttl: int
    ) -> list[Claim]:
        """One script call for decisions made at one moment that expect one arm and propensity (the first
        pull's; the engine's group commit)."""
        first = pulls[0]
        keys = [*self._schedule_keys(campaign.id), self.keys.audit(campaign.id)]
        args: list[EncodableT] = [
            first.record["at"], first.arm, repr(first.propensity), ttl, campaign.slot_us or 0, campaign.created_at,
            campaign.lateness_us, campaign.version,
        ]  # fmt: skip
        for pull, request_id in zip(pulls, request_ids, strict=True):
            if request_id is not None:
                keys.append(self.keys.request(campaign.id, request_id))
            args += [pull.decision_id, orjson.dumps(pull.record), int(request_id is not None)]
        answers: list[list[bytes | int]] = await self._run("claim_slots", keys, args)
        return [_claim(answer, pull) for answer, pull in zip(answers, pulls, strict=True)]

    async def schedule_view(self, campaign: Campaign) -> ScheduleView:
        cid = campaign.id
        async with self._reachable("schedule"), self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.sched(cid))
            pipe.hgetall(self.keys.segments(cid))
            pipe.lrange(self.keys.closed(cid), 0, -1)
            sched, segments, closed = await pipe.execute()
        with _readable(campaign, "schedule"):
            return parse_schedule(sched, segments, closed)

    async def commit_plan(
        self, campaign: Campaign, expected: int, plan: Plan, consumed: int, record: Record, now: int
    ) -> bool:
        cid = campaign.id
        earliest = next_slot(0, now, campaign.created_at, campaign.slot_us) if campaign.slot_us else 0
        args: list[EncodableT] = [expected, orjson.dumps(plan.to_json()), schedule_table(plan), consumed, earliest,
                                  orjson.dumps(record)[:-2]]  # fmt: skip
        keys = [self.keys.sched(cid), self.keys.closed(cid), self.keys.audit(cid)]
        return bool(await self._run("commit_plan", keys, args))

    async def apply_anonymous(
        self, campaign: Campaign, events: list[AnonymousEvent], now: int
    ) -> list[Outcome | Uncredited]:
        cid = campaign.id
        keys = [*self._schedule_keys(cid), self.keys.audit(cid), self.keys.dedup(cid)]
        params = [
            [event.kind, event.start, event.end, event.value, event.event_id or "", event.decision_id or "",
             now // MICROS + event.dedup_ttl, event.counts]
            for event in events
        ]  # fmt: skip
        records = orjson.dumps([event.record for event in events])
        bounds = RewardBounds.of(campaign)
        args: list[EncodableT] = [now, campaign.lateness_us, orjson.dumps(params), records, campaign.version,
                                  repr(bounds.per_decision), repr(bounds.total)]  # fmt: skip
        raw: list[bytes] = await self._run("apply_anonymous", keys, args)
        _raise_refusal(raw)
        return [OUTCOMES[outcome] for outcome in raw]

    # audit queue ----------------------------------------------------------------------------------

    async def audit_campaigns(self) -> list[str]:
        return await self._registered()

    async def read_audit(self, campaign: str, limit: int) -> list[QueueEntry]:
        async with self._reachable("audit"):
            entries = await self.client.xrange(self.keys.audit(campaign), count=limit)
        stream = cast(list[tuple[bytes, dict[bytes, bytes]]], entries)  # bytes: no decode_responses
        return [QueueEntry(campaign, entry_id.decode(), _records(fields)) for entry_id, fields in stream]

    async def ack_audit(self, campaign: str, entry_ids: list[str]) -> None:
        if entry_ids:
            async with self._reachable("audit"):
                await self.client.xdel(self.keys.audit(campaign), *entry_ids)

    async def claim_audit(self, campaign: str, seconds: float) -> bool:
        """Take the lease, or keep it if this process holds it (store/lua/claim_audit.lua); never released (it
        expires), since a drain that outlives it is merely repeated."""
        keys = [self.keys.audit_lease(campaign), self.keys.audit(campaign)]
        return bool(await self._run("claim_audit", keys, [self._owner, round(seconds * 1000)]))

    async def audit_backlog(self) -> int:
        campaigns = await self._registered()
        async with self._reachable("audit"), self.client.pipeline(transaction=False) as pipe:
            for campaign in campaigns:
                pipe.xlen(self.keys.audit(campaign))
            return sum(await pipe.execute())

    # rebuild --------------------------------------------------------------------------------------

    def _write_schedule(self, pipe: Pipeline | ClusterPipeline, cid: str, book: ScheduleBook) -> None:
        """The Redis form of an embedded schedule (the fields the schedule scripts read)."""
        assert book.plan is not None
        fields: HashFields = {
            "plan": orjson.dumps(book.plan.to_json()), "table": schedule_table(book.plan),
            **_integers({"v": book.version, "start": book.start, "slot": book.slot, "cur": book.current,
                         "first": book.first_record, "last": book.last_record, "crid": book.closed_through,
                         "cuntil": book.closed_until, "wm": book.watermark}),
        }  # fmt: skip
        fields["total"] = repr(book.total)
        for arm, (slots, reward) in book.credited.items():
            fields |= {f"cs:{arm}": str(slots), f"cr:{arm}": repr(float(reward))}
        pipe.hset(self.keys.sched(cid), mapping=fields)
        for record in book.records.values():
            item = record.id
            values: HashFields = {
                f"{item}:j": orjson.dumps(record.segment.to_json()), f"{item}:a": str(record.segment.arm),
                f"{item}:c": str(int(record.segment.counted)), f"{item}:f": str(record.first),
                f"{item}:s": str(record.start), f"{item}:r": repr(float(record.reward)),
            }  # fmt: skip
            if record.end is not None and record.next_first is not None:
                values |= {f"{item}:x": str(record.end), f"{item}:y": str(record.next_first)}
            pipe.hset(self.keys.segments(cid), mapping=values)
            pipe.zadd(self.keys.starts(cid), {str(item): record.start})
        for observed in book.closed:
            entry = {"segment": observed.segment.to_json(), "slots": observed.slots, "reward": observed.reward}
            pipe.rpush(self.keys.closed(cid), orjson.dumps(entry))

    async def replace_state(
        self,
        campaign: Campaign,
        counters: Counters,
        histogram: Histogram,
        expiring: dict[str, tuple[str | bytes, int]],
        delays: np.ndarray | None = None,
        schedule: ScheduleBook | None = None,
        model: LinearSums | None = None,
    ) -> None:
        """Overwrite a campaign's state in one transaction (``latebandit rebuild``). ``expiring`` maps what
        the memory store remembers (``req:…`` request ids, ``ev:…``/``cv:…`` dedup entries) to its value and
        remaining seconds (a ``cv:`` entry's value other than "1": its decision's credited reward); ``delays``
        is the (K, buckets) delay histogram (none: empty); ``schedule``, a planning campaign's schedule as the
        embedded store keeps it; ``model``, a contextual campaign's sums (its decisions' features are the
        ``ft:<bucket>:<field>`` entries of ``expiring``)."""
        cid, now = campaign.id, self._clock() // MICROS
        async with self._reachable("rebuild"), self.client.pipeline(transaction=True) as pipe:
            pipe.delete(*self.keys.state(cid))
            pipe.set(self.keys.config(cid), campaign.model_dump_json())
            _write_counters(pipe, self.keys.counters(cid), campaign, counters, int(self._clock()))
            _write_histogram(pipe, self.keys.cells(cid), histogram)
            if delays is not None and delays.any():
                arms, buckets = np.nonzero(delays)
                counts: HashFields = {
                    f"{a}:{b}": int(delays[a, b]) for a, b in zip(arms.tolist(), buckets.tolist(), strict=True)
                }
                pipe.hset(self.keys.delays(cid), mapping=counts)
            if schedule is not None and schedule.plan is not None:
                self._write_schedule(pipe, cid, schedule)
            if model is not None:
                blobs: HashFields = {f"g:{k}": gram.astype("<f8").tobytes() for k, gram in enumerate(model.gram)}
                blobs |= {f"b:{k}": reward.astype("<f8").tobytes() for k, reward in enumerate(model.reward)}
                blobs["fold"] = os.urandom(8).hex()  # a fold read before this rebuild writes nothing (fold_model.lua)
                pipe.hset(self.keys.model(cid), mapping=blobs)
            for suffix, (value, seconds) in expiring.items():
                if suffix.startswith("ft:"):
                    _, bucket, name = suffix.split(":")
                    pipe.hset(self.keys.features(cid, int(bucket)), name, value)
                    pipe.expire(self.keys.features(cid, int(bucket)), max(1, seconds))
                elif suffix.startswith("req:"):
                    pipe.set(self.keys.tagged(cid, suffix), value, ex=max(1, seconds))
                else:
                    pipe.zadd(self.keys.dedup(cid), {suffix: now + seconds})
                    if suffix.startswith("cv:") and value != "1":
                        pipe.hset(self.keys.credited(cid), suffix, value)
            await pipe.execute()
            await self.client.sadd(self.keys.registry(), cid)  # another slot: outside the transaction
        if campaign.archived_at is not None:  # its state goes at the next sweep, if its feedback_until has passed
            await self._register_archived(campaign)
        self._cache.pop(cid, None)


@contextlib.contextmanager
def _readable(campaign: Campaign, part: str) -> Iterator[None]:
    """Turns what parsing a campaign's state raises on data the scripts never write into StateUnreadable."""
    try:
        yield
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:  # orjson's errors are ValueErrors
        raise StateUnreadable(campaign.id, f"{part}: {type(error).__name__}: {error}") from error


def _finite(*arrays: np.ndarray | Sequence[float]) -> None:
    """ValueError unless every sum read is finite (the scripts never write another since they refuse values)."""
    for values in arrays:
        if not np.isfinite(values).all():
            raise ValueError("a sum is not finite")


def _integers(values: dict[str, int]) -> HashFields:
    return {key: str(value) for key, value in values.items()}


def schedule_table(plan: Plan) -> bytes:
    """What claim_slots.lua reads of a plan: per segment [slots, arm, propensity (Python repr, compared as
    text with the caller's), counted, segment JSON], the hold, and when the next plan may come."""

    def row(segment: Segment) -> list[object]:
        return [segment.slots, segment.arm, repr(segment.propensity), int(segment.counted),
                orjson.dumps(segment.to_json()).decode()]  # fmt: skip

    return orjson.dumps({"segments": [row(s) for s in plan.segments], "hold": row(plan.hold), "next": plan.next.value})


def parse_schedule(sched: dict[bytes, bytes], segments: dict[bytes, bytes], closed: list[bytes]) -> ScheduleView:
    """The ScheduleView of the Redis hashes (the same object the embedded store's ScheduleBook gives); ValueError
    for what the scripts never write (invalid JSON, a reward that is not finite)."""
    number = {key.decode(): value for key, value in sched.items()}
    plan = Plan.from_json(orjson.loads(number["plan"])) if "plan" in number else None
    slot = int(number.get("slot", 0))
    fields: dict[int, dict[str, bytes]] = {}
    for name, value in segments.items():
        record_id, _, field = name.decode().partition(":")
        fields.setdefault(int(record_id), {})[field] = value
    records = [
        PlayedSegment(
            record_id, Segment.from_json(orjson.loads(item["j"])), int(item["f"]), int(item["s"]),
            int(item["x"]) if "x" in item else None, int(item["y"]) if "y" in item else None, float(item["r"]),
        )
        for record_id, item in sorted(fields.items())
    ]  # fmt: skip
    credited: dict[int, tuple[int, float]] = {}
    for key, value in number.items():
        if key.startswith("cs:"):
            arm = int(key[3:])
            credited[arm] = (int(value), float(number.get(f"cr:{arm}", b"0")))
    observed = [Observed(Segment.from_json(item["segment"]), item["slots"], float(item["reward"]))
                for item in map(orjson.loads, closed)]  # fmt: skip
    _finite([record.reward for record in records], [reward for _, reward in credited.values()],
            [item.reward for item in observed])  # fmt: skip
    return ScheduleView(
        int(number.get("v", 0)), plan, observed, [record.observed(slot) for record in records], slot,
        int(number.get("wm", 0)), int(number.get("cuntil", 0)), records[-1] if records else None, credited,
    )  # fmt: skip


def _claim(answer: list[bytes | int], pull: Pull) -> Claim:
    """One decision's answer from claim_slots.lua (statuses in the script's header)."""
    status, arm, propensity, version = answer
    if status == 1:
        earlier = _earlier(cast(bytes, arm))  # status 1: the script answers the stored decision in its place
        return Claim(ClaimStatus.REPEATED, earlier.arm, earlier.propensity, earlier.decision_id)
    if status in CLAIM_REFUSALS:
        return Claim(CLAIM_REFUSALS[int(status)], version=int(version))
    if status == 5:
        return Claim(ClaimStatus.OTHER_ARM, int(arm), float(propensity), version=int(version))
    return Claim(ClaimStatus.NEW, pull.arm, pull.propensity, pull.decision_id, int(version))


CLAIM_REFUSALS = {
    2: ClaimStatus.PAUSED, 3: ClaimStatus.UNKNOWN, 4: ClaimStatus.NEEDS_PLAN, 6: ClaimStatus.MOVED,
    7: ClaimStatus.ARCHIVED,
}  # fmt: skip


def _decision_result(status: int, earlier: bytes, pull: Pull, counters: Counters | None) -> DecisionResult:
    """One pull's answer from record_decisions.lua (statuses in the script's header)."""
    if status == 0:
        return DecisionResult(DecisionStatus.NEW, pull.decision_id, pull.arm, pull.propensity, counters, pull.action)
    if status == 1:
        return _earlier(earlier, counters)
    return DecisionResult(REFUSALS[status])


REFUSALS = {2: DecisionStatus.PAUSED, 3: DecisionStatus.UNKNOWN, 4: DecisionStatus.MOVED, 5: DecisionStatus.ARCHIVED}


def _earlier(stored: bytes, counters: Counters | None = None) -> DecisionResult:
    """The decision a request_id already got, stored as ``decision id|arm|propensity``, and on a contextual
    campaign ``|action id`` (the label its answer named)."""
    decision_id, arm, propensity, *action = stored.decode().split("|")
    return DecisionResult(DecisionStatus.REPEATED, decision_id, int(arm), float(propensity), counters,
                          action[0] if action else None)  # fmt: skip


def _records(fields: dict[bytes, bytes]) -> list[Record]:
    """Decode a stream entry: ``seq``/``r`` for a single record; ``o``/``b`` for a feedback batch (its
    records as one JSON array, each audited under its outcome in ``o``, none if empty: feedback_lib.lua); or
    the ``position:outcome`` fields that workers of earlier versions queued, still waiting after an upgrade."""
    if b"b" in fields:
        batch, outcomes = orjson.loads(fields[b"b"]), fields[b"o"].decode().split(",")
        return [{**record, "outcome": outcome} for record, outcome in zip(batch, outcomes, strict=True) if outcome]
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


def _write_counters(
    pipe: Pipeline | ClusterPipeline, key: str, campaign: Campaign, counters: Counters, stamp: int
) -> None:
    paused = int(campaign.status is CampaignStatus.PAUSED)
    # a new write stamp: no worker's cached counters pass for these (record_decisions.lua)
    mapping: HashFields = {"d": counters.decisions, "paused": paused, "v": campaign.version, "w": stamp,
                           "a": campaign.arms_version}  # fmt: skip
    if campaign.archived_at is not None and campaign.feedback_until is not None:
        mapping |= {"archived": campaign.archived_at, "until": campaign.feedback_until}
    for arm in range(len(campaign.arms)):
        mapping |= {f"n:{arm}": int(counters.pulls[arm]), f"s:{arm}": repr(float(counters.conversions[arm]))}
        mapping |= {f"m:{arm}": int(counters.matured[arm]), f"c:{arm}": int(counters.counted[arm])}
    pipe.hset(key, mapping=mapping)


def _write_histogram(pipe: Pipeline | ClusterPipeline, key: str, histogram: Histogram) -> None:
    mapping: HashFields = {}
    for row in range(len(histogram.count)):
        cell = f"{histogram.arm[row]}:{histogram.bucket[row]}:"
        mapping |= {cell + "c": int(histogram.count[row]), cell + "o": int(histogram.offset[row])}
        mapping[cell + "v"] = int(histogram.converted[row])
        for j, moment in enumerate(histogram.moments[row], start=1):
            mapping[f"{cell}e{j}"] = repr(float(moment))
        if histogram.footprint is not None:
            mapping[cell + "f"] = repr(float(histogram.footprint[row]))
    if mapping:
        pipe.hset(key, mapping=mapping)
