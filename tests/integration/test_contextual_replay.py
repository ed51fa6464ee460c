"""`replay --policy` on contextual campaigns, served through the decision engine with ``log_actions``. On its
own log a deterministic policy makes every logged choice (the replay's statistics are the service's). On logs
of a randomised otf-lints (σ0 = 100: every action keeps a propensity of 0.09 or more) on worlds whose
conversion probabilities the test knows, a learning policy's estimate is told from a uniform one's, and each
interval holds the true value of the policy's own choices at the logged requests, computed here from those
probabilities. Then the same through `latebandit export` and `latebandit replay`, and its refusals."""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from latebandit.audit.log import AuditLog
from latebandit.audit.writer import AuditWriter
from latebandit.campaign import CampaignSpec
from latebandit.cli import app
from latebandit.engine.contextual import Offer
from latebandit.engine.core import Decision, DecisionEngine, EngineOptions
from latebandit.replay.contextual import ContextualLog, evaluate_contextual, read_contextual_log
from latebandit.replay.evaluate import Evaluation
from latebandit.replay.logged import NotEvaluable
from latebandit.store.memory import MemoryStore
from latebandit.timeutil import MICROS
from latebandit.tokens import TokenSigner
from tests.integration.test_arm_changes_live import Clock, audit_lines, converted

DECISIONS = 2400
EVERY = 5 * MICROS  # between two requests
RECEIPT_LAG = 30 * MICROS  # a conversion reaches the service this long after it occurred, or a little more
WINDOW, DELAY_MEAN = 600.0, 150.0  # exponential delays: 1.8 % of the conversions come after the window
WITHIN = 1.0 - math.exp(-WINDOW / DELAY_MEAN)
THETA = np.array([0.5, 0.4, 0.1, 0.0])  # actions form: P(convert) = θᵀa, from 0 to 0.5
ARM_THETAS = 0.6 * np.eye(3)  # context form: arm k converts with 0.6·x_k, and each context has one large x_k
LOGGING = {"name": "otf-lints", "params": {"sigma0": 100.0}}
SPECS = {
    "actions": {"id": "ctx", "policy": LOGGING, "features": 4, "window": WINDOW, "log_actions": True},
    "context": {"id": "ctx", "arms": ["a", "b", "c"], "policy": LOGGING, "features": 3, "window": WINDOW},
}
GOOD = ("otf-linucb", {"alpha": 0.1})  # the paper's width is made for worst cases: it would explore for long
BAD = ("uniform", {})


@dataclass(frozen=True)
class Served:
    form: str
    lines: list[dict[str, Any]]  # the audit log as event-log lines
    probabilities: dict[str, np.ndarray]  # decision id → P(convert) of each offered action (or of each arm)
    database_url: str  # the same log in an audit database, for `latebandit export`


