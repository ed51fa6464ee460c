"""PatientBandits and Adapt-PatientBandits (Manegueu et al. 2020): index values against worked values
and formulas written out here with the math module, the grouped tail estimate against a brute-force
likelihood maximisation, and the incremental bias term (service histogram and simulator feed) against a
recomputation over every pull."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize

from latebandit.campaign import Campaign
from latebandit.delays.tail import BUCKETS, bucket_of, lower_edges, tail_exponent, upper_edges
from latebandit.engine.exposure import bucket_moments, exposure
from latebandit.policies import ArmStats, Policy, make_policy
from latebandit.policies.base import SMALL_ARGMAX
from latebandit.sim.environment import Environment
from latebandit.sim.feeds import Ledger
from latebandit.sim.patient import Patient
from latebandit.sim.scenario import scenario_from_mapping
from latebandit.store.base import Pull
from latebandit.store.memory import MemoryStore

T0 = 1_800_000_000_000_000


def one(pulls: list[float], conversions: list[float], t: int = 1000, **extra: object) -> ArmStats:
    return ArmStats(np.array([pulls]), np.array([conversions]), np.array([pulls]), np.array([t]), **extra)


# --- the index -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pulls", "conversions", "alpha", "expected"),
    [(100, 40, 0.3, 1.6152), (100, 40, 0.8, 1.3128), (1000, 400, 0.3, 0.8772)],
)
def test_worked_values_of_the_spec(pulls: int, conversions: int, alpha: float, expected: float) -> None:
    """§2.3: K = 2, T = 3000, L = log(2·2·3000³) = 25.41."""
    policy = make_policy(
        "patient-bandits", {"alpha": alpha, "age_aware": 0, "horizon": 3000, "kappa": 1.0, "multiplicative": 0}, 2
    )
    index = policy.index(one([pulls, pulls], [conversions, conversions]))[0, 0]
    assert index == pytest.approx(expected, abs=1e-4)
    by_hand = conversions / pulls + math.sqrt(2 * math.log(4 * 3000**3) / pulls) + 2 * pulls ** -min(alpha, 0.5)
    assert index == pytest.approx(by_hand, rel=1e-12)


def test_anytime_age_aware_index_and_forced_first_pulls() -> None:
    policy = make_policy("patient-bandits", {"alpha": 0.4, "kappa": 0.5, "multiplicative": 0}, 3)
    stats = one([0, 10, 40], [0, 3, 9], t=51, tail_weight=np.array([[0.0, 4.0, 55.0]]))
    index = policy.index(stats)[0]
    assert index[0] == math.inf
    log_term = math.log(6 * 51**3)
    assert index[1] == pytest.approx(0.3 + math.sqrt(log_term / 10) + 0.4, rel=1e-12)
    assert index[2] == pytest.approx(9 / 40 + math.sqrt(log_term / 40) + 1.0, rel=1e-12)  # W/N capped at 1
    assert policy.choose(stats, np.random.default_rng(0)).arm[0] == 0
    with pytest.raises(ValueError, match="tail weights"):
        policy.index(one([5, 5, 5], [1, 1, 1]))


def test_default_index_divides_by_the_share_the_bias_bound_leaves() -> None:
    """§2.7 e: μ <= (S/N + width)/(1 − B), capped at 1, and 1 while B >= 1; width with κ = 1/4 (Hoeffding)."""
    policy = make_policy("patient-bandits", {"alpha": 0.4}, 3)
    stats = one([100, 1000, 400], [5, 50, 20], t=1501, tail_weight=np.array([[20.0, 1500.0, 10.0]]))
    log_term = math.log(6 * 1501**3)
    index = policy.index(stats)[0]
    assert index[0] == pytest.approx((0.05 + math.sqrt(log_term / 200)) / 0.8, rel=1e-12)
    assert index[1] == 1.0  # W/N >= 1: nothing is known yet
    assert index[2] == pytest.approx(min(1.0, (0.05 + math.sqrt(log_term / 800)) / (1 - 10 / 400)), rel=1e-12)


@st.composite
def service_calls(draw: st.DrawFn) -> tuple[str, dict[str, float], ArmStats, int]:
    """A one-run decision as the service makes it: a patient policy, its params, statistics and batch size,
    the arms sometimes still in their opening, sometimes tied (the same statistics for every arm)."""
    name = draw(st.sampled_from(["patient-bandits", "adapt-patient-bandits"]))
    arms = draw(st.integers(2, 6))
    params = {"kappa": draw(st.floats(1e-3, 4.0)), "horizon": draw(st.sampled_from([0, 0, 10**6])),
              "multiplicative": draw(st.integers(0, 1)),
              "initial_pulls": draw(st.integers(2 if name == "adapt-patient-bandits" else 1, 3))}  # fmt: skip
    pulls = draw(st.lists(st.integers(0, 10**6), min_size=arms, max_size=arms))
    conversions = [draw(st.integers(0, n)) for n in pulls]
    weights = [draw(st.floats(0.0, 2.0 * n + 1.0)) for n in pulls]
    if draw(st.booleans()):
        pulls, conversions, weights = [pulls[0]] * arms, [conversions[0]] * arms, [weights[0]] * arms
    stats = one([float(n) for n in pulls], conversions, t=sum(pulls) + draw(st.integers(1, 100)),
                tail_weight=np.array([weights]))  # fmt: skip
    return name, params, stats, draw(st.integers(1, 12))


def assert_plain_is_the_array_rule(policy: Policy, stats: ArmStats, decisions: int, seed: int) -> None:
    """``choose_together`` decides what ``choose`` of ``successive`` decides: the indices bit for bit where
    ``plain_index`` computes them, the same arms, propensities and probabilities from the same uniforms, the
    generator left where the array rule leaves it."""
    rows = stats.successive(decisions)
    plain = policy.plain_index(stats, decisions)
    if stats.pulls.min() < policy.params()["initial_pulls"] or decisions * policy.n_arms > SMALL_ARGMAX:
        assert plain is None
    else:
        assert plain is not None
        np.testing.assert_array_equal(plain, policy.index(rows))
    together_rng, array_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    together, array = policy.choose_together(stats, decisions, together_rng), policy.choose(rows, array_rng)
    for field in ("arm", "propensity", "probabilities"):
        np.testing.assert_array_equal(getattr(together, field), getattr(array, field))
    assert together_rng.random() == array_rng.random()


@settings(max_examples=300, deadline=None)
@given(call=service_calls(), seed=st.integers(0, 2**32 - 1))
def test_plain_index_is_the_array_rule_draw_for_draw(call: tuple[str, dict[str, float], ArmStats, int],
                                                     seed: int) -> None:  # fmt: skip
    name, params, stats, decisions = call
    assert_plain_is_the_array_rule(make_policy(name, params, stats.pulls.shape[1]), stats, decisions, seed)


@pytest.mark.parametrize("seed", [1, 2])
def test_plain_index_takes_l_from_numpys_log(seed: int) -> None:
    """At t = 102327 glibc's log and NumPy's differ in the last bit, and here that puts arm 1's index on the
    edge of TIE_RTOL: with math.log the plain path tied the arms (propensity 0.5) where the array rule
    chooses arm 0 alone (found in review)."""
    stats = one([105.0, 100_000.0], [10, 0], t=102_327, tail_weight=np.array([[10.5, 99641.80778256322]]))
    assert_plain_is_the_array_rule(make_policy("patient-bandits", {}, 2), stats, 1, seed)


def test_plain_index_leaves_the_paper_bias_and_missing_weights_to_the_array_rule() -> None:
    weighted = one([10.0, 20.0], [1, 2], t=31, tail_weight=np.array([[1.0, 30.0]]))
    assert make_policy("patient-bandits", {"age_aware": 0}, 2).plain_index(weighted, 1) is None
    policy = make_policy("patient-bandits", {"kappa": 1.0, "multiplicative": 0}, 2)
    by_hand = [0.1 + math.sqrt(2 * math.log(4 * 31**3) / 10) + 0.1, 0.1 + math.sqrt(2 * math.log(4 * 31**3) / 20) + 1.0]
    assert policy.plain_index(weighted, 1) == [pytest.approx(by_hand, rel=1e-12)]
    unweighted = one([10.0, 20.0], [1, 2], t=31)
    assert policy.plain_index(unweighted, 1) is None
    with pytest.raises(ValueError, match="tail weights"):
        policy.choose_together(unweighted, 1, np.random.default_rng(0))


def test_band_estimator_read_literally_is_pb_at_alpha_lo() -> None:
    """§2.4 steps 4–6 by hand: α̂ = min(−log(k/n)/log T̄, 1), minus log(24·sqrt(L)/(c·μ_lo))/log T̄."""
    params = {"alpha_lo": 0.1, "c": 0.7, "mu_lo": 0.6, "horizon": 10_000, "age_aware": 0, "estimator": 0}
    policy = make_policy("adapt-patient-bandits", params, 2)
    stats = one([3000, 800], [1500, 300], band=np.array([[1400.0, 9.0]]))
    query = policy.band_query(stats)
    assert (query.arm[0], query.late[0], query.early[0]) == (0, 1500, math.floor((0.35**10) * 1500))
    point, lower = (value[0] for value in policy.estimate_alpha(stats))
    expected = min(-math.log(9 / 1400) / math.log(3000), 1.0)
    assert point == pytest.approx(expected, rel=1e-12)
    correction = math.log(24 * math.sqrt(math.log(4 * 10_000**3)) / (0.7 * 0.6)) / math.log(3000)
    assert lower == pytest.approx(expected - correction, rel=1e-12)
    pb = make_policy("patient-bandits", {"alpha": 0.1, "age_aware": 0, "horizon": 10_000}, 2)
    np.testing.assert_array_equal(policy.index(stats), pb.index(stats))


def test_tail_estimate_adapts_alpha_between_its_floor_and_cap() -> None:
    policy = make_policy("adapt-patient-bandits", {"age_aware": 0, "alpha_lo": 0.1}, 2)
    rng = np.random.default_rng(3)
    counts = np.stack([np.bincount(bucket_of(1 + rng.pareto(a, 50_000)), minlength=BUCKETS) for a in (0.6, 0.4)])
    alpha = policy.alpha(one([10, 10], [1, 1], delay_counts=counts[None]))[0]
    tail = tail_exponent(counts)
    assert alpha == pytest.approx(tail.alpha[1] - 2 * tail.se[1], rel=1e-12)  # the heavier arm's bound
    assert 0.3 < alpha < 0.45
    assert policy.alpha(one([10, 10], [1, 1], delay_counts=np.zeros((1, 2, BUCKETS))))[0] == 0.1


# --- the tail estimate ----------------------------------------------------------------------------------


def test_grouped_estimate_is_the_likelihood_maximum() -> None:
    """Brute force: maximise Σ_j c_j·log P(bucket j | D > u) for a Pareto tail above u, numerically."""
    rng = np.random.default_rng(7)
    counts = np.bincount(bucket_of(5.0 * (1 + rng.pareto(0.7, 4000))), minlength=BUCKETS)
    estimate = tail_exponent(counts)
    edges = np.append(lower_edges(), np.inf)
    start = int(np.flatnonzero(lower_edges() == estimate.threshold)[0])
    u = edges[start]

    def minus_log_likelihood(alpha: float) -> float:
        survival = (edges[start:] / u) ** -alpha
        mass = survival[:-1] - survival[1:]
        return -float(counts[start:] @ np.log(mass))

    best = optimize.minimize_scalar(minus_log_likelihood, bounds=(0.01, 5.0), method="bounded", options={"xatol": 1e-9})
    assert estimate.alpha == pytest.approx(best.x, rel=1e-5)
    assert abs(estimate.alpha - 0.7) < 3 * estimate.se
    assert estimate.observations == counts[start:].sum() >= 0.2 * counts.sum()


def test_bucket_edges() -> None:
    np.testing.assert_array_equal(bucket_of([0, 0.99, 1, 1.41, 1.42, 2, 4, 1e30]), [0, 0, 1, 1, 2, 3, 5, BUCKETS - 1])
    assert tail_exponent(np.zeros(BUCKETS)).observations == 0


# --- the incremental bias term ---------------------------------------------------------------------------


async def test_service_tail_weight_bounds_the_sum_over_every_pull() -> None:
    """engine/exposure.py evaluates each bucket at its youngest edge: equal to that rule applied pull by pull, and an
    upper bound on Σ ψ(age) over the pulls younger than the window (matured buckets weigh 0)."""
    campaign = Campaign(
        id="c", arms=["a", "b"], policy={"name": "patient-bandits", "params": {"alpha": 0.4, "scale": 600}},
        window=86_400, buckets=32, created_at=T0,
    )  # fmt: skip
    store = MemoryStore(clock=lambda: T0)
    await store.create_campaign(campaign, {})
    rng = np.random.default_rng(5)
    times = T0 - rng.integers(0, 2 * 86_400 * 10**6, 400)
    arms = rng.integers(0, 2, 400)
    for k, (at, arm) in enumerate(zip(times.tolist(), arms.tolist(), strict=True)):
        bucket, offset, moments = bucket_moments(campaign, at)
        await store.record_decision(campaign, Pull(arm, bucket, offset, moments, f"d{k}", 1.0, {}), None, 60)
    now = T0 + 123_456_789
    weight = exposure(campaign, await store.snapshot(campaign), now).tail_weight
    width = campaign.bucket_width_us

    def psi(age: float) -> float:
        return 1.0 if age <= 600 else (age / 600) ** -0.4

    edge_rule, exact = np.zeros(2), np.zeros(2)
    for at, arm in zip(times.tolist(), arms.tolist(), strict=True):
        youngest = (now - (at // width + 1) * width) / 1e6
        if youngest < 86_400:
            edge_rule[arm] += psi(youngest)
        if (now - at) / 1e6 < 86_400:
            exact[arm] += psi((now - at) / 1e6)
    np.testing.assert_allclose(weight, edge_rule, rtol=1e-12)
    assert (weight >= exact).all()


@pytest.mark.parametrize("window", [None, 40])
def test_simulator_feed_against_every_pull(window: int | None) -> None:
    """W, the delay buckets and Algorithm 2's band, round by round, against recomputations from the full
    pull history (arms, reveal lags) under the simulator's age convention (age = n − 1 − s)."""
    horizon, runs = 300, 5
    scenario = scenario_from_mapping(
        {"horizon": horizon, "runs": runs, "arms": [0.5, 0.7], "window": window,
         "delay": [{"family": "pareto", "alpha": 0.5, "scale": 1}, {"family": "geometric", "p": 0.1}],
         "policies": [{"name": "ucb1"}]}
    )  # fmt: skip
    env = Environment(scenario)
    pb_feed = Patient(Ledger(runs, 2), env, make_policy("patient-bandits", {"alpha": 0.3, "scale": 2.0}, 2))
    hill_feed = Patient(Ledger(runs, 2), env, make_policy("adapt-patient-bandits", {"age_aware": 0}, 2))
    band_policy = make_policy("adapt-patient-bandits", {"age_aware": 0, "estimator": 0, "c": 1.0, "alpha_lo": 0.5}, 2)
    ledger = Ledger(runs, 2)
    band_feed = Patient(ledger, env, band_policy)
    rng = np.random.default_rng(1)
    history_arms, history_lags = [], []
    for n in range(1, horizon + 1):
        t = np.full(runs, n)
        ages = n - 1 - np.arange(1, n)  # of rounds 1..n−1
        arms = np.array(history_arms).reshape(-1, runs)
        lags = np.array(history_lags).reshape(-1, runs)
        psi = np.where(ages <= 2.0, 1.0, (np.maximum(ages, 1) / 2.0) ** -0.3)
        if window is not None:
            psi = np.where(ages < window, psi, 0.0)
        expected_weight = np.stack([((arms == k) * psi[:, None]).sum(axis=0) for k in range(2)], axis=1)
        np.testing.assert_allclose(pb_feed.stats(t).tail_weight, expected_weight, rtol=1e-9, atol=1e-9)
        seen = (lags >= 0) & (lags <= ages[:, None])
        buckets = np.zeros((runs, 2, BUCKETS))
        for s, r in zip(*np.nonzero(seen), strict=True):
            buckets[r, arms[s, r], bucket_of(lags[s, r])] += 1
        hill = hill_feed.stats(t)
        np.testing.assert_array_equal(hill.delay_counts, buckets)
        needed = np.ceil(np.minimum(upper_edges(), horizon + 1.0)) - 1  # whole-round lags: age >= ⌈edge⌉ − 1
        exposure = [[[((ages >= a) & (arms[:, r] == k)).sum() for a in needed] for k in range(2)] for r in range(runs)]
        np.testing.assert_array_equal(hill.delay_exposure, exposure)
        stats = band_feed.stats(t)
        query = band_policy.band_query(stats)
        for r in range(runs):
            old = (ages >= query.late[r]) & (arms[:, r] == query.arm[r]) if n > 1 else np.zeros(0, bool)
            inside = old & (lags[:, r] > query.early[r]) & (lags[:, r] <= query.late[r])
            assert tuple(stats.band[r]) == (old.sum(), inside.sum())
        chosen = rng.integers(0, 2, runs)
        pull = env.pull(chosen)
        ledger.pulls[np.arange(runs), chosen] += 1
        for feed in (pb_feed, hill_feed, band_feed):
            feed.record(pull)
        env.end_round()
        history_arms.append(chosen)
        history_lags.append(pull.lags)


