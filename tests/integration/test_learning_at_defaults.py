"""The learning-at-defaults harness (benchmarks/learning_at_defaults.py) checked against what the service
recorded: its regret, pulls, delivered conversions and decision rate recounted from the audit log and the
campaign's state, and every recorded conversion recomputed from the seed's own draws. What is verified is
the harness's accounting, not any policy's result."""

from __future__ import annotations

import math
from collections import Counter

import orjson
import pytest

from benchmarks.asgi_caller import AsgiCaller
from benchmarks.learning_at_defaults import (
    AGGREGATE_SECONDS,
    Draws,
    Run,
    SimulatedClock,
    World,
    arm_name,
    drive,
)
from latebandit.audit.export import export_lines
from latebandit.audit.log import AuditLog
from latebandit.config import Settings
from latebandit.engine.core import DecisionEngine
from latebandit.timeutil import MICROS, parse_time, wall_clock
from tests.e2e.server import SECRET
from tests.inprocess import client, started

pytestmark = pytest.mark.slow

# High rates and short delays: many conversions, most of them delivered within the run's 100 s.
WORLD = World("tiny", (0.5, 0.3, 0.1), {"family": "exponential", "mean": 5}, 20, 2_000)
SEED = 7
PER_TICK = 20  # the harness asks a second's decisions together at 20/s


async def run_and_record(tmp_path, policy: str, world: World = WORLD) -> tuple[Run, dict, list[dict], int, int]:
    """The harness's run, the campaign's state at its end, the audit log's lines, and the clock's start
    and end."""
    settings = Settings(_env_file=None, secret=SECRET, database_url=f"sqlite:///{tmp_path / 'audit.db'}")
    start = wall_clock() // MICROS * MICROS
    clock = SimulatedClock(start)
    async with started(settings, clock) as app:
        run = await drive(AsgiCaller(app), clock, world, policy, SEED, "c")
        async with client(app) as http:
            state = (await http.get("/campaigns/c/state")).json() if run.refused is None else {}
    lines = [orjson.loads(line) for line in export_lines(AuditLog(settings.sqlalchemy_url), "c", None, None)]
    return run, state, lines, start, clock.now


