"""Benchmark: latebandit's request path against a bare FastAPI endpoint, in one run, on one machine.

    .venv/bin/python -m benchmarks.service_bench [--duration 8] [--rounds 2] [--batch 1000] [--no-workers]
        [--cases NAME ...]

Each server is one uvicorn worker on real Redis; latebandit also drains its audit log into a fresh
PostgreSQL database. The bare endpoint (benchmarks/bare_app.py) validates the same body and makes one Redis
round trip (EVALSHA of a one-line HINCRBY). Load comes from wrk (Debian package ``wrk``) when it is
installed, else from the load test's Python client (slower: it then limits what is measured). Bare and
latebandit alternate, ``--rounds`` rounds of ``--duration`` seconds each, and every figure is a median
reported as a ratio to the bare endpoint measured in the same run, since the machine is shared and noisy.

/choose cases: delayed-klucb with 10 arms and every histogram bucket of a full window populated, the same
as a revenue campaign (reward max 250, a decision's conversions summed) and after an arm change (one arm
added, one retired), patient-bandits and delayed-thompson with 3 arms, and odaaf-b with 10 arms (a planning
policy: each /choose claims a slot of a shared schedule), and otf-linucb on an actions campaign (each
request offers its own 10 actions of d = 20, or of d = 50, features of norm at most 1 written with 6 decimals,
drawn beforehand: wrk cycles through a pool of request bodies); each at 32, 4 and 1 connections, after a
warm-up round of 2 s. ``--cases`` keeps the cases whose names contain one of its words (the bare endpoint is
always measured), for /feedback and the two-worker case too. Every ratio is to the bare endpoint posted the
small body of a campaign alone; for each contextual case the bare endpoint is also measured on that case's own
bodies (2.2 KB and 5 KB: their bytes cost it too), and the contextual case's ratios to that are printed
after the table.
/feedback: batches of ``--batch`` attributed conversions, unique event ids, signed beforehand, to the
delayed-klucb campaign and to the otf-linucb d = 20 one (each conversion naming a decision whose features the
store keeps, so that it adds them to b); besides the rate, the CPU a conversion costs the worker and Redis
(from /proc), which the machine's noise moves less.
Two workers: the delayed-klucb case again on ``latebandit serve --workers 2``, against one worker (the
external writer paused meanwhile too), with the cores each process kept busy: what saturates.
Audit: by default the production layout, ``latebandit audit-writer`` in its own process
(LATEBANDIT_AUDIT_WRITER=external); ``--audit inline`` drains in the API worker instead. On this 2-core machine
the external writer is paused (SIGSTOP) during each latebandit load, /choose and /feedback, so that the API
worker's capacity and the writer's are each measured alone, as they run in production (their own cores);
after each load the writer drains the backlog (after /feedback's, its rate in audit records per second and
its largest lag are reported).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import psycopg
from rich.console import Console
from rich.table import Table

from latebandit.campaign import Campaign
from latebandit.loadtest.client import Repeat, post, run_load
from latebandit.store.base import Counters, Histogram, features_field
from latebandit.store.keys import Keys
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, format_time, wall_clock
from latebandit.tokens import DecisionToken, TokenSigner, new_nonce
from tests.e2e.server import LATEBANDIT, Server, free_port, stop, wait_ready
from tests.faults import children

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_ADMIN = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
SECRET = "bench-secret-of-at-least-thirty-two-bytes"
ARMS = [f"arm{k}" for k in range(10)]
EXPONENTIAL = {"family": "exponential", "mean": 3600}
CAMPAIGNS: dict[str, dict[str, Any]] = {
    "delayed-klucb": {"id": "bench", "arms": ARMS, "policy": {"name": "delayed-klucb", "params": {}},
                      "delay": EXPONENTIAL, "window": 86_400, "buckets": 64},
    "patient-bandits": {"id": "bench-patient", "arms": ARMS[:3], "policy": {"name": "patient-bandits", "params": {}},
                        "delay": EXPONENTIAL, "window": 86_400},
    "delayed-thompson": {"id": "bench-thompson", "arms": ARMS[:3],
                         "policy": {"name": "delayed-thompson", "params": {}}, "delay": EXPONENTIAL, "window": 86_400},
    "revenue": {"id": "bench-revenue", "arms": ARMS, "policy": {"name": "delayed-klucb", "params": {}},
                "delay": EXPONENTIAL, "window": 86_400, "buckets": 64, "reward": {"max": 250.0, "per_decision": "sum"}},
    "arms changed": {"id": "bench-arms", "arms": ARMS, "policy": {"name": "delayed-klucb", "params": {}},
                     "delay": EXPONENTIAL, "window": 86_400, "buckets": 64},
    "odaaf-b": {"id": "bench-odaafb", "arms": ARMS,
                "policy": {"name": "odaaf-b", "params": {"mean_delay": 100, "max_delay": 1000, "horizon": 10**8}}},
    "otf-linucb d=20": {"id": "bench-linucb", "policy": {"name": "otf-linucb", "params": {}}, "features": 20,
                        "delay": EXPONENTIAL, "window": 86_400, "buckets": 64},
    "otf-linucb d=50": {"id": "bench-linucb50", "policy": {"name": "otf-linucb", "params": {}}, "features": 50,
                        "delay": EXPONENTIAL, "window": 86_400, "buckets": 64},
}  # fmt: skip
FULL_WINDOW = ("delayed-klucb", "revenue", "arms changed", "otf-linucb d=20", "otf-linucb d=50")
FEEDBACK_CASES = ("delayed-klucb", "otf-linucb d=20")  # the campaigns whose conversions /feedback is measured on
ACTIONS = 10  # offered by each request of a contextual case
SAME_BODIES = "bare, bodies of "  # the bare endpoint given a contextual case's request bodies
POOL = 1024  # request bodies of a contextual case, drawn beforehand and sent in turn
RESULTS = Path(__file__).parent / "results"
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")  # the unit of /proc's CPU times
WRK_SCRIPT = """
local bodies = {}
for line in io.lines(os.getenv("BENCH_BODIES")) do bodies[#bodies + 1] = line end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = bodies[1]
if #bodies > 1 then  -- a pool: each request the next body (one alone is sent as wrk's static request)
  local requests, last = {}, 0
  init = function(args)
    for i, body in ipairs(bodies) do requests[i] = wrk.format(nil, nil, nil, body) end
  end
  request = function()
    last = last % #requests + 1
    return requests[last]
  end
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"requests": %d, "seconds": %.6f, "p50": %.6f, "p99": %.6f, "errors": %d}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1e6, latency:percentile(99) / 1e6,
    e.connect + e.read + e.write + e.status + e.timeout))
