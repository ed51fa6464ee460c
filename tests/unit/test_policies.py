"""The policies against a deliberately slow reference written here from the specs (plain Python loops,
the math module, bisection), plus tie-breaking, forced exploration, batch/one-run agreement, purity and
a Monte Carlo coverage check of the Vernade 2017 indices (Vernade et al. 2017)."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from scipy import integrate, stats

from latebandit.delays.tail import BUCKETS
from latebandit.policies import POLICIES, ArmStats, Policy, SchedulePolicy, make_policy
from latebandit.policies import base as policies_base
from latebandit.policies.base import SMALL_ARGMAX, ArgmaxPolicy, Choice

INDEX_POLICIES = ["ucb1", "klucb", "delayed-ucb", "delayed-klucb"]
DELAYED = {"delayed-ucb", "delayed-klucb"}
EPS_N = 1e-9

# --- the slow reference -------------------------------------------------------------------------------


def ref_beta(t: int, epsilon: float) -> float:
    return max(0.0, (1.0 + epsilon) * math.log(t))


def ref_xlogx_over(x: float, y: float) -> float:
    return 0.0 if x == 0 else x * math.log(x / y)


def ref_poisson(p: float, q: float) -> float:
    return ref_xlogx_over(p, q) + q - p


def ref_bernoulli(p: float, q: float) -> float:
    if q >= 1.0:
        return 0.0 if p >= 1.0 else math.inf
    return ref_xlogx_over(p, q) + ref_xlogx_over(1.0 - p, 1.0 - q)


def ref_upper(divergence: Callable[[float, float], float], p: float, c: float) -> float:
    """The largest q in [p, 1] with divergence(p, q) <= c, by plain bisection (no closed forms).
    c <= 0 is answered exactly: bisection cannot resolve a divergence that rounds to 0 near q = p."""
    if c <= 0:
        return min(p, 1.0)
    if p >= 1.0 or divergence(p, 1.0) <= c:
        return 1.0
    lo, hi = p, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if divergence(p, mid) <= c:
            lo = mid
        else:
            hi = mid
    return lo


def ref_index(name: str, pulls: float, conversions: float, effective: float, t: int, epsilon: float) -> float:
    beta = ref_beta(t, epsilon)
    count = effective if name in DELAYED else pulls
    if pulls == 0 or count <= EPS_N:
        return math.inf
    p = conversions / count
    if name == "ucb1":
        return p + math.sqrt(2.0 * beta / pulls)
    if name == "klucb":
        return ref_upper(ref_bernoulli, p, beta / pulls)
    if name == "delayed-ucb":
        return p + math.sqrt(pulls * beta / 2.0) / effective
    return ref_upper(ref_poisson, p, beta / effective)


def ref_candidates(indices: list[float], pulls: list[float], t: int) -> list[int]:
    """The arms the choice may take at round t: with arms of infinite index, the first least-pulled one
    counting from arm (t − 1) mod K round the circle (Algorithm 1 plays arm n at round n); else every
    maximum within the tie tolerance."""
    forced = [k for k, u in enumerate(indices) if u == math.inf]
    if forced:
        least = min(pulls[k] for k in forced)
        arms = len(indices)
        circle = [(t - 1 + step) % arms for step in range(arms)]
        return [next(k for k in circle if k in forced and pulls[k] == least)]
    top = max(indices)
    return [k for k, u in enumerate(indices) if u >= top - 1e-12 * abs(top)]


def random_stats(rng: np.random.Generator, runs: int, arms: int) -> ArmStats:
    """Mixed regimes: unpulled arms, Ñ = 0 or just below EPS_N with N > 0, θ̂ > 1, exact ties, t = 1."""
    pulls = rng.integers(0, 40, (runs, arms)) * (rng.random((runs, arms)) > 0.1)
    conversions = rng.binomial(pulls, rng.uniform(0.0, 0.6, (runs, arms)))
    effective = pulls * rng.uniform(0.0, 1.0, (runs, arms))
    effective[rng.random((runs, arms)) < 0.05] = 0.0
    effective[rng.random((runs, arms)) < 0.05] = 5e-10
    tied = rng.random(runs) < 0.2
    for column in (pulls, conversions, effective):
        column[tied, 1] = column[tied, 0]
    t = pulls.sum(axis=1) + 1 + rng.integers(0, 1000, runs)
    t[rng.random(runs) < 0.05] = 1
    tail_weight = pulls * rng.uniform(0.0, 1.0, (runs, arms))  # Manegueu 2020: W <= N
    delay_counts = rng.poisson(
        rng.uniform(0.0, 5.0, (runs, arms, 1)) / (1.0 + np.arange(BUCKETS)), (runs, arms, BUCKETS)
    )
    pending = np.floor((pulls - conversions) * rng.uniform(0.0, 1.0, (runs, arms)))
    pending[tied, 1] = pending[tied, 0]
    return ArmStats(
        pulls.astype(np.float64), conversions.astype(np.float64), effective, t,
        pending=pending, tail_weight=tail_weight, delay_counts=delay_counts,
    )  # fmt: skip


def row(stats: ArmStats, r: int) -> ArmStats:
    one = slice(r, r + 1)
    return ArmStats(
        stats.pulls[one], stats.conversions[one], stats.effective[one], stats.t[one],
        pending=None if stats.pending is None else stats.pending[one],
        tail_weight=None if stats.tail_weight is None else stats.tail_weight[one],
        delay_counts=None if stats.delay_counts is None else stats.delay_counts[one],
    )  # fmt: skip


def tile(stats: ArmStats, runs: int) -> ArmStats:
    """``runs`` copies of a one-run batch."""
    return ArmStats(*(np.repeat(a, runs, axis=0) for a in (stats.pulls, stats.conversions, stats.effective, stats.t)))


def one_run(pulls: list[float], conversions: list[float], effective: list[float], t: int) -> ArmStats:
    return ArmStats(
        np.array([pulls], float), np.array([conversions], float), np.array([effective], float), np.array([t])
    )


# --- agreement with the reference ---------------------------------------------------------------------


@pytest.mark.parametrize("name", INDEX_POLICIES)
@pytest.mark.parametrize("epsilon", [0.0, 0.3])
def test_index_and_estimate_match_reference(name: str, epsilon: float) -> None:
    data = random_stats(np.random.default_rng(1), 300, 4)
    policy = make_policy(name, {"epsilon": epsilon}, 4)
    expected_index = np.empty(data.pulls.shape)
    expected_estimate = np.full(data.pulls.shape, np.nan)
    for r in range(data.pulls.shape[0]):
        for k in range(4):
            n, s, ne, t = data.pulls[r, k], data.conversions[r, k], data.effective[r, k], int(data.t[r])
            expected_index[r, k] = ref_index(name, n, s, ne, t, epsilon)
            count = ne if name in DELAYED else n
            if count > EPS_N:
                expected_estimate[r, k] = s / count
    np.testing.assert_allclose(policy.index(data), expected_index, rtol=1e-9, atol=0)
    np.testing.assert_allclose(policy.estimate(data), expected_estimate, rtol=1e-15, atol=0, equal_nan=True)
    np.testing.assert_array_equal(policy.effective_pulls(data), data.effective if name in DELAYED else data.pulls)


@pytest.mark.parametrize("name", INDEX_POLICIES)
def test_choice_matches_reference_tie_rule(name: str) -> None:
    data = random_stats(np.random.default_rng(2), 400, 4)
    policy = make_policy(name, {}, 4)
    choice = policy.choose(data, np.random.default_rng(3))
    assert choice.arm.dtype == np.int64
    for r in range(400):
        n, s, ne, t = data.pulls[r], data.conversions[r], data.effective[r], int(data.t[r])
        indices = [ref_index(name, n[k], s[k], ne[k], t, 0.0) for k in range(4)]
        candidates = ref_candidates(indices, list(data.pulls[r]), t)
        assert choice.arm[r] in candidates
        assert choice.propensity[r] == pytest.approx(1.0 / len(candidates), rel=1e-15)


def test_reference_values_from_peer_implementations() -> None:
    """SMPyBandits UCB and klUCB on t = 100, pulls (10, 30, 60), rewards (4, 15, 33)."""
    data = one_run([10, 30, 60], [4, 15, 33], [10, 30, 60], 100)
    ucb = make_policy("ucb1", {}, 3).index(data)[0]
    np.testing.assert_allclose(ucb, [1.359705, 1.054086, 0.941798], atol=5e-7)
    kl = make_policy("klucb", {}, 3).index(data)[0]
    np.testing.assert_allclose(kl, [0.828623, 0.757079, 0.732816], atol=5e-7)


def test_banditlab_delayed_ucb_values() -> None:
    """banditlab's VernadeDelayedUCB values for a fixed set of stats (β = log 101)."""
    data = one_run([13, 6], [5, 3], [11.6580, 4.7613], 101)
    ours = make_policy("delayed-ucb", {}, 2).index(data)[0]
    np.testing.assert_allclose(ours, [0.898703, 1.411575], atol=5e-5)  # Ñ is printed to 4 decimals