CUBE = np.array([[1.0, x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]) / 2.0  # norm 1 each


def cube_actions(rng: np.random.Generator) -> tuple[Offer, np.ndarray]:
    """An actions request and the conversion probability of each action: 4 of the 8 vectors (1, ±1, ±1, ±1)/2,
    all of one norm, so Thompson sampling about θ̂ ≈ 0 favours none for its length alone."""
    vectors = CUBE[rng.choice(len(CUBE), 4, replace=False)]
    return Offer(vectors, tuple(f"sku{k}" for k in rng.permutation(4))), vectors @ THETA


def context(rng: np.random.Generator) -> tuple[Offer, np.ndarray]:
    """A context request (one large coordinate) and the conversion probability of each arm."""
    features = rng.uniform(0.0, 0.2, 3)
    features[rng.integers(3)] = 0.7 + rng.uniform(0.0, 0.2)
    return Offer(features[None], None), ARM_THETAS @ features


def uneven_actions(rng: np.random.Generator) -> tuple[Offer, np.ndarray]:
    """Actions of random lengths: a UCB index never ties on them, so its choices are a function of its sums."""
    vectors = rng.uniform(0.0, 0.5, (4, 4))
    return Offer(vectors, ("x", "y", "z", "w")), vectors @ THETA


async def serve(
    spec: dict[str, Any], offers: Callable[[np.random.Generator], tuple[Offer, np.ndarray]], decisions: int,
    database_url: str | None = None, arm_changes: dict[int, tuple[list[str], list[str]]] | None = None,
) -> Served:  # fmt: skip
    """``decisions`` requests, each converting with its chosen action's probability after an exponential delay;
    conversions are sent RECEIPT_LAG after they occurred, before the next request. The audit log goes to
    ``database_url`` too when given. ``arm_changes``: the arms added and retired before the request of that
    number (a context campaign's; ``offers`` gives a probability for every arm it will have)."""
    clock = Clock()
    store = MemoryStore(clock=clock)
    engine = DecisionEngine(store, TokenSigner("c" * 32), clock, np.random.default_rng(3),
                            EngineOptions(snapshot_interval=0.0))  # fmt: skip
    await engine.create_campaign(CampaignSpec(**spec))
    world = np.random.default_rng(4)
    pending: list[tuple[int, str, Decision]] = []
    probabilities = {}
    arms = list(spec.get("arms", []))
    for number in range(decisions):
        clock.now += EVERY
        if number in (arm_changes or {}):
            added, retired = (arm_changes or {})[number]
            arms += (await engine.change_arms("ctx", added, retired)).arms[len(arms) :]
        due = []
        while pending and pending[0][0] + RECEIPT_LAG <= clock.now:
            occurred, _, decision = heapq.heappop(pending)
            due.append(converted(decision, occurred))
        if due:
            assert (await engine.feedback(due)).rejected == []
        offer, converts = offers(world)
        decision = await engine.choose("ctx", offer=offer)
        probabilities[decision.decision_id] = converts
        chosen = offer.labels.index(decision.arm) if offer.labels else arms.index(decision.arm)
        if world.random() < converts[chosen]:
            delay = round(world.exponential(DELAY_MEAN) * MICROS)
            heapq.heappush(pending, (clock.now + delay, decision.decision_id, decision))
    lines = await audit_lines(store, "ctx")
    if database_url is not None:
        audit = AuditLog(database_url)
        audit.create_schema()
        try:
            await AuditWriter(store, audit, 1000).flush()
        finally:
            audit.dispose()
    return Served(
        spec.get("offers", "context" if "arms" in spec else "actions"), lines, probabilities, database_url or ""
    )


@pytest.fixture(scope="module", params=["actions", "context"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Served:
    path = tmp_path_factory.mktemp(f"audit-{request.param}") / "audit.db"
    offers = cube_actions if request.param == "actions" else context
    return asyncio.run(serve(SPECS[request.param], offers, DECISIONS, f"sqlite:///{path}"))


def true_values(served: Served, log: ContextualLog, evaluation: Evaluation) -> tuple[float, float]:
    """The expected reward (within the window) of the policy's choice at each logged decision, averaged over
    the decisions whose reward is known (what ips and snips estimate), and over the accepted ones (replay)."""
    assert evaluation.choices is not None
    expected = np.array([
        served.probabilities[decision.decision_id][choice] * WITHIN
        for decision, choice in zip(log.log.decisions, evaluation.choices, strict=True)
    ])  # fmt: skip
    known = np.array([decision.reward is not None for decision in log.log.decisions])
    accepted = ~np.isnan(evaluation.estimates["replay"].terms)
    return float(expected[known].mean()), float(expected[accepted].mean())


def test_estimates_tell_a_learning_policy_from_a_uniform_one_and_hold_their_true_values(served: Served) -> None:
    log = read_contextual_log(served.lines, None, None)
    assert len(log.log.decisions) == DECISIONS
    evaluations = [evaluate_contextual(log, name, params) for name, params in (GOOD, BAD)]
    truths = []
    for evaluation in evaluations:
        over_known, over_accepted = true_values(served, log, evaluation)
        truths.append(over_known)
        for estimator, truth in (("ips", over_known), ("snips", over_known), ("replay", over_accepted)):
            low, high = evaluation.estimates[estimator].ci95
            assert low <= truth <= high, (evaluation.policy, estimator, truth, low, high)
        assert evaluation.primary.estimator == "snips"  # the logged propensities are not exactly 1/K
        assert evaluation.steps > DECISIONS / 20  # propensities of 0.1 at least: M stays small
    good, bad = evaluations
    assert truths[0] > truths[1] + 0.15  # the comparison has teeth: the learner finds the strong actions
    assert good.primary.ci95[0] > bad.primary.ci95[1]


def test_the_logging_policy_replays_its_own_log_decision_for_decision() -> None:
    """On-policy, the replay's statistics are the service's at every decision: otf-linucb (deterministic, its
    frozen footprints in the index) evaluated on its own log makes every logged choice, so every decision is
    accepted and each estimate is the logged mean reward. (Conversions given to it when they occurred rather
    than when the service received them, it would disagree at 4 % of the decisions, the first after 30.)"""
    spec = {"id": "ctx", "policy": {"name": "otf-linucb", "params": {"alpha": 0.2}}, "features": 4,
            "window": WINDOW, "log_actions": True}  # fmt: skip
    served = asyncio.run(serve(spec, uneven_actions, 800))
    log = read_contextual_log(served.lines, None, None)
    assert {decision.propensity for decision in log.log.decisions} == {1.0}
    evaluation = evaluate_contextual(log, "otf-linucb", {"alpha": 0.2})
    assert evaluation.choices is not None
    assert evaluation.choices.tolist() == [offer.chosen for offer in log.offers]
    assert evaluation.steps == evaluation.decisions == 800
    rewards = [decision.reward for decision in log.log.decisions if decision.reward is not None]
    for estimate in evaluation.estimates.values():
        assert estimate.value == pytest.approx(np.mean(rewards), rel=1e-12)
    with pytest.raises(NotEvaluable, match="deterministic"):  # the check has teeth: the log cannot evaluate
        evaluate_contextual(log, "otf-linucb", {"alpha": 0.2, "correction": "none"})  # another index


def test_a_context_campaign_is_evaluated_through_its_arm_changes() -> None:
    """A context campaign whose arms changed while it served (one added, then one retired): the evaluated
    policy follows the log's arm set, choosing the added arm only after it came and the retired one only
    before it went, and the log is evaluated with its interval."""
    thetas = 0.6 * np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.4, 0.4, 0.4]])

    def four_arms(rng: np.random.Generator) -> tuple[Offer, np.ndarray]:
        features = rng.uniform(0.0, 0.57, 3)  # norm below 1
        return Offer(features[None], None), thetas @ features

    spec = {**SPECS["context"], "arms": ["a", "b", "c"]}
    served = asyncio.run(serve(spec, four_arms, 900, arm_changes={300: (["d"], []), 600: ([], ["b"])}))
    log = read_contextual_log(served.lines, None, None)
    assert [(change.added, change.retired) for change in log.log.arm_changes] == [(("d",), ()), ((), ("b",))]
    logged = [offer.chosen for offer in log.offers]
    assert 3 not in logged[:300] and 1 not in logged[600:]  # what the service served
    evaluation = evaluate_contextual(log, *GOOD)
    assert evaluation.choices is not None
    choices = evaluation.choices.tolist()
    assert 3 not in choices[:300] and 3 in choices[300:] and 1 in choices[:600] and 1 not in choices[600:]
    low, high = evaluation.primary.ci95
    assert low < evaluation.primary.value < high