end
"""


@dataclass
class Figures:
    throughput: float  # requests per second
    p50_ms: float
    p99_ms: float
    errors: int


def start(command: list[str], env: dict[str, str], port: int, log: Path) -> Server:
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", process, env, log)
    wait_ready(server) if command[: len(LATEBANDIT)] == LATEBANDIT else _wait_port(server, port)
    return server


def _wait_port(server: Server, port: int) -> None:
    for _ in range(300):
        try:
            httpx.get(f"{server.url}/", timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(server.log.read_text())


async def fill_history(prefix: str, campaign_id: str) -> None:
    """A full window of history: every bucket of every arm holds pulls, some converted."""
    store = RedisStore(REDIS_URL, prefix)
    campaign = await store.get_campaign(campaign_id)
    assert campaign is not None
    now, width = wall_clock(), campaign.bucket_width_us
    last = now // width
    buckets = np.arange(last - campaign.buckets, last + 1)
    arms = len(campaign.arms)
    rng = np.random.default_rng(0)
    count = rng.integers(200, 400, size=arms * len(buckets))
    arm = np.repeat(np.arange(arms), len(buckets))
    moments = (count * np.exp(-width / MICROS / 2 / 3600))[:, None]
    histogram = Histogram(arm, np.tile(buckets, arms), count, count * (width // 2),
                          (count * 0.05).astype(np.int64), moments)  # fmt: skip
    pulls = np.bincount(arm, count, minlength=arms).astype(np.int64) + 10_000
    sums = np.round(pulls * np.linspace(0.02, 0.06, arms))
    counters = Counters(int(pulls.sum()), pulls, sums, np.full(arms, 10_000, dtype=np.int64), sums.astype(np.int64))
    await store.replace_state(campaign, counters, histogram, {})
    await store.close()


def forget_keys(prefix: str) -> None:
    """Leave the shared Redis as it was: a run leaves ~100,000 deduplication entries behind otherwise."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"{prefix}:*", count=10_000):
        client.delete(key)
    for key in client.scan_iter(match="bench:{*}:counter", count=10_000):
        client.delete(key)