# --- guards, caps, tie-breaking, forced exploration --------------------------------------------------


def test_guards_and_caps() -> None:
    data = one_run([0, 4, 4, 3, 5], [0, 1, 1, 3, 2], [0, 0, 5e-10, 2e-9, 1.2], 50)
    for name in DELAYED:
        policy = make_policy(name, {}, 5)
        index, estimate = policy.index(data)[0], policy.estimate(data)[0]
        assert np.isposinf(index[:3]).all()  # N = 0, Ñ = 0, Ñ below EPS_N
        assert np.isnan(estimate[:3]).all()
        assert estimate[3] == pytest.approx(1.5e9)  # θ̂ is not capped
        assert np.isfinite(index[3:]).all()
    assert make_policy("delayed-klucb", {}, 5).index(data)[0][3:].max() == 1.0  # the KL index is
    assert make_policy("delayed-ucb", {}, 5).index(data)[0][4] > 1.0  # the UCB one is not
    at_start = one_run([3, 3], [1, 2], [2.0, 2.5], 1)  # β = 0: the estimate itself, capped for KL
    assert list(make_policy("delayed-klucb", {}, 2).index(at_start)[0]) == [0.5, 0.8]
    assert list(make_policy("delayed-ucb", {}, 2).index(at_start)[0]) == [0.5, 0.8]