def export(served: Served, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LATEBANDIT_DATABASE_URL", served.database_url)
    exported = CliRunner().invoke(app, ["export", "--campaign", "ctx"])
    assert exported.exit_code == 0, exported.output
    path.write_text(exported.stdout)


def replay(*args: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, ["replay", *map(str, args)])


def said(result: Any) -> str:
    """The command's output on one line: rich wraps a message to the terminal's width."""
    return " ".join(result.output.split())


def test_the_cli_evaluates_contextual_policies_on_an_exported_log(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, out, page = tmp_path / "log.jsonl", tmp_path / "estimates.json", tmp_path / "report.html"
    export(served, log, monkeypatch)
    result = replay(log, "--policy", GOOD[0], "--params", orjson.dumps(GOOD[1]).decode(), "--policy", BAD[0],
                    "--params", "{}", "--json", out, "--plot", page)  # fmt: skip
    assert result.exit_code == 0, result.output
    good, bad = orjson.loads(out.read_bytes())
    assert good["policy"] == "otf-linucb" and good["estimator"] == bad["estimator"] == "snips"
    assert good["ci95"][0] > bad["ci95"][1]
    # the same numbers as the library's on the audit log itself
    offered = read_contextual_log(served.lines, None, None)
    assert good["value"] == evaluate_contextual(offered, *GOOD).primary.value
    assert "otf-lints (logged)" in page.read_text()
    ips = replay(log, "--policy", "otf-linucb", "--estimator", "ips", "--json", out)
    assert ips.exit_code == 0 and orjson.loads(out.read_bytes())["estimator"] == "ips"


def test_the_cli_refuses_what_a_contextual_log_cannot_answer(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "log.jsonl"
    export(served, log, monkeypatch)
    arm_policy = replay(log, "--policy", "delayed-ucb")
    assert arm_policy.exit_code == 1 and "is contextual and policy 'delayed-ucb' is not" in said(arm_policy)
    robust = replay(log, "--policy", "linucb", "--estimator", "doubly-robust")
    assert robust.exit_code == 1 and "doubly-robust" in said(robust)
    simulator_only = replay(log, "--policy", "otf-linucb", "--params", '{"correction": "exact"}')
    assert simulator_only.exit_code == 1 and "simulator" in said(simulator_only)
    if served.form == "actions":  # the same campaign without log_actions: its decisions name no offer
        stripped = tmp_path / "stripped.jsonl"
        lines = [orjson.loads(line) for line in log.read_text().splitlines()]
        stripped.write_bytes(
            b"\n".join(orjson.dumps({k: v for k, v in line.items() if k != "actions"}) for line in lines)
        )
        unlogged = replay(stripped, "--policy", "otf-linucb")
        assert unlogged.exit_code == 1 and "set log_actions" in said(unlogged)