def signed_decisions(campaign: Campaign, count: int, now: int) -> list[tuple[DecisionToken, str]]:
    """``count`` decisions of ``campaign`` spread over the hour before ``now`` (µs), with their signed ids,
    signed before the clock starts (the load generator shares the machine: it must not sign while the server
    is measured)."""
    signer = TokenSigner(SECRET)
    tokens = [DecisionToken(campaign.id, n % len(campaign.arms), now - (n % 3600) * MICROS, 1, new_nonce())
              for n in range(count)]  # fmt: skip
    return [(token, signer.sign(token)) for token in tokens]


def feedback_bodies(
    campaign: Campaign, batch: int, batches: int, purchases: int = 1, value: float = 1.0
) -> tuple[list[bytes], list[tuple[DecisionToken, str]]]:
    """``batches`` requests of ``batch`` conversions: ``purchases`` conversions of ``value`` per decision, each
    with its own event id (the later ones are repeats, which a ``sum`` campaign credits); and the decisions
    they name."""
    now = wall_clock()
    occurred = format_time(now)
    decisions = signed_decisions(campaign, batches * (batch // purchases), now)
    serial = itertools.count()
    bodies = []
    for first in range(0, len(decisions), batch // purchases):
        events = []
        for _, decision_id in decisions[first : first + batch // purchases]:
            n = next(serial)
            events += [{"type": "conversion", "event_id": f"ev{n}-{k}", "decision_id": decision_id,
                        "occurred_at": occurred, "value": value} for k in range(purchases)]  # fmt: skip
        bodies.append(post("/feedback", orjson.dumps({"events": events})))
    return bodies, decisions


def feature_vectors(rng: np.random.Generator, count: int, d: int) -> np.ndarray:
    """(count, d) features of norm 0.1 to 0.99 in random directions, with 6 decimals (as a client would send
    them; the norm stays below 1 after rounding)."""
    directions = rng.standard_normal((count, d))
    norms = rng.uniform(0.1, 0.99, size=(count, 1)) / np.linalg.norm(directions, axis=1, keepdims=True)
    return np.round(directions * norms, 6)


def choose_bodies(spec: dict[str, Any], rng: np.random.Generator) -> list[bytes]:
    """A case's /choose bodies: the campaign alone, or for a contextual campaign a pool of requests each
    offering its own ACTIONS actions."""
    if "features" not in spec:
        return [orjson.dumps({"campaign": spec["id"]})]
    d = spec["features"]
    vectors = feature_vectors(rng, POOL * ACTIONS, d).reshape(POOL, ACTIONS, d).tolist()
    return [
        orjson.dumps({"campaign": spec["id"], "actions": [{"id": f"a{k}", "features": row} for k, row in
                      enumerate(rows)]})
        for rows in vectors
    ]  # fmt: skip


def keep_features(prefix: str, campaign: Campaign, decisions: list[tuple[DecisionToken, str]]) -> None:
    """Each decision's features in the store as record_decisions.lua keeps them (by bucket, expiring), so that
    a conversion of it adds them to b: the decisions the contextual /feedback case converts."""
    import redis

    client, keys = redis.Redis.from_url(REDIS_URL), Keys(prefix)
    vectors = feature_vectors(np.random.default_rng(1), len(decisions), int(campaign.features or 0))
    by_bucket: dict[int, dict[str, bytes]] = {}
    for (token, decision_id), vector in zip(decisions, vectors, strict=True):
        fields = by_bucket.setdefault(token.decided_at // campaign.bucket_width_us, {})
        fields[features_field(decision_id)] = vector.astype("<f8").tobytes()
    with client.pipeline(transaction=False) as pipe:
        for bucket, fields in by_bucket.items():
            key, names = keys.features(campaign.id, bucket), list(fields)
            for first in range(0, len(names), 2_000):
                pipe.hset(key, mapping={name: fields[name] for name in names[first : first + 2_000]})
            pipe.expireat(key, campaign.features_expire_at(bucket))
        pipe.execute()
    client.close()


def load(port: int, bodies: Sequence[bytes], duration: int, connections: int) -> Figures:
    """``connections`` keep-alive connections posting ``bodies`` to /choose in turn for ``duration`` seconds."""
    if shutil.which("wrk"):
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as script, tempfile.NamedTemporaryFile("wb") as pool:
            script.write(WRK_SCRIPT)
            script.flush()
            pool.write(b"\n".join(bodies) + b"\n")  # JSON from orjson holds no newline
            pool.flush()
            command = ["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{duration}s", "-s", script.name,
                       f"http://127.0.0.1:{port}/choose"]  # fmt: skip
            run = subprocess.run(command, env={**os.environ, "BENCH_BODIES": pool.name}, capture_output=True,
                                 text=True, check=True)  # fmt: skip
        result = json.loads(run.stdout.strip().splitlines()[-1])
        return Figures(result["requests"] / result["seconds"], result["p50"] * 1e3, result["p99"] * 1e3,
                       result["errors"])  # fmt: skip
    requests = itertools.cycle([post("/choose", body) for body in bodies])
    measured = asyncio.run(run_load("127.0.0.1", port, lambda: Repeat(requests.__next__), duration, connections))
    return Figures(measured.throughput, measured.percentile(50) * 1e3, measured.percentile(99) * 1e3,
                   measured.errors)  # fmt: skip


def median(figures: list[Figures]) -> Figures:
    return Figures(*(float(np.median([getattr(f, name) for f in figures])) for name in ("throughput", "p50_ms",
                     "p99_ms")), sum(f.errors for f in figures))  # fmt: skip


def feedback_rate(port: int, bodies: list[bytes], duration: int) -> tuple[int, float, Figures]:
    """Conversions sent and seconds taken over 4 connections, each batch sent once."""
    queue = iter(bodies)
    measured = asyncio.run(run_load("127.0.0.1", port, lambda: Repeat(queue.__next__), duration, 4))
    events = measured.requests * len(orjson.loads(bodies[0].partition(b"\r\n\r\n")[2])["events"])
    figures = Figures(measured.throughput, measured.percentile(50) * 1e3, measured.percentile(99) * 1e3,
                      measured.errors)  # fmt: skip
    return events, measured.seconds, figures


def scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=10.0).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def audit_drain(url: str, first: dict[str, float], started: float, limit: float = 60.0) -> dict[str, float]:
    """What the draining process (its /metrics at ``url``) wrote per second during the /feedback load
    (``first`` scraped at its start) and afterwards until the backlog was gone (its capacity, once the
    load no longer shares the CPU), and the largest lag it reported."""
    ended, during = time.monotonic(), scrape(url)
    now, lag = during, during.get("latebandit_audit_lag_seconds", 0.0)
    while now.get("latebandit_audit_backlog", 0.0) > 0 and time.monotonic() - ended < limit:
        time.sleep(0.5)
        now = scrape(url)
        lag = max(lag, now.get("latebandit_audit_lag_seconds", 0.0))
    drained = time.monotonic() - ended
    written = "latebandit_audit_rows_total"
    return {
        "during_load_per_second": (during[written] - first[written]) / (ended - started),
        "after_load_per_second": (now[written] - during[written]) / drained if drained > 0.5 else float("nan"),
        "backlog_at_load_end": during.get("latebandit_audit_backlog", 0.0),
        "largest_lag_seconds": lag,
    }


def wait_drained(url: str, limit: float = 60.0) -> None:
    """Until the draining process (its /metrics at ``url``) reports no audit backlog: the next measurement
    starts on an empty queue."""
    deadline = time.monotonic() + limit
    while scrape(url).get("latebandit_audit_backlog", 0.0) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)


@contextlib.contextmanager
def paused(server: Server | None) -> Iterator[None]:
    """``server`` stopped (SIGSTOP) meanwhile: the external audit writer, while the API's capacity is
    measured (/choose and /feedback); its backlog is then drained once it resumes (and for /feedback, that
    drain is measured)."""
    if server is None:
        yield
        return
    os.killpg(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(server.process.pid, signal.SIGCONT)


def cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by every process of the machine, summed by command name (workers of one
    server share theirs): a profile of what saturates the machine during a run."""
    used: dict[str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        process = _process_cpu(stat)
        if process is not None:
            used[process[0]] = used.get(process[0], 0.0) + process[1]
    children = os.times()
    used["wrk (load, this benchmark's children)"] = children.children_user + children.children_system
    return used


def cpu_of(pids: list[int]) -> float:
    """CPU seconds used so far by these processes (a server's worker and its supervisor)."""
    return sum(process[1] for pid in pids if (process := _process_cpu(Path(f"/proc/{pid}/stat"))) is not None)


def _process_cpu(stat: Path) -> tuple[str, float] | None:
    """A process's command name and CPU seconds (user + system) from its /proc stat; None once it ended."""
    try:
        text = stat.read_text()
    except OSError:
        return None
    name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
    return name, (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND


def cores_used(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores each command kept busy between two ``cpu_seconds`` readings, the busiest first."""
    busy = {name: (after[name] - before.get(name, 0.0)) / seconds for name in after}
    return dict(sorted(((name, cores) for name, cores in busy.items() if cores >= 0.02), key=lambda item: -item[1]))


def busy_load(writer: Server | None, port: int, bodies: Sequence[bytes], duration: int, connections: int,
              rounds: int) -> tuple[Figures, dict[str, float]]:  # fmt: skip
    """``rounds`` /choose loads with the external writer paused, as every API load here: their median, and
    the cores each command kept busy meanwhile."""
    with paused(writer):
        before, started = cpu_seconds(), time.monotonic()
        figures = median([load(port, bodies, duration, connections) for _ in range(rounds)])
        return figures, cores_used(before, cpu_seconds(), time.monotonic() - started)


def deployment(audit: str) -> tuple[dict[str, str], str, str]:
    """A fresh Redis key prefix and a fresh, migrated PostgreSQL database for one run, and the environment
    that points the service at them (``teardown`` removes both): the environment, the prefix, the database."""
    prefix, database = f"bench{uuid.uuid4().hex[:8]}", f"lbbench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    env = {
        **os.environ,
        "LATEBANDIT_REDIS_URL": REDIS_URL,
        "LATEBANDIT_REDIS_PREFIX": prefix,
        "LATEBANDIT_DATABASE_URL": POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + database,
        "LATEBANDIT_SECRET": SECRET,
        "LATEBANDIT_LOG_LEVEL": "warning",  # no access line per request: the bare endpoint writes none either
        "BENCH_REDIS_URL": REDIS_URL,
        "LATEBANDIT_AUDIT_WRITER": audit,
    }
    try:
        subprocess.run([*LATEBANDIT, "migrate"], env=env, check=True, capture_output=True)
    except subprocess.CalledProcessError:
        teardown(prefix, database)
        raise
    return env, prefix, database


def teardown(prefix: str, database: str) -> None:
    forget_keys(prefix)
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def serve(env: dict[str, str], workers: int, workdir: Path) -> tuple[Server, int]:
    port = free_port()
    command = [*LATEBANDIT, "serve", "--port", str(port), "--workers", str(workers)]
    return start(command, env, port, workdir / f"latebandit-{workers}.log"), port


@dataclass
class FeedbackFigures:
    rate: float  # conversions per second
    cpu_us: dict[str, float]  # CPU a conversion costs: the worker's and Redis's, µs
    figures: Figures
    audit: dict[str, float]  # audit_drain's


def measure_feedback(
    latebandit: Server, port: int, writer: Server | None, drained_by: str, bodies: list[bytes], duration: int
) -> FeedbackFigures:
    """/feedback on ``bodies`` after a warm-up of 2 s, the external writer paused meanwhile, then its drain."""
    warm_up = len(bodies) * 2 // (duration + 2)
    feedback_rate(port, bodies[:warm_up], 2)
    before, started = scrape(drained_by), time.monotonic()
    worker = [latebandit.process.pid, *children(latebandit.process.pid)]
    with paused(writer):  # each measured alone on this machine's cores: in production they have their own
        worker_cpu, redis_cpu = cpu_of(worker), cpu_seconds().get("redis-server", 0.0)
        events, seconds, figures = feedback_rate(port, bodies[warm_up:], duration)
        cpu_us = {"worker": (cpu_of(worker) - worker_cpu) * 1e6 / events,  # read before the writer resumes
                  "redis": (cpu_seconds().get("redis-server", 0.0) - redis_cpu) * 1e6 / events}  # fmt: skip
    return FeedbackFigures(events / seconds, cpu_us, figures, audit_drain(drained_by, before, started))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=8, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--no-workers", action="store_true", help="skip the two-worker case")
    parser.add_argument("--audit", choices=["inline", "external"], default="external")
    parser.add_argument("--cases", nargs="+", metavar="WORD", help="only the cases whose names contain a WORD")
    args = parser.parse_args()
    chosen = [name for name in CAMPAIGNS if args.cases is None or any(word in name for word in args.cases)]
    workdir = RESULTS / "run"
    workdir.mkdir(parents=True, exist_ok=True)
    env, prefix, database = deployment(args.audit)
    servers: list[Server] = []
    console = Console(width=160)  # the table stays whole when piped to a file or a CI log
    try:
        latebandit, lb_port = serve(env, 1, workdir)
        servers.append(latebandit)
        writer_port, writer = free_port(), None
        if args.audit == "external":
            writer = start([*LATEBANDIT, "audit-writer", "--metrics-port", str(writer_port)], env, writer_port,
                           workdir / "audit-writer.log")  # fmt: skip
            servers.append(writer)
        bare_port = free_port()
        uvicorn = [sys.executable, "-m", "uvicorn", "benchmarks.bare_app:create_app", "--factory"]
        flags = ["--port", str(bare_port), "--no-access-log", "--log-level", "warning"]
        servers.append(start([*uvicorn, *flags], env, bare_port, workdir / "bare.log"))
        for spec in CAMPAIGNS.values():
            created = httpx.post(f"{latebandit.url}/campaigns", json=spec)
            assert created.status_code == 201, created.text
        for name in FULL_WINDOW:
            asyncio.run(fill_history(prefix, str(CAMPAIGNS[name]["id"])))
        changed = CAMPAIGNS["arms changed"]["id"]  # then an arm added and one retired, as a creative rotates
        assert httpx.post(f"{latebandit.url}/campaigns/{changed}/arms", json={"arm": "arm10"}).status_code == 201
        assert httpx.delete(f"{latebandit.url}/campaigns/{changed}/arms/arm3").status_code == 200
        rng = np.random.default_rng(0)
        bodies = {name: choose_bodies(spec, rng) for name, spec in CAMPAIGNS.items()}
        same_bodies = [f"{SAME_BODIES}{name}" for name in chosen if "features" in CAMPAIGNS[name]]
        cases = [(name, connections) for connections in (32, 4, 1) for name in ("bare", *same_bodies, *chosen)]
        drained_by = f"http://127.0.0.1:{writer_port if writer is not None else lb_port}/metrics"
        rounds: dict[tuple[str, int], list[Figures]] = {case: [] for case in cases}
        for measure in (False, *[True] * args.rounds):  # a warm-up round of 2 s first
            for name, connections in cases:
                if name == "bare":
                    port, body = bare_port, bodies["delayed-klucb"]
                elif name.startswith(SAME_BODIES):
                    port, body = bare_port, bodies[name.removeprefix(SAME_BODIES)]
                else:
                    port, body = lb_port, bodies[name]
                with paused(writer if port == lb_port else None):
                    figures = load(port, body, args.duration if measure else 2, connections)
                wait_drained(drained_by)
                if measure:
                    rounds[(name, connections)].append(figures)
        choose = {case: median(figures) for case, figures in rounds.items()}
        feedback: dict[str, FeedbackFigures] = {}
        for name in (name for name in FEEDBACK_CASES if name in chosen):
            console.print(f"signing the /feedback batches of {name} ...")
            campaign = Campaign(**CAMPAIGNS[name])
            needed = int((args.duration + 2) * 100_000 / args.batch) + 8  # more than a worker takes in the time
            signed, decisions = feedback_bodies(campaign, args.batch, needed)
            if campaign.contextual:
                keep_features(prefix, campaign, decisions)
            feedback[name] = measure_feedback(latebandit, lb_port, writer, drained_by, signed, args.duration)
        workers, busy = None, {}
        if not args.no_workers and "delayed-klucb" in chosen:
            _, busy["one worker, 32 connections"] = busy_load(
                writer, lb_port, bodies["delayed-klucb"], args.duration, 32, 1
            )
            stop(servers.pop(0))
            two, two_port = serve(env, 2, workdir)
            servers.append(two)
            load(two_port, bodies["delayed-klucb"], 2, 64)
            workers, busy["two workers, 64 connections"] = busy_load(
                writer, two_port, bodies["delayed-klucb"], args.duration, 64, args.rounds
            )
        report(console, choose, feedback, workers, busy, args)
    finally:
        for server in servers:
            stop(server)
        teardown(prefix, database)


def report(console: Console, choose: dict[tuple[str, int], Figures], feedback: dict[str, FeedbackFigures],
           workers: Figures | None, busy: dict[str, dict[str, float]], args: argparse.Namespace) -> None:  # fmt: skip
    table = Table(title=f"/choose, {args.rounds} rounds of {args.duration:g} s (medians), ratios to bare in this run")
    for column in ("case", "connections", "req/s", "p50 ms", "p99 ms", "throughput ratio", "p50 ratio", "p99 ratio",
                   "errors"):  # fmt: skip
        table.add_column(column, no_wrap=column == "case")
    figures: dict[str, object] = {"load": "wrk" if shutil.which("wrk") else "python client", "cases": []}
    for (name, connections), row in choose.items():
        bare = choose[("bare", connections)]
        ratios = (row.throughput / bare.throughput, row.p50_ms / bare.p50_ms, row.p99_ms / bare.p99_ms)
        table.add_row(name, str(connections), f"{row.throughput:,.0f}", f"{row.p50_ms:.2f}", f"{row.p99_ms:.2f}",
                      *(f"{ratio:.2f}" for ratio in ratios), str(row.errors))  # fmt: skip
        figures["cases"].append(
            {
                "case": name,
                "connections": connections,
                **asdict(row),  # type: ignore[attr-defined]
                "throughput_ratio": ratios[0],
                "p50_ratio": ratios[1],
                "p99_ratio": ratios[2],
            }
        )
    console.print(table)
    for (name, connections), row in choose.items():
        same = choose.get((f"{SAME_BODIES}{name}", connections))
        if same is not None:
            console.print(f"{name}, {connections} connections, against the bare endpoint given its bodies: throughput "
                          f"{row.throughput / same.throughput:.2f}x, p50 {row.p50_ms / same.p50_ms:.2f}x, p99 "
                          f"{row.p99_ms / same.p99_ms:.2f}x")  # fmt: skip
    figures["feedback"] = measured = {}
    for name, run in feedback.items():
        console.print(f"/feedback, {name}, batches of {args.batch}: {run.rate:,.0f} conversions/s per worker (target "
                      f"50,000), p99 {run.figures.p99_ms:.1f} ms, errors {run.figures.errors}; CPU a conversion: the "
                      f"worker's {run.cpu_us['worker']:.1f} µs, Redis's {run.cpu_us['redis']:.1f} µs")  # fmt: skip
        during, after = run.audit["during_load_per_second"], run.audit["after_load_per_second"]
        left, lag = run.audit["backlog_at_load_end"], run.audit["largest_lag_seconds"]
        console.print(f"audit writer ({args.audit}): {during:,.0f} records/s during the /feedback load, "
                      f"{after:,.0f}/s draining the {left:.0f} entries left after it (target 20,000), largest lag "
                      f"{lag:.1f}s")  # fmt: skip
        measured[name] = {"conversions_per_second": run.rate, "cpu_us_per_conversion": run.cpu_us,
                          **asdict(run.figures), "audit": {"mode": args.audit, **run.audit}}  # fmt: skip
    if workers is not None:
        one = choose[("delayed-klucb", 32)]
        ratio = workers.throughput / one.throughput
        console.print(f"two workers, delayed-klucb, 64 connections: {workers.throughput:,.0f} req/s = "
                      f"{ratio:.2f}x one worker (p99 {workers.p99_ms:.1f} ms)")  # fmt: skip
        for case, cores in busy.items():
            listed = ", ".join(f"{name} {used:.2f}" for name, used in cores.items())
            console.print(f"cores busy, {case} ({os.cpu_count()} on this machine): {listed}")
        figures["two_workers"] = {**asdict(workers), "ratio_to_one": workers.throughput / one.throughput,
                                  "cores_busy": busy}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "service.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