@pytest.mark.parametrize("name", [*INDEX_POLICIES, "uniform"])
def test_ties_are_broken_uniformly(name: str) -> None:
    single = one_run([20, 20, 20, 20], [9, 1, 9, 9], [20, 20, 20, 20], 81)
    runs = 6000
    data = tile(single, runs)
    choice = make_policy(name, {}, 4).choose(data, np.random.default_rng(4))
    tied = [0, 1, 2, 3] if name == "uniform" else [0, 2, 3]
    counts = Counter(choice.arm.tolist())
    assert set(counts) == set(tied)
    assert stats.chisquare([counts[k] for k in tied]).pvalue > 1e-4
    np.testing.assert_array_equal(choice.propensity, 1.0 / len(tied))


@pytest.mark.parametrize("name", INDEX_POLICIES)
def test_forced_exploration_goes_to_least_pulled_infinite_arm(name: str) -> None:
    policy = make_policy(name, {}, 4)
    rng = np.random.default_rng(5)
    # arm 3 has the best finite index, but arms with +inf come first, the least pulled of them
    if name in DELAYED:
        data = one_run([3, 1, 2, 10], [0, 0, 0, 9], [0, 0, 0, 9.5], 20)
        expected = 1
    else:
        data = one_run([0, 5, 0, 10], [0, 0, 0, 9], [0, 5, 0, 10], 20)
        expected = None
    arms = {int(policy.choose(data, rng).arm[0]) for _ in range(50)}
    # two least-pulled arms, 0 and 2: from arm (20 − 1) mod 4 = 3 round the circle, 0 comes first
    assert arms == ({1} if expected is not None else {0})
    assert policy.choose(data, rng).propensity[0] == 1.0
    if expected is None:  # from arm (22 − 1) mod 4 = 1, arm 2 comes first
        assert int(policy.choose(one_run([0, 5, 0, 10], [0, 0, 0, 9], [0, 5, 0, 10], 22), rng).arm[0]) == 2


