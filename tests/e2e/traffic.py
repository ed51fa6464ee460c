"""Client processes that drive a running service the way a careful ad server does, and the ledger of what
the service acknowledged, to check the service's counts against afterwards.

A client retries until it gets an answer: a ``/choose`` with the same ``request_id`` (so a decision recorded
before a lost answer is returned again, not made twice), a ``/feedback`` batch unchanged (so the events
already applied come back as ``duplicates``). What it reports is what the service acknowledged once.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import redis

from latebandit.store.keys import Keys
from tests.waiting import until

RETRY_FOR = 120.0  # seconds a client keeps retrying one request before giving up (a failed test)


@dataclass
class Gate:
    """Lets the test pause every client connection between two requests (and know that they all are
    paused), and end the traffic when the test has seen what it needed."""

    open: Any  # multiprocessing Event
    finish: Any  # multiprocessing Event: stop making decisions, send what is pending
    parked: Any  # multiprocessing Value('i'): connections waiting at the gate or finished

    @classmethod
    def make(cls, context: Any) -> Gate:
        gate = cls(context.Event(), context.Event(), context.Value("i", 0))
        gate.open.set()
        return gate

    def passage(self) -> None:
        if self.open.is_set():
            return
        self.park(1)
        self.open.wait()
        self.park(-1)

    def park(self, step: int) -> None:
        with self.parked.get_lock():
            self.parked.value += step

    def close_and_wait(self, connections: int, timeout: float = 60.0) -> None:
        self.open.clear()
        deadline = time.monotonic() + timeout
        while self.parked.value < connections:
            if time.monotonic() > deadline:
                raise AssertionError("the clients did not pause")
            time.sleep(0.02)


@dataclass
class Plan:
    url: str
    campaigns: list[str]
    decisions: int  # per client
    batch: int = 10  # conversions per /feedback request
    convert: float = 0.5
    connections: int = 1  # threads per client process, each with its own connection
    repeat: float = 0.0  # probability of sending a request again although it was answered (a lost answer)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Ledger:
    """What one client was answered: each decision once, each acknowledged conversion once."""

    decisions: dict[str, tuple[str, str, bool]] = field(default_factory=dict)  # id -> (campaign, arm, fallback)
    converted: set[str] = field(default_factory=set)  # decision ids whose conversion was acknowledged
    retries: Counter[str] = field(default_factory=Counter)  # why requests were repeated
    fallbacks: int = 0  # fallback answers to /choose
    fallback_requests: set[str] = field(default_factory=set)  # request ids answered with a fallback

    def merge(self, other: Ledger) -> None:
        self.decisions |= other.decisions
        self.converted |= other.converted
        self.retries.update(other.retries)
        self.fallbacks += other.fallbacks
        self.fallback_requests |= other.fallback_requests

    def expected(self, campaign: str) -> tuple[int, Counter[str], Counter[str]]:
        """Counted decisions, pulls per arm and counted conversions per arm of a campaign (fallback
        decisions are not counted, nor are their conversions)."""
        pulls: Counter[str] = Counter()
        conversions: Counter[str] = Counter()
        for decision_id, (name, arm, fallback) in self.decisions.items():
            if name == campaign and not fallback:
                pulls[arm] += 1
                conversions[arm] += decision_id in self.converted
        return sum(pulls.values()), pulls, conversions


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _until_answered(http: httpx.Client, path: str, body: dict, ledger: Ledger, gate: Gate | None) -> dict:
    deadline = time.monotonic() + RETRY_FOR
    while True:
        if gate is not None:
            gate.passage()
        try:
            response = http.post(path, json=body)
        except httpx.TransportError as error:  # the worker died or the connection broke: ask again
            ledger.retries[f"{path} {type(error).__name__}"] += 1
        else:
            if response.status_code == 200:
                return response.json()
            if response.status_code < 500:
                raise AssertionError(f"{path} answered {response.status_code}: {response.text}")
            ledger.retries[f"{path} {response.status_code}"] += 1
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} got no answer for {RETRY_FOR}s")
        time.sleep(0.05)


def run_client(plan: Plan, seed: int, results: Any, gate: Gate | None = None) -> None:
    """One client process: ``plan.connections`` threads, each with its own keep-alive connection; puts the
    merged ledger (or the failure) on ``results``."""
    ledgers = [Ledger() for _ in range(plan.connections)]
    failures: list[str] = []

    def drive(index: int) -> None:
        try:
            _drive(plan, seed * 1000 + index, ledgers[index], gate)
        except BaseException:
            failures.append(traceback.format_exc())
        finally:
            if gate is not None:
                gate.park(1)  # a finished connection no longer needs to be waited for

    threads = [threading.Thread(target=drive, args=(index,)) for index in range(plan.connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = Ledger()
    for ledger in ledgers:
        total.merge(ledger)
    results.put(failures[0] if failures else total)


def _drive(plan: Plan, seed: int, ledger: Ledger, gate: Gate | None) -> None:
    """Choose ``plan.decisions`` times across the campaigns and send conversions in batches. An
    acknowledged event counts as sent once, however many retries it took."""
    rng = random.Random(seed)
    pending: list[dict] = []
    with httpx.Client(base_url=plan.url, timeout=10.0, headers=plan.headers) as http:

        def send() -> None:
            answer = _until_answered(http, "/feedback", {"events": pending}, ledger, gate)
            assert not answer["rejected"], answer
            assert answer["accepted"] + answer["duplicates"] == len(pending), answer
            if rng.random() < plan.repeat:
                again = _until_answered(http, "/feedback", {"events": pending}, ledger, gate)
                assert again["duplicates"] == len(pending), again
            ledger.converted.update(event["decision_id"] for event in pending)
            pending.clear()

        for i in range(plan.decisions):
            if gate is not None and gate.finish.is_set():
                break
            campaign = rng.choice(plan.campaigns)
            body = {"campaign": campaign, "request_id": f"r{seed}-{i}"}
            decision = _until_answered(http, "/choose", body, ledger, gate)
            if rng.random() < plan.repeat:
                assert _until_answered(http, "/choose", body, ledger, gate) == decision
            if decision["fallback"]:
                ledger.fallbacks += 1
                ledger.fallback_requests.add(body["request_id"])
            ledger.decisions[decision["decision_id"]] = (campaign, decision["arm"], decision["fallback"])
            if rng.random() < plan.convert:
                pending.append({"type": "conversion", "event_id": f"e{seed}-{i}",
                                "decision_id": decision["decision_id"], "occurred_at": now_iso()})  # fmt: skip
            if len(pending) >= plan.batch:
                send()
        if pending:
            send()


@dataclass
class Fleet:
    """Client processes started together; ``join`` gathers their ledgers into one."""

    processes: list[multiprocessing.process.BaseProcess]
    results: Any

    @classmethod
    def start(cls, plan: Plan, clients: int, gate: Gate | None = None, context: Any = None) -> Fleet:
        context = context or multiprocessing.get_context("spawn")
        results = context.Queue()
        processes = [  # daemons: a failed test does not wait for clients retrying against a stopped server
            context.Process(target=run_client, args=(plan, seed, results, gate), daemon=True) for seed in range(clients)
        ]
        for process in processes:
            process.start()
        return cls(processes, results)

    def join(self, timeout: float = 300.0) -> Ledger:
        total = Ledger()
        for _ in self.processes:
            ledger = self.results.get(timeout=timeout)
            if isinstance(ledger, str):
                raise AssertionError(f"a client failed:\n{ledger}")
            total.merge(ledger)
        for process in self.processes:
            process.join(timeout=30)
        return total


def decisions(http: httpx.Client, campaigns: list[str]) -> int | None:
    """Decisions counted so far; None on a 503 (just after Redis came back, the first command of a worker
    meets a connection that died with it, and is refused; clients retry)."""
    answers = [http.get(f"/campaigns/{name}/state") for name in campaigns]
    if any(answer.status_code == 503 for answer in answers):
        return None
    return sum(answer.raise_for_status().json()["decisions"] for answer in answers)


def more_traffic(http: httpx.Client, campaigns: list[str], count: int = 100) -> None:
    """Wait until the clients (slow to start on a loaded machine) have made ``count`` more decisions."""
    start: list[int] = []

    def grown() -> bool:
        now = decisions(http, campaigns)
        start.extend([] if start or now is None else [now])
        return bool(start) and now is not None and now >= start[0] + count

    until(grown, f"{count} more decisions", timeout=120)


def wait_for_audit(
    redis_url: str, prefix: str, campaigns: list[str], timeout: float = 60.0, cluster: bool = False
) -> None:
    """Until the audit writers have drained every campaign's stream into the audit log."""
    client = (redis.RedisCluster if cluster else redis.Redis).from_url(redis_url)
    deadline = time.monotonic() + timeout
    while sum(client.xlen(Keys(prefix).audit(name)) for name in campaigns):
        if time.monotonic() > deadline:
            raise AssertionError("the audit log did not catch up")
        time.sleep(0.2)
    client.close()


