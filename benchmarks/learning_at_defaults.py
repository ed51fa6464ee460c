"""Benchmark: does every policy learn at its defaults, in the service's own app, on realistic traffic?

    .venv/bin/python -m benchmarks.learning_at_defaults [--policies NAME ...] [--world W1 W2 ...] [--seeds 3]
        [--decisions N] [--redis URL] [--json OUT] [--markdown] [--load JSON]

Each policy gets a campaign created as a new user would: the arms, the policy's name and nothing else but
the delay model and the decision rate the campaign declares (the world's own; no params, window and
buckets left at the service's defaults). The app runs in process on a simulated clock (the lifespan run as
a server runs it; the embedded store, or Redis with ``--redis``), and a Bernoulli world drives it:

- each simulated tick (one second, or a tenth at rates over 100/s) its decisions are asked together,
  concurrently, through ``POST /choose``, as a busy server's would be;
- a decision converts with its arm's rate and after a delay drawn from the declared model; the draws are
  the seed's, the same for every policy (common random numbers): decision i converts when u_i < μ(arm),
  after d_i, whichever arm it got, so two policies differ only by their choices;
- the conversions reach ``POST /feedback`` once the clock passes their time: each one as an attributed
  ``conversion`` for a policy that takes them, and for an anonymous policy (its ``feedback`` says so)
  as one ``aggregate`` per minute (the conversions that occurred in it) with a ``watermark`` at its end.

The arms are listed in an order drawn from the seed, so that a campaign's first arm (its default) is the
best one only by chance. Regret is the pseudo-regret Σ (μ* − μ(arm chosen)) over the decisions answered.

Verdict (the issue's goal: plays every arm early, ends well below uniform and not far above ucb1):

- every arm played within the first ``EARLY`` (10 %) of the decisions: long enough for an elimination
  policy that plays each arm in a block of a few mean delays (W1: mean delay 3,600 decisions, 4 arms), short
  enough to catch a schedule stuck on one arm for a large part of the run;
- mean regret at most ``BELOW_UNIFORM`` (0.5) times uniform's: learning has at least halved the cost of
  not knowing the best arm;
- mean regret at most ``NEAR_UCB1`` (1.5) times ucb1's: correcting for delays should not cost more than
  half again the regret of the delay-naive baseline, which at these rates (a few percent, gaps of one
  point) is itself slow (its exploration term is sized for rewards in [0, 1], not for rates of 5 %).

A campaign that cannot be created, or any answer other than 200 to a decision or a feedback batch (a 500
above all), is that policy's failure, reported as such; the other policies still run.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import secrets
import sys
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.asgi_caller import Answer, AsgiCaller
from latebandit.api.app import create_app
from latebandit.config import Settings
from latebandit.delays.models import delay_from_spec
from latebandit.policies import POLICIES
from latebandit.sim.runner import mean_and_error
from latebandit.timeutil import MICROS, format_time, wall_clock

EARLY, BELOW_UNIFORM, NEAR_UCB1 = 0.10, 0.5, 1.5
BASELINES = ("uniform", "ucb1")
LEARNING = tuple(name for name in POLICIES if name != "fixed")
MAX_TICK_DECISIONS = 100  # decisions asked together; above 100/s a tick is shorter than a second
MAX_EVENTS = 10_000  # per /feedback request (the API's limit)
AGGREGATE_SECONDS = 60
CHECKPOINTS = 10  # regret reported after every tenth of the decisions


@dataclass(frozen=True)
class World:
    name: str
    rates: tuple[float, ...]
    delay: dict[str, Any]  # as the campaign declares it, and as the world draws from it
    decisions_per_second: float
    decisions: int

    def with_decisions(self, decisions: int | None) -> World:
        return self if decisions is None else World(**{**asdict(self), "decisions": decisions})


RATES = (0.05, 0.04, 0.03, 0.02)
WORLDS = {
    "W1": World("W1", RATES, {"family": "pareto", "alpha": 1.5, "scale": 60}, 20, 200_000),
    "W2": World("W2", RATES, {"family": "exponential", "mean": 3600}, 100, 500_000),
    "W3": World("W3", RATES, {"family": "exponential", "mean": 86400}, 1000, 2_000_000),
}


@dataclass(frozen=True)
class Draws:
    """A seed's world: the arms' listing order, and per decision a uniform and a delay (seconds)."""

    order: np.ndarray  # order[k]: the index in world.rates of the campaign's k-th arm
    uniforms: np.ndarray
    delays: np.ndarray

    @classmethod
    def of(cls, world: World, seed: int) -> Draws:
        rng = np.random.default_rng([30, seed])
        order = rng.permutation(len(world.rates))
        uniforms = rng.random(world.decisions)
        return cls(order, uniforms, delay_from_spec(world.delay).sample(rng, world.decisions))


@dataclass
class Run:
    """One policy on one seed: what it chose and what the service answered."""

    policy: str
    seed: int
    decisions: int = 0
    regret: float = 0.0
    regret_at: list[float] = field(default_factory=list)  # after each tenth of the world's decisions
    pulls: list[int] = field(default_factory=list)  # per arm of world.rates (not the campaign's order)
    first_all_arms: int | None = None  # the decision (1-based) by which every arm had been played
    fallbacks: int = 0
    conversions: int = 0  # drawn by the world for the decisions answered
    delivered: int = 0  # conversions whose time the clock passed: sent, one by one or in aggregates
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    refused: str | None = None  # the campaign refused with a 4xx, the reason its body gives
    failure: str | None = None  # a 5xx, a failed start, an unexpected answer
    wall_seconds: float = 0.0


class SimulatedClock:
    """Epoch microseconds that move only when the harness moves them."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Failed(Exception):
    """The service answered something other than success: the policy's run stops with this failure."""