@pytest.mark.parametrize("policy", ["uniform", "ucb1", "delayed-klucb"])
async def test_attributed_run_matches_the_audit_log(tmp_path, policy: str) -> None:
    run, state, lines, start, end = await run_and_record(tmp_path, policy)
    assert run.failure is None and run.refused is None and not run.rejected
    names = {arm_name(WORLD, k): k for k in range(len(WORLD.rates))}
    decisions = {line["decision_id"]: line for line in lines if line["type"] == "decision"}
    conversions = [line for line in lines if line["type"] == "conversion"]

    # regret, pulls and decisions, from the audit log's decision lines
    pulls = Counter(names[line["arm"]] for line in decisions.values())
    assert run.decisions == len(decisions) == WORLD.decisions
    assert run.pulls == [pulls[k] for k in range(len(WORLD.rates))]
    best = max(WORLD.rates)
    assert run.regret == pytest.approx(sum((best - WORLD.rates[k]) * n for k, n in pulls.items()), abs=1e-9)
    assert run.regret_at[-1] == pytest.approx(run.regret)
    # ... and from the campaign's own state
    assert {names[arm]: row["pulls"] for arm, row in state["arms"].items()} == dict(pulls)
    assert sum(row["conversions"] for row in state["arms"].values()) == len(conversions)

    # the declared rate: one tick a second, 20 decisions in each, the last one at the clock's end
    ticks = Counter(parse_time(line["at"]) for line in decisions.values())
    assert set(ticks.values()) == {PER_TICK}
    assert sorted(ticks) == [start + second * MICROS for second in range(WORLD.decisions // PER_TICK)]
    assert max(ticks) == end

    # every arm played by the decision the harness says (the log's order is the decisions', checked below)
    first_seen: dict[int, int] = {}
    for position, line in enumerate(decisions.values(), start=1):
        first_seen.setdefault(names[line["arm"]], position)
    assert len(first_seen) == len(WORLD.rates) and run.first_all_arms == max(first_seen.values())

    # every recorded conversion is the seed's: decision i (the log's i-th) converted on its arm, after its delay
    draws = Draws.of(WORLD, SEED)
    order = list(decisions)
    for line in conversions:
        i = int(line["event_id"].removeprefix("c"))
        assert order[i] == line["decision_id"]
        delay_us = parse_time(line["occurred_at"]) - parse_time(decisions[line["decision_id"]]["at"])
        assert delay_us == round(draws.delays[i] * MICROS)
    # ... and exactly those whose time came by the end were delivered
    expected = {i for i, at in converted(draws, [names[decisions[d]["arm"]] for d in order], start) if at <= end}
    assert {int(line["event_id"].removeprefix("c")) for line in conversions} == expected
    assert run.delivered == run.accepted == len(conversions)
    assert run.conversions == sum(
        draws.uniforms[i] < WORLD.rates[names[decisions[d]["arm"]]] for i, d in enumerate(order)
    )


def converted(draws: Draws, arms: list[int], start: int) -> list[tuple[int, int]]:
    """(decision, when its conversion occurs) for the decisions of the log's order that convert."""
    return [(i, start + i // PER_TICK * MICROS + round(draws.delays[i] * MICROS))
            for i, k in enumerate(arms) if draws.uniforms[i] < WORLD.rates[k]]  # fmt: skip


async def test_anonymous_run_sends_whole_minutes(tmp_path) -> None:
    """odaaf takes aggregates: one per minute with conversions, the minute's count, and watermarks."""
    run, state, lines, start, end = await run_and_record(tmp_path, "odaaf")
    assert run.failure is None and run.refused is None and not run.rejected
    aggregates = [line for line in lines if line["type"] == "aggregate"]
    assert aggregates and not [line for line in lines if line["type"] == "conversion"]
    minute = AGGREGATE_SECONDS * MICROS
    per_minute = {(parse_time(line["start"]) - start) // minute: line["value"] for line in aggregates}
    for line in aggregates:
        assert (parse_time(line["start"]) - start) % minute == 0
        assert parse_time(line["end"]) - parse_time(line["start"]) == minute <= end - start
    assert run.delivered == sum(per_minute.values())
    # each minute's count is the conversions that occur in it, recomputed from the log's decisions in order
    names = {arm_name(WORLD, k): k for k in range(len(WORLD.rates))}
    arms = [names[line["arm"]] for line in lines if line["type"] == "decision"]
    expected = Counter((at - start) // minute for _, at in converted(Draws.of(WORLD, SEED), arms, start))
    assert per_minute == {m: n for m, n in expected.items() if start + (m + 1) * minute <= end}
    assert sum(state["arms"][arm]["pulls"] for arm in state["arms"]) == run.decisions == WORLD.decisions


async def test_a_refusal_and_a_500_are_the_policy_s_outcome(tmp_path, monkeypatch) -> None:
    """A campaign the service refuses, and one whose /choose answers 500, end their run with the reason."""
    unbounded = World("unbounded", WORLD.rates, {"family": "pareto", "alpha": 1.5, "scale": 2}, 20, 100)
    refused, *_ = await run_and_record(tmp_path, "odaaf-b", unbounded)
    assert refused.refused is not None and refused.refused.startswith("422") and "max_delay" in refused.refused
    assert refused.decisions == 0 and refused.failure is None

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the policy broke")

    monkeypatch.setattr(DecisionEngine, "choose", broken)
    (tmp_path / "broken").mkdir()
    failed, *_ = await run_and_record(tmp_path / "broken", "ucb1")
    assert failed.failure is not None and failed.failure.startswith("/choose answered 500")
    assert "at decision 1" in failed.failure and failed.decisions == 0
    assert math.isclose(failed.regret, 0.0)