@pytest.mark.parametrize("name", INDEX_POLICIES)
def test_the_rows_of_one_group_commit_open_different_arms(name: str) -> None:
    """Rounds t, t+1, ... decided from the same statistics take the opening's arms in turn."""
    policy = make_policy(name, {}, 4)
    fresh = one_run([0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], 1)
    np.testing.assert_array_equal(policy.choose_together(fresh, 6, np.random.default_rng(0)).arm, [0, 1, 2, 3, 0, 1])


@pytest.mark.parametrize("name", INDEX_POLICIES)
def test_first_rounds_play_arm_n_at_round_n(name: str) -> None:
    """Algorithm 1 of Vernade et al. 2017: for n <= K, A_n = arm n, a deterministic choice."""
    arms, policy, rng = 5, make_policy(name, {}, 5), np.random.default_rng(6)
    pulls = np.zeros((1, arms))
    chosen, propensities = [], []
    for t in range(1, arms + 1):
        choice = policy.choose(ArmStats(pulls, np.zeros((1, arms)), 0.7 * pulls, np.array([t])), rng)
        chosen.append(int(choice.arm[0]))
        propensities.append(choice.propensity[0])
        pulls[0, choice.arm[0]] += 1
    assert chosen == list(range(arms))
    assert propensities == [1.0] * arms


def test_fixed_and_uniform() -> None:
    data = random_stats(np.random.default_rng(7), 50, 3)
    fixed = make_policy("fixed", {"arm": 2}, 3).choose(data, np.random.default_rng(0))
    assert fixed.arm.tolist() == [2] * 50 and fixed.propensity.tolist() == [1.0] * 50
    uniform = make_policy("uniform", {}, 3).choose(data, np.random.default_rng(0))
    np.testing.assert_array_equal(uniform.propensity, 1 / 3)
    for name in ("fixed", "uniform", "thompson"):
        policy = make_policy(name, {"arm": 0} if name == "fixed" else {}, 3)
        assert np.isnan(policy.index(data)).all()
        np.testing.assert_array_equal(policy.effective_pulls(data), data.pulls)


# --- Thompson sampling -----------------------------------------------------------------------------


def exact_win_probability(a: tuple[float, float], b: tuple[float, float]) -> float:
    """P(X > Y) for X ~ Beta(*a), Y ~ Beta(*b), by quadrature."""
    value, _ = integrate.quad(lambda x: stats.beta.pdf(x, *a) * stats.beta.cdf(x, *b), 0.0, 1.0)
    return value


def test_thompson_choice_frequency_and_propensity() -> None:
    """Posteriors Beta(1 + S, 1 + N − S) of (N, S) = (10, 3) and (10, 5): the arm is drawn with the exact
    win probability, and the propensity logged is that probability."""
    win = exact_win_probability((6, 6), (4, 8))  # arm 1 beats arm 0
    runs = 4000
    data = tile(one_run([10, 10], [3, 5], [10, 10], 21), runs)
    policy = make_policy("thompson", {}, 2)
    choice = policy.choose(data, np.random.default_rng(8))
    assert (choice.arm == 1).mean() == pytest.approx(win, abs=4 * math.sqrt(win * (1 - win) / runs))
    np.testing.assert_allclose(choice.propensity, np.where(choice.arm == 1, win, 1 - win), atol=1e-9)