def campaign_body(world: World, policy: str, campaign_id: str, draws: Draws) -> dict[str, Any]:
    """Only what the API requires, plus the delay model and the rate the campaign declares."""
    return {
        "id": campaign_id, "arms": [arm_name(world, int(k)) for k in draws.order], "policy": {"name": policy},
        "delay": world.delay, "decisions_per_second": world.decisions_per_second,
    }  # fmt: skip


def arm_name(world: World, k: int) -> str:
    return f"arm{k}-{world.rates[k]:g}"


async def drive(
    caller: AsgiCaller, clock: SimulatedClock, world: World, policy: str, seed: int, campaign_id: str
) -> Run:
    """Creates the campaign, then plays the world's decisions and feedback through the app; failures end
    the run and are kept in ``Run.failure``."""
    draws = Draws.of(world, seed)
    run = Run(policy, seed, pulls=[0] * len(world.rates))
    started = time.perf_counter()
    try:
        created = await caller.post("/campaigns", campaign_body(world, policy, campaign_id, draws))
        if 400 <= created.status < 500:
            run.refused = described(created)
            return run
        if created.status != 201:
            raise Failed(f"campaign creation answered {described(created)}")
        feed = (AggregateFeed if POLICIES[policy].feedback == "anonymous" else ConversionFeed)(campaign_id, clock.now)
        await play(caller, clock, world, draws, run, feed)
    except Failed as failed:
        run.failure = str(failed)
    finally:
        run.wall_seconds = time.perf_counter() - started
    return run


