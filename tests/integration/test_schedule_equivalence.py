"""The service and the simulator make the same decisions on the same event sequence.

A planning policy is simulated for one run; then the service (the real engine on the embedded store) gets
one decision per simulated round and, before the next decision, that round's observation as an anonymous
aggregate. With an allowed lateness of 0 every segment's feedback is complete when the segment ends, as
the simulator assumes, so the service must choose exactly the simulated arms, round after round.
"""

from __future__ import annotations

import pytest

from latebandit.campaign import CampaignSpec
from latebandit.engine.core import DecisionEngine, EngineOptions
from latebandit.sim.environment import Environment, policy_generator
from latebandit.sim.runner import make_policy_for
from latebandit.sim.scenario import scenario_from_mapping
from latebandit.sim.segments import ScheduleDriver
from latebandit.store.memory import MemoryStore
from latebandit.timeutil import format_time
from latebandit.tokens import TokenSigner

HORIZON = 2500
T0 = 1_800_000_000_000_000
SECOND = 1_000_000
MEANS = (0.3, 0.7, 0.5)


def simulate(
    name: str, params: dict, feedback: str, means: tuple[float, ...] = MEANS, rounds: int = HORIZON
) -> tuple[list[int], list[float], dict]:
    scenario = scenario_from_mapping({
        "horizon": rounds, "runs": 1, "seed": 11, "arms": list(means), "feedback": feedback,
        **({"spread": 3} if feedback == "composite" else {}),
        "delay": {"family": "empirical", "quantiles": [[0, 0.25], [1, 0.5], [2, 0.75], [3, 1.0]]},
        "policies": [{"name": name, "params": params}],
    })  # fmt: skip
    policy = make_policy_for(scenario, scenario.policies[0])
    env = Environment(scenario)
    driver = ScheduleDriver(policy, 1, policy_generator(scenario.seed))
    arms, observations = [], []
    for _ in range(rounds):
        arm = driver.arms().copy()
        env.pull(arm)
        observed = env.end_round().sum(axis=1)
        driver.observe(observed)
        arms.append(int(arm[0]))
        observations.append(float(observed[0]))
    return arms, observations, policy.params()


@pytest.mark.parametrize(
    ("name", "params", "feedback"),
    [
        ("odaaf", {"horizon": 100_000}, "anonymous"),
        ("odaaf-b", {"horizon": 100_000}, "anonymous"),
        ("ars-ucb", {}, "composite"),
        ("ars-exp3", {}, "composite"),
        ("clw", {"max_delay": 4}, "anonymous"),
    ],
)
async def test_the_service_chooses_the_simulated_arms(name: str, params: dict, feedback: str) -> None:
    await serve_and_compare(name, params, feedback, MEANS, HORIZON)


async def test_the_service_plans_odaafs_variance_aware_phases_as_simulated() -> None:
    """Rates below 1/4 from phase 3 on: the variance-aware phase lengths come out of the stored state
    the same in the service as in the simulator (and differ from the paper's width's)."""
    means, rounds = (0.03, 0.07, 0.05), 7000  # phase 3 starts at round 4,293
    await serve_and_compare("odaaf", {"horizon": 100_000}, "anonymous", means, rounds)
    paper = simulate("odaaf", {"horizon": 100_000, "adaptive_width": 0}, "anonymous", means, rounds)[0]
    assert simulate("odaaf", {"horizon": 100_000}, "anonymous", means, rounds)[0] != paper


async def serve_and_compare(name: str, params: dict, feedback: str, means: tuple[float, ...], rounds: int) -> None:
    """The service, fed the simulated run's observations round by round, chooses the simulated arms."""
    arms, observations, resolved = simulate(name, params, feedback, means, rounds)
    now = [T0]
    store = MemoryStore(clock=lambda: now[0])
    engine = DecisionEngine(store, TokenSigner("equivalence"), lambda: now[0], policy_generator(11), EngineOptions())
    spec = CampaignSpec(id="same", arms=["a", "b", "c"], policy={"name": name, "params": resolved}, allowed_lateness=0)
    await engine.create_campaign(spec)
    chosen = []
    for observed in observations:
        now[0] += SECOND
        decision = await engine.choose("same")
        chosen.append(["a", "b", "c"].index(decision.arm))
        during = format_time(now[0] + SECOND // 2)  # inside the slot just decided
        event = {"type": "aggregate", "campaign": "same", "start": during, "end": during, "value": observed}
        now[0] += SECOND // 2
        result = await engine.feedback([event])
        now[0] -= SECOND // 2
        assert result.accepted == 1, result.body()
    assert chosen == arms
    assert len(set(arms)) > 1  # the test means something: the policy moved between arms
    state = await engine.state("same")
    assert state["policy_state"]["plan_version"] > 1
    assert state["decisions"] == rounds
    credited = sum(row["conversions"] for row in state["arms"].values())  # bridges and CLW heads are discarded
    assert credited == pytest.approx(sum(observations)) if name in ("odaaf", "ars-ucb", "ars-exp3") else credited > 0