def test_exposure_weighting_removes_the_bias_of_unobserved_long_delays() -> None:
    """Pulls spread over 10⁴ rounds, Pareto(0.3) delays seen only once the pull is old enough (the situation of
    Fig. 6): the raw fit overshoots α, the exposure-weighted, truncated fit recovers it."""
    rng = np.random.default_rng(11)
    horizon, pulls = 10_000, 40_000
    ages = rng.integers(0, horizon, pulls)
    delays = np.ceil(1 + rng.pareto(0.3, pulls))
    counts = np.bincount(bucket_of(delays[delays <= ages]), minlength=BUCKETS)
    needed = np.ceil(np.minimum(upper_edges(), horizon + 1.0)) - 1
    exposure = (ages[None, :] >= needed[:, None]).sum(axis=1)
    raw, weighted = tail_exponent(counts), tail_exponent(counts, exposure)
    assert raw.alpha > 0.3 + 5 * raw.se
    assert abs(weighted.alpha - 0.3) < 3 * weighted.se + 0.02


async def test_service_delay_exposure_counts_pulls_old_enough_for_each_bucket() -> None:
    campaign = Campaign(id="c", arms=["a", "b"], policy={"name": "adapt-patient-bandits"}, window=3600, created_at=T0)
    store = MemoryStore(clock=lambda: T0)
    await store.create_campaign(campaign, {})
    rng = np.random.default_rng(2)
    times = T0 - rng.integers(0, 2 * 3600 * 10**6, 300)
    arms = rng.integers(0, 2, 300)
    for k, (at, arm) in enumerate(zip(times.tolist(), arms.tolist(), strict=True)):
        bucket, offset, moments = bucket_moments(campaign, at)
        await store.record_decision(campaign, Pull(arm, bucket, offset, moments, f"d{k}", 1.0, {}), None, 60)
    state = await store.snapshot(campaign)
    seen = exposure(campaign, state, T0)
    folded = seen.matured_cells
    await store.fold_matured(campaign, state.histogram.arm[folded], state.histogram.bucket[folded])
    after = exposure(campaign, await store.snapshot(campaign), T0)
    width = campaign.bucket_width_us
    for k in range(2):
        youngest = (T0 - (times[arms == k] // width + 1) * width) / 1e6  # every pull counts from its cell's edge
        for j, edge in enumerate(upper_edges()):
            assert seen.delay_exposure[k, j] == (youngest >= edge).sum()
            # once folded, a matured pull's age is only known to exceed the window
            inside = ((youngest >= edge) & (youngest < 3600)).sum()
            assert after.delay_exposure[k, j] == inside + ((youngest >= 3600) & (edge <= 3600)).sum()