def fallbacks_unaudited(ledger: Ledger, postgres_url: str) -> set[str]:
    """The fallback decisions the clients were answered that the audit log lacks (those served while Redis
    was away reach it through the workers' spools, within a second or so of PostgreSQL answering); a
    fallback row twice fails at once."""
    with psycopg.connect(postgres_url) as db:
        rows = [row[0] for row in db.execute("SELECT decision_id FROM audit_decisions WHERE fallback").fetchall()]
    assert len(rows) == len(set(rows)), "a fallback decision audited twice"
    return {decision for decision, (_, _, fallback) in ledger.decisions.items() if fallback} - set(rows)


def assert_exact(
    http: httpx.Client, ledger: Ledger, campaigns: list[str], postgres_url: str, store_died: bool = False
) -> None:
    """GET /state and the audit log hold exactly what the clients were acknowledged: every counted decision
    and conversion once, every fallback decision answered, no row twice.

    ``store_died``: Redis was killed under traffic, so a decision it recorded (and persisted) just before
    dying may have reached its client as a fallback (the worker saw the connection break, not the result).
    Such a pull is counted without being shown; each one must be the decision of a request the client was
    answered with a fallback, and it is added to what the ledger expects."""
    until(lambda: not fallbacks_unaudited(ledger, postgres_url), "every fallback answered reaching the audit log")
    with psycopg.connect(postgres_url) as db:
        for name in campaigns:
            decisions, pulls, conversions = ledger.expected(name)
            rows = db.execute(
                "SELECT decision_id, arm, request_id FROM audit_decisions WHERE campaign = %s AND NOT fallback",
                (name,),
            ).fetchall()
            assert len(rows) == len({row[0] for row in rows}), f"{name}: a decision row twice"
            unseen = [(arm, request) for decision, arm, request in rows if decision not in ledger.decisions]
            if unseen:
                assert store_died, f"{name}: decisions no client was answered: {unseen}"
                assert all(request in ledger.fallback_requests for _, request in unseen), unseen
                decisions += len(unseen)
                pulls.update(arm for arm, _ in unseen)
            state = http.get(f"/campaigns/{name}/state").json()
            assert state["decisions"] == decisions, (name, state["decisions"], decisions)
            assert {arm: row["pulls"] for arm, row in state["arms"].items()} == {a: pulls[a] for a in state["arms"]}
            assert {arm: row["conversions"] for arm, row in state["arms"].items()} == {
                a: conversions[a] for a in state["arms"]
            }
            by_arm = Counter(arm for _, arm, _ in rows)
            assert by_arm == +pulls, name
            sent = sum(ledger.decisions[d][0] == name for d in ledger.converted)
            rows, distinct = db.execute(
                "SELECT count(*), count(DISTINCT event_id) FROM audit_feedback WHERE campaign = %s", (name,)
            ).fetchone()
            assert rows == distinct == sent, (name, rows, distinct, sent)
            counted = dict(db.execute(
                "SELECT arm, count(*) FROM audit_feedback WHERE campaign = %s AND outcome = 'counted' GROUP BY arm",
                (name,),
            ).fetchall())  # fmt: skip
            assert counted == +conversions, name