def test_thompson_propensity_is_a_function_of_the_posterior_and_draws_nothing() -> None:
    """Two generators, the same posterior: the same probabilities; the generator is left where drawing the
    arm alone (``choose_arms``) leaves it. Beyond 10 arms too, where they are a Monte Carlo estimate."""
    for arms in (3, 12):
        data = random_stats(np.random.default_rng(30), 5, arms)
        policy = make_policy("thompson", {"propensity_samples": 50}, arms)
        first, second = policy.choose(data, np.random.default_rng(1)), policy.choose(data, np.random.default_rng(2))
        assert first.probabilities is not None and second.probabilities is not None
        np.testing.assert_array_equal(first.probabilities, second.probabilities)
        np.testing.assert_allclose(first.probabilities.sum(axis=1), 1.0)
        rng, alone = np.random.default_rng(3), np.random.default_rng(3)
        np.testing.assert_array_equal(policy.choose(data, rng).arm, policy.choose_arms(data, alone))
        assert rng.random() == alone.random()


def test_thompson_propensity_is_never_zero() -> None:
    """Beyond 10 arms the estimate is (hits + 1/K)/(M + 1): an arm no draw favoured still has 1/(K(M + 1))."""
    pulls = [1000] * 12
    data = one_run(pulls, [900] + [10] * 11, pulls, 12001)
    choice = make_policy("thompson", {"propensity_samples": 1}, 12).choose(data, np.random.default_rng(9))
    assert choice.probabilities is not None
    assert choice.arm[0] == 0 and (choice.probabilities > 0).all()
    np.testing.assert_allclose(choice.probabilities[0, 1:], 1 / 24)
    assert make_policy("thompson", {}, 2).params() == {"propensity_samples": 1000}


# --- batches, purity ----------------------------------------------------------------------------------


def all_policies(arms: int) -> list[Policy]:
    """Every policy that decides from per-arm statistics (the planning ones are tested on their plans)."""
    chosen = [name for name, cls in POLICIES.items() if not issubclass(cls, SchedulePolicy)]
    return [make_policy(name, {"arm": 1} if name == "fixed" else {}, arms) for name in chosen]


@pytest.mark.parametrize("policy", all_policies(4), ids=lambda policy: policy.name)
def test_batch_equals_one_run_calls(policy: Policy) -> None:
    data = random_stats(np.random.default_rng(10), 60, 4)
    singles = [row(data, r) for r in range(60)]
    for method in (policy.index, policy.estimate, policy.effective_pulls):
        np.testing.assert_array_equal(method(data), np.concatenate([method(single) for single in singles]))
    batch = policy.choose(data, np.random.default_rng(11))
    rng = np.random.default_rng(11)
    one_by_one = [policy.choose(single, rng) for single in singles]
    np.testing.assert_array_equal(batch.arm, [choice.arm[0] for choice in one_by_one])
    np.testing.assert_array_equal(batch.propensity, [choice.propensity[0] for choice in one_by_one])


def rows_of(stats: ArmStats, first: int, count: int) -> ArmStats:
    """Rows ``first`` .. ``first + count - 1`` as a batch of ``count`` runs."""
    return ArmStats(
        **{key: None if value is None else value[first : first + count] for key, value in vars(stats).items()}
    )