async def play(caller: AsgiCaller, clock: SimulatedClock, world: World, draws: Draws, run: Run, feed: Feed) -> None:
    per_tick = min(MAX_TICK_DECISIONS, max(1, math.ceil(world.decisions_per_second)))
    tick_us = round(per_tick / world.decisions_per_second * MICROS)
    start = clock.now
    rates = np.asarray(world.rates)
    gaps = rates.max() - rates
    index = {arm_name(world, k): k for k in range(len(rates))}
    checkpoints = [round(world.decisions * (c + 1) / CHECKPOINTS) for c in range(CHECKPOINTS)]
    seen: set[int] = set()
    for first in range(0, world.decisions, per_tick):
        clock.now = start + (first // per_tick) * tick_us
        await deliver(caller, feed.due(clock.now), run)
        count = min(per_tick, world.decisions - first)
        answers = await asyncio.gather(*(caller.post("/choose", {"campaign": feed.campaign}) for _ in range(count)))
        for i, answer in enumerate(answers, start=first):
            if answer.status != 200:
                raise Failed(f"/choose answered {described(answer)} at decision {i + 1}")
            decision = answer.json()
            k = index[decision["arm"]]
            run.decisions += 1
            run.pulls[k] += 1
            run.regret += float(gaps[k])
            run.fallbacks += bool(decision["fallback"])
            seen.add(k)
            if run.first_all_arms is None and len(seen) == len(rates):
                run.first_all_arms = run.decisions
            if run.decisions in checkpoints:
                run.regret_at.append(run.regret)
            if draws.uniforms[i] < rates[k]:
                run.conversions += 1
                feed.add(i, decision["decision_id"], clock.now + round(float(draws.delays[i]) * MICROS))


async def deliver(caller: AsgiCaller, events: list[dict[str, Any]], run: Run) -> None:
    for batch in range(0, len(events), MAX_EVENTS):
        answer = await caller.post("/feedback", {"events": events[batch : batch + MAX_EVENTS]})
        if answer.status != 200:
            raise Failed(f"/feedback answered {described(answer)}")
        result = answer.json()
        run.accepted += result["accepted"]
        for rejection in result["rejected"]:
            run.rejected[rejection["reason"]] = run.rejected.get(rejection["reason"], 0) + 1
    run.delivered += sum(int(event.get("value", 1)) for event in events if event["type"] != "watermark")


class Feed(ABC):
    """The conversions drawn so far, turned into feedback events once the clock passes them."""

    def __init__(self, campaign: str, start: int) -> None:
        self.campaign = campaign
        self.start = start

    @abstractmethod
    def add(self, decision: int, decision_id: str, occurs_at: int) -> None: ...

    @abstractmethod
    def due(self, now: int) -> list[dict[str, Any]]: ...


class ConversionFeed(Feed):
    """Attributed: each conversion on its own, at its time."""

    def __init__(self, campaign: str, start: int) -> None:
        super().__init__(campaign, start)
        self.pending: list[tuple[int, int, str]] = []  # (occurs_at, decision, decision_id), a heap

    def add(self, decision: int, decision_id: str, occurs_at: int) -> None:
        heapq.heappush(self.pending, (occurs_at, decision, decision_id))

    def due(self, now: int) -> list[dict[str, Any]]:
        events = []
        while self.pending and self.pending[0][0] <= now:
            occurs_at, decision, decision_id = heapq.heappop(self.pending)
            events.append({"type": "conversion", "event_id": f"c{decision}", "decision_id": decision_id,
                           "occurred_at": format_time(occurs_at)})  # fmt: skip
        return events


class AggregateFeed(Feed):
    """Anonymous: per minute since the first decision, the conversions that occurred in it, once it is over,
    then a watermark at its end (a minute with none sends no aggregate; the watermark says it is complete)."""

    def __init__(self, campaign: str, start: int) -> None:
        super().__init__(campaign, start)
        self.per_minute: Counter[int] = Counter()
        self.closed = 0  # minutes sent

    def add(self, decision: int, decision_id: str, occurs_at: int) -> None:
        self.per_minute[(occurs_at - self.start) // (AGGREGATE_SECONDS * MICROS)] += 1

    def due(self, now: int) -> list[dict[str, Any]]:
        complete = (now - self.start) // (AGGREGATE_SECONDS * MICROS)
        if complete <= self.closed:
            return []
        events: list[dict[str, Any]] = []
        for minute in range(self.closed, complete):
            value = self.per_minute.pop(minute, 0)
            if value:
                events.append({"type": "aggregate", "event_id": f"m{minute}", "campaign": self.campaign,
                               "start": self._at(minute), "end": self._at(minute + 1), "value": value})  # fmt: skip
        self.closed = complete
        events.append({"type": "watermark", "campaign": self.campaign, "at": self._at(complete)})
        return events

    def _at(self, minute: int) -> str:
        return format_time(self.start + minute * AGGREGATE_SECONDS * MICROS)


def described(answer: Answer) -> str:
    return f"{answer.status} {answer.text()[:300]}"


@asynccontextmanager
async def app_on(clock: SimulatedClock, redis_url: str | None) -> AsyncIterator[AsgiCaller]:
    """The service's app with its lifespan run: the embedded store (or Redis under a key prefix of its own,
    deleted afterwards), its audit log in a temporary SQLite file."""
    prefix = f"lbdefaults{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory(prefix="learning-at-defaults-") as folder:
        settings = Settings(_env_file=None, secret=secrets.token_hex(32), database_url=f"sqlite:///{folder}/audit.db",
                            redis_url=redis_url, redis_prefix=prefix)  # fmt: skip
        app = create_app(settings, clock)
        try:
            async with app.router.lifespan_context(app):
                yield AsgiCaller(app)
        finally:
            if redis_url:
                import redis

                client = redis.Redis.from_url(redis_url)
                for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                    client.delete(key)


async def measure(world: World, policy: str, seed: int, redis_url: str | None = None) -> Run:
    """One policy on one seed, in an app of its own; a start that fails is the run's failure too."""
    clock = SimulatedClock(wall_clock() // (AGGREGATE_SECONDS * MICROS) * AGGREGATE_SECONDS * MICROS)
    try:
        async with app_on(clock, redis_url) as caller:
            return await drive(caller, clock, world, policy, seed, f"{policy}-s{seed}")
    except Exception as error:
        return Run(policy, seed, pulls=[0] * len(world.rates), failure=f"app failed: {type(error).__name__}: {error}")


# --- verdicts and reports ---------------------------------------------------------------------------------


@dataclass
class Summary:
    policy: str
    runs: list[Run]
    regret_mean: float
    regret_se: float
    to_uniform: float | None
    to_ucb1: float | None
    first_all_arms: list[int | None]
    decisions_per_wall_second: float
    outcome: str  # pass, fail, refused (a 4xx at creation, which the issue allows when it says what to set), baseline
    reasons: list[str]


def summarize(world: World, runs: dict[str, list[Run]]) -> list[Summary]:
    def mean(policy: str, seeds: set[int]) -> float | None:
        """The baseline's mean regret on ``seeds`` (the same draws as the policy compared), if it has them all."""
        batch = [run for run in runs.get(policy, []) if run.seed in seeds]
        if len(batch) < len(seeds) or any(run.failure or run.refused for run in batch):
            return None
        return float(np.mean([run.regret for run in batch]))

    summaries = []
    for policy, batch in runs.items():
        if not batch:
            continue
        seeds = {run.seed for run in batch}
        uniform, ucb1 = mean("uniform", seeds), mean("ucb1", seeds)
        regret, error = mean_and_error(np.array([run.regret for run in batch]))
        first = [run.first_all_arms for run in batch]
        outcome, reasons = verdict(world, policy, batch, regret, uniform, ucb1)
        decided = sum(run.decisions for run in batch)
        seconds = sum(run.wall_seconds for run in batch)
        summaries.append(Summary(
            policy, batch, regret, error, None if uniform is None else regret / uniform,
            None if ucb1 is None else regret / ucb1, first, decided / seconds if seconds else 0.0, outcome, reasons,
        ))  # fmt: skip
    return summaries


def verdict(
    world: World, policy: str, batch: list[Run], regret: float, uniform: float | None, ucb1: float | None
) -> tuple[str, list[str]]:
    """The outcome against the issue's goal, and what missed it."""
    failures = [run.failure for run in batch if run.failure]
    if failures:
        return "fail", [f"seed {run.seed}: {run.failure}" for run in batch if run.failure]
    refusals = [run.refused for run in batch if run.refused]
    if refusals:
        return "refused", [refusal_detail(refusals[0])]
    if policy == "uniform":
        return "baseline", []
    reasons = []
    if any(at is None or at > EARLY * world.decisions for at in (run.first_all_arms for run in batch)):
        reasons.append(f"an arm unplayed after {EARLY:.0%} of the decisions")
    if uniform is not None and regret > BELOW_UNIFORM * uniform:
        reasons.append(f"regret {regret / uniform:.2f}x uniform's (> {BELOW_UNIFORM})")
    if ucb1 is not None and regret > NEAR_UCB1 * ucb1:
        reasons.append(f"regret {regret / ucb1:.2f}x ucb1's (> {NEAR_UCB1})")
    return ("fail" if reasons else "pass"), reasons


def refusal_detail(refusal: str) -> str:
    """The ``detail`` of a refusal kept as "status body", or all of it when the body is not the API's JSON."""
    status, _, body = refusal.partition(" ")
    try:
        return f"{status}: {json.loads(body)['detail']}"
    except (ValueError, TypeError, KeyError):
        return refusal


def console_table(world: World, seeds: Sequence[int], summaries: list[Summary]) -> Table:
    table = Table(title=f"{world.name}: {describe(world)}, seeds {list(seeds)}")
    for column in ("policy", "regret (mean ± se)", "x uniform", "x ucb1", "every arm by", "decisions/s", "verdict"):
        table.add_column(column, overflow="fold")
    for row in summaries:
        table.add_row(*cells(row))
    return table


def markdown_table(world: World, seeds: Sequence[int], summaries: list[Summary]) -> str:
    lines = [
        f"{world.name}: {describe(world)}, seeds {', '.join(map(str, seeds))}.",
        "",
        "| policy | regret (mean ± se) | x uniform | x ucb1 | every arm played by decision | decisions/s | verdict |",
        "| --- | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    lines += ["| " + " | ".join(cells(row, markdown=True)) + " |" for row in summaries]
    return "\n".join(lines)


def cells(row: Summary, markdown: bool = False) -> list[str]:
    def ratio(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}"

    verdict = f"**{row.outcome}**" if markdown else row.outcome
    verdict += "".join(f"; {reason}" for reason in row.reasons)
    if markdown:
        verdict = verdict.replace("|", "\\|").replace("\n", " ")
    name = f"`{row.policy}`" if markdown else row.policy
    if row.outcome == "refused" or any(run.failure and not run.decisions for run in row.runs):
        return [name, "", "", "", "", "", verdict]
    first = ", ".join("never" if at is None else f"{at:,}" for at in row.first_all_arms)
    error = f" ± {row.regret_se:,.1f}" if len(row.runs) > 1 else ""  # one seed has no standard error
    return [name, f"{row.regret_mean:,.1f}{error}", ratio(row.to_uniform), ratio(row.to_ucb1),
            first, f"{row.decisions_per_wall_second:,.0f}", verdict]  # fmt: skip


def describe(world: World) -> str:
    delay = ", ".join(f"{key} {value}" for key, value in world.delay.items() if key != "family")
    return (f"rates {list(world.rates)}, {world.delay['family']} delays ({delay}), "
            f"{world.decisions_per_second:g} decisions/s, {world.decisions:,} decisions")  # fmt: skip


def report(worlds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The JSON written by --json (and read back by --load)."""
    return {"thresholds": {"early": EARLY, "below_uniform": BELOW_UNIFORM, "near_ucb1": NEAR_UCB1}, "worlds": worlds}


def world_report(world: World, seeds: Sequence[int], runs: dict[str, list[Run]]) -> dict[str, Any]:
    return {"world": asdict(world), "seeds": list(seeds),
            "runs": {policy: [asdict(run) for run in batch] for policy, batch in runs.items()}}  # fmt: skip


def merged(files: list[dict[str, Any]]) -> dict[str, tuple[World, list[int], dict[str, list[Run]]]]:
    """The worlds of several --json files, their policies' runs together (a world's seeds must agree)."""
    results: dict[str, tuple[World, list[int], dict[str, list[Run]]]] = {}
    for worlds in files:
        for name, entry in worlds.items():
            world = World(**{**entry["world"], "rates": tuple(entry["world"]["rates"])})
            _, seeds, runs = results.setdefault(name, (world, entry["seeds"], {}))
            if (world, seeds) != (results[name][0], entry["seeds"]):
                raise SystemExit(f"{name}: the files disagree on the world or the seeds")
            runs.update({policy: [Run(**run) for run in batch] for policy, batch in entry["runs"].items()})
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", choices=LEARNING, default=list(LEARNING), metavar="NAME",
                        help="policies to measure (with uniform and ucb1: the ratios need them)")  # fmt: skip
    parser.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True,
                        help="run uniform and ucb1 too (--no-baselines: another run has them)")  # fmt: skip
    parser.add_argument("--world", nargs="+", choices=sorted(WORLDS), default=["W1"])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 1..N, the same world draws for every policy")
    parser.add_argument("--decisions", type=int, help="decisions per run (default: the world's)")
    parser.add_argument("--redis", metavar="URL", help="run on Redis (under a key prefix of its own) instead of "
                        "the embedded store")  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="OUT", help="write every run and the thresholds as JSON")
    parser.add_argument("--markdown", action="store_true", help="also print the tables as the docs have them")
    parser.add_argument("--load", type=Path, nargs="+", metavar="JSON",
                        help="report earlier --json files (merged) instead of running")  # fmt: skip
    args = parser.parse_args(argv)
    console = Console(width=200, stderr=args.markdown)
    if args.load:
        results = merged([json.loads(path.read_text())["worlds"] for path in args.load])
    else:
        policies = list(dict.fromkeys([*(BASELINES if args.baselines else ()), *args.policies]))
        seeds = list(range(1, args.seeds + 1))
        results = {}
        for name in args.world:
            world = WORLDS[name].with_decisions(args.decisions)
            runs: dict[str, list[Run]] = {policy: [] for policy in policies}
            results[name] = (world, seeds, runs)
            for seed in seeds:  # seed by seed: a run cut short still has every policy on its first seeds
                for policy in policies:
                    run = asyncio.run(measure(world, policy, seed, args.redis))
                    runs[policy].append(run)
                    problems = [f"rejected {run.rejected}" if run.rejected else None, run.failure, run.refused]
                    console.print(f"{name} seed {seed} {policy}: regret {run.regret:.1f}, {run.wall_seconds:.1f} s"
                                  + "".join(f"; {problem}" for problem in problems if problem))  # fmt: skip
                    if args.json:  # after every run: a long run interrupted keeps what it measured
                        entries = {name: world_report(*result) for name, result in results.items()}
                        args.json.write_text(json.dumps(report(entries), indent=1))
    for world, seeds, runs in results.values():
        summaries = summarize(world, runs)
        console.print(console_table(world, seeds, summaries))
        if args.markdown:
            print(markdown_table(world, seeds, summaries) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