@pytest.mark.parametrize("policy", [p for p in all_policies(4) if isinstance(p, ArgmaxPolicy)], ids=lambda p: p.name)
def test_small_batches_argmax_is_the_array_rule_draw_for_draw(policy: Policy, monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to SMALL_ARGMAX indices, ArgmaxPolicy.choose takes a plain-Python argmax: the same arms, propensities
    and probabilities as the NumPy rule of a large batch, from the same uniforms, leaving the generator where
    that batch leaves it (runs of 1, 2 and 3 rows, ties and openings among them)."""
    taken: list[int] = []
    plain = policies_base.plain_argmax

    def counted(rows: list[list[float]], rng: np.random.Generator) -> Choice | None:
        choice = plain(rows, rng)
        if choice is not None:
            taken.append(len(rows))
        return choice

    monkeypatch.setattr(policies_base, "plain_argmax", counted)
    counts = [1, 2, 3] * 34
    data = random_stats(np.random.default_rng(12), sum(counts), 4)
    assert data.pulls.size > SMALL_ARGMAX
    large_rng, small_rng = np.random.default_rng(13), np.random.default_rng(13)
    large = policy.choose(data, large_rng)
    firsts = itertools.accumulate(counts[:-1], initial=0)
    small = [policy.choose(rows_of(data, first, count), small_rng) for first, count in zip(firsts, counts, strict=True)]
    for name in ("arm", "propensity", "probabilities"):
        np.testing.assert_array_equal(getattr(large, name), np.concatenate([getattr(one, name) for one in small]))
    assert small_rng.random() == large_rng.random()
    assert set(taken) == {1, 2, 3}  # the plain-Python path decided runs of every size (the others: an opening)


@pytest.mark.parametrize("policy", all_policies(3), ids=lambda policy: policy.name)
def test_purity(policy: Policy) -> None:
    data = random_stats(np.random.default_rng(12), 20, 3)
    copies = [a.copy() for a in (data.pulls, data.conversions, data.effective, data.t)]
    np.random.seed(0)
    random.seed(0)
    numpy_state, python_state = np.random.get_state(), random.getstate()
    first = policy.choose(data, np.random.default_rng(13))
    second = policy.choose(data, np.random.default_rng(13))
    np.testing.assert_array_equal(first.arm, second.arm)
    np.testing.assert_array_equal(first.propensity, second.propensity)
    after = np.random.get_state()
    assert all(np.array_equal(x, y) for x, y in zip(numpy_state, after, strict=True))
    assert random.getstate() == python_state
    for before, now in zip(copies, (data.pulls, data.conversions, data.effective, data.t), strict=True):
        np.testing.assert_array_equal(before, now)


# --- parameters and registry ----------------------------------------------------------------------------


def test_registry_matches_contract_names() -> None:
    attributed = {"uniform", "fixed", "ucb1", "klucb", "thompson", "delayed-ucb", "delayed-klucb", "qpm-d"}
    attributed |= {"patient-bandits", "adapt-patient-bandits", "delayed-thompson", "guha-bayes"}
    anonymous = {"odaaf", "odaaf-b", "odaaf-v", "ars-ucb", "ars-exp3", "clw"}
    assert set(POLICIES) == attributed | anonymous
    bayesian = {"delayed-thompson", "guha-bayes"}
    assert {name for name, cls in POLICIES.items() if cls.delay_corrected} == DELAYED | bayesian
    assert {name for name, cls in POLICIES.items() if cls.feedback == "attributed"} == attributed
    assert all(cls.name == name for name, cls in POLICIES.items())


def test_resolved_params() -> None:
    assert make_policy("delayed-klucb", {}, 2).params() == {"epsilon": 0.0}
    assert make_policy("ucb1", {"epsilon": 1}, 2).params() == {"epsilon": 1.0}
    assert make_policy("fixed", {"arm": 1}, 2).params() == {"arm": 1}
    assert make_policy("uniform", {}, 2).params() == {}


@pytest.mark.parametrize(
    ("name", "params", "n_arms", "mentions"),
    [
        ("nope", {}, 3, "unknown policy"),
        ("ucb1", {"alpha": 2}, 3, "alpha"),
        ("delayed-klucb", {"epsilon": -0.1}, 3, "epsilon"),
        ("delayed-ucb", {"epsilon": math.nan}, 3, "epsilon"),
        ("klucb", {"epsilon": math.inf}, 3, "epsilon"),
        ("klucb", {"epsilon": "0.1"}, 3, "epsilon"),
        ("klucb", {"epsilon": True}, 3, "epsilon"),
        ("fixed", {}, 3, "arm"),
        ("fixed", {"arm": 3}, 3, "arm"),
        ("fixed", {"arm": -1}, 3, "arm"),
        ("fixed", {"arm": 1.0}, 3, "arm"),
        ("thompson", {"propensity_samples": 0}, 3, "propensity_samples"),
        ("thompson", {"propensity_samples": 10**400}, 3, "propensity_samples"),
        ("uniform", {}, 0, "arm"),
        ("uniform", {1: 2}, 3, "params"),
    ],
)
def test_bad_params_are_value_errors_naming_them(name: str, params: dict, n_arms: int, mentions: str) -> None:
    with pytest.raises(ValueError, match=mentions):
        make_policy(name, params, n_arms)


def test_arm_stats_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="shape"):
        ArmStats(np.zeros((2, 3)), np.zeros((2, 2)), np.zeros((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="per run"):
        ArmStats(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)), np.ones(3))


# --- coverage ------------------------------------------------------------------------------------


def violation_rate(name: str, theta: float, weights: np.ndarray, t: int, reps: int, rng: np.random.Generator) -> float:
    """P(U < θ) over a fixed schedule of pulls whose conversions are revealed with probabilities τ_i."""
    conversions = (rng.random((reps, weights.size)) < theta * weights).sum(axis=1, dtype=np.float64)
    schedule = tile(one_run([weights.size], [0], [weights.sum()], t), reps)
    data = ArmStats(schedule.pulls, conversions[:, None], schedule.effective, schedule.t)
    return float((make_policy(name, {}, 1).index(data)[:, 0] < theta).mean())


@pytest.mark.parametrize("name", sorted(DELAYED))
@pytest.mark.parametrize("theta", [0.05, 0.3])
def test_coverage(name: str, theta: float) -> None:
    """P(U < θ) <= e·⌈β·log t⌉·e^{−β} (Prop. 6, Thm 14). For a fixed schedule the tighter e^{−β}
    (Hoeffding, Lemma 7) holds too, and is what makes the check bite at moderate t. Delay-naive KL-UCB,
    whose S/N counts pending pulls as failures, fails the same check on the same data."""
    rng, reps = np.random.default_rng(14), 20_000
    weights = np.linspace(0.05, 1.0, 400)  # pulls of all ages, many still unrevealed
    for t in (20, 10_000):
        beta = math.log(t)
        bound = min(1.0, math.e * math.ceil(beta * math.log(t)) * math.exp(-beta), math.exp(-beta))
        slack = 4 * math.sqrt(bound / reps)
        assert violation_rate(name, theta, weights, t, reps, rng) <= bound + slack
        assert violation_rate("klucb", theta, weights, t, reps, rng) > bound + slack


# --- decisions taken together (the service's group commit) ---------------------------------------------


@pytest.mark.parametrize("policy", all_policies(4), ids=lambda policy: policy.name)
def test_decisions_together_are_successive_rounds(policy: Policy) -> None:
    """Row i of a group decides round t + i from the same statistics; a policy without shared work
    decides exactly as ``choose`` on those rows, draw for draw."""
    single = row(random_stats(np.random.default_rng(12), 1, 4), 0)
    rows = single.successive(5)
    assert rows.t.tolist() == [single.t[0] + i for i in range(5)]
    np.testing.assert_array_equal(rows.pulls, np.repeat(single.pulls, 5, axis=0))
    together = policy.choose_together(single, 5, np.random.default_rng(13))
    assert together.arm.shape == together.propensity.shape == (5,)
    alone = policy.choose(rows, np.random.default_rng(13))
    np.testing.assert_array_equal(together.arm, alone.arm)
    np.testing.assert_array_equal(together.propensity, alone.propensity)


def test_thompson_together_draws_each_arm_and_shares_the_propensities() -> None:
    """A group's rows draw their arms one by one, as ``choose`` on the repeated rows, and share the one
    posterior's exact probabilities."""
    policy = make_policy("thompson", {}, 2)
    single = one_run([10, 10], [3, 5], [10, 10], 21)
    together = policy.choose_together(single, 8, np.random.default_rng(14))
    alone = policy.choose(single.successive(8), np.random.default_rng(14))
    np.testing.assert_array_equal(together.arm, alone.arm)
    assert together.probabilities is not None
    np.testing.assert_allclose(together.probabilities, np.repeat(policy.standing(single), 8, axis=0))
