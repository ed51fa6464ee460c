"""The delayed linear bandit policies (Vernade et al. 2020) against the spec's hand-computed oracle, against a
slow reference written here from the spec (plain Python loops per run over the decision history, one
linear solve per norm: nothing shared with the policies' code), and their properties; the prepared models
(ContextualPolicy.prepare) against the policies' stats-based calls and the slow reference."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latebandit.policies import make_policy
from latebandit.policies.linear import (
    FRESH_EVERY,
    ContextualPolicy,
    LinearChoice,
    LinearStats,
    PreparedIndex,
    PreparedModel,
    Ridge,
    make_contextual_policy,
)
from latebandit.store.base import LinearSums

E1, E2, MIX = [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]
OFFERED = np.array([[E1, E2, MIX]])
PLAYED = [E1, E2, E1]  # rounds 1–3; only round 1 converted, visible at decision 4
FORMS = ["exact", "frozen", "cs", "none", "released"]

# --- the slow reference ---------------------------------------------------------------------------------


def ref_v(history: Sequence[Sequence[float]], ridge: float, d: int) -> np.ndarray:
    v = [[ridge if i == j else 0.0 for j in range(d)] for i in range(d)]
    for a in history:
        for i in range(d):
            for j in range(d):
                v[i][j] += a[i] * a[j]
    return np.array(v)


def ref_leverage(v: np.ndarray, a: Sequence[float]) -> float:
    """aᵀV⁻¹a by one linear solve."""
    x = np.linalg.solve(v, np.array(a))
    return sum(a[i] * float(x[i]) for i in range(len(a)))


def ref_index(
    name: str, form: str, history: list[list[float]], converted: list[bool], window: int, action: list[float],
    alpha: float = 1.0, ridge: float = 1.0, delta: float = 0.1,
) -> float:  # fmt: skip
    """The spec's §3.1, §3.2 and §3.4 indices, recomputed from the history at decision t = len(history) + 1."""
    d, t = len(action), len(history)
    v = ref_v(history, ridge, d)
    b = [sum(a[i] for a, y in zip(history, converted, strict=True) if y) for i in range(d)]
    theta = np.linalg.solve(v, np.array(b))
    estimate = sum(action[i] * float(theta[i]) for i in range(d))
    q = ref_leverage(v, action)
    recent = list(range(max(0, t - window), t)) if window else []
    beta = 2 * math.log(1 / delta) + d * math.log(1 + t / (ridge * d))
    if form == "released":
        if name == "linucb":
            return estimate + alpha * math.sqrt(beta + math.sqrt(ridge)) * q
        q_then = [ref_leverage(ref_v(history[:s], ridge, d), history[s]) for s in recent]
        return estimate + alpha * (math.sqrt(beta + ridge) + sum(q_then)) * q
    f = math.sqrt(ridge) + math.sqrt(2 * math.log(1 / delta) + d * math.log((d * ridge + t) / (d * ridge)))
    s = 0.0
    if name == "otf-linucb" and form == "exact":
        s = sum(math.sqrt(ref_leverage(v, history[i])) for i in recent)
    elif name == "otf-linucb" and form == "frozen":
        s = sum(math.sqrt(ref_leverage(ref_v(history[: i + 1], ridge, d), history[i])) for i in recent)
    elif name == "otf-linucb" and form == "cs":
        trace = sum(ref_leverage(v, history[i]) for i in recent)  # tr(V⁻¹M) = Σ AᵀV⁻¹A
        s = math.sqrt(len(recent) * trace)
    return estimate + alpha * (2 * f + s) * math.sqrt(q)


# --- the vectorised side: stats and footprints built by the policies' own path ------------------------------


def build_stats(
    policy_name: str, params: dict, histories: list[list[list[float]]], converted: list[list[bool]], window: int
) -> LinearStats:
    """R runs' sums, each decision's footprint taken from the policy's choice among the one action played."""
    policy = make_contextual_policy(policy_name, params)
    runs, t, d = len(histories), len(histories[0]), len(histories[0][0])
    actions = np.array(histories, dtype=np.float64)  # (R, t, d)
    footprints = np.zeros((runs, t))
    stats = LinearStats.empty(runs, d)
    for s in range(t):
        footprints[:, s] = policy.choose(stats, actions[:, s : s + 1], np.random.default_rng(0)).footprint
        stats = sums(actions[:, : s + 1], np.array(converted)[:, : s + 1], footprints[:, : s + 1], window)
    return stats


def sums(actions: np.ndarray, converted: np.ndarray, footprints: np.ndarray, window: int) -> LinearStats:
    t = actions.shape[1]
    recent = slice(t - min(window, t), t)
    gram = np.einsum("rsd,rse->rde", actions, actions)
    reward = np.einsum("rsd,rs->rd", actions, converted.astype(np.float64))
    in_window = actions[:, recent]
    return LinearStats(
        gram, reward, np.full(actions.shape[0], float(t)), np.full(actions.shape[0], float(in_window.shape[1])),
        footprints[:, recent].sum(axis=1), np.einsum("rsd,rse->rde", in_window, in_window), in_window,
    )  # fmt: skip


class Scripted:
    """A generator stand-in whose normal draws are given (the oracle's z) and whose uniforms are numpy's."""

    def __init__(self, z: list[float]) -> None:
        self._z, self._rng = np.array([z]), np.random.default_rng(0)

    def standard_normal(self, shape: tuple[int, ...]) -> np.ndarray:
        assert shape == self._z.shape
        return self._z

    def random(self, shape: tuple[int, ...]) -> np.ndarray:
        return self._rng.random(shape)


def oracle_stats(name: str, params: dict, window: int) -> LinearStats:
    return build_stats(name, params, [PLAYED], [[True, False, False]], window)


# --- the spec's hand example (§6.6) ---------------------------------------------------------------------------


def test_oracle_paper_form_window_two() -> None:
    stats = oracle_stats("otf-linucb", {"correction": "exact"}, 2)
    np.testing.assert_allclose(stats.gram[0], [[2, 0], [0, 1]])  # V − λI
    policy = make_contextual_policy("otf-linucb", {"correction": "exact"})
    assert policy.window_sum(stats, _ridge(stats))[0] == pytest.approx(1 / math.sqrt(2) + 1 / math.sqrt(3))
    assert policy.window_sum(stats, _ridge(stats))[0] == pytest.approx(1.284457, abs=1e-6)
    assert policy.policy_state(stats)["f"] == pytest.approx(3.537272, abs=1e-6)
    np.testing.assert_allclose(policy.index(stats, OFFERED)[0], [5.159405, 5.910707, 5.744735], atol=1e-6)
    np.testing.assert_allclose(policy.estimate(stats, OFFERED)[0], [1 / 3, 0.0, 0.2], atol=1e-12)
    naive = make_contextual_policy("linucb", {})
    np.testing.assert_allclose(naive.index(stats, OFFERED)[0], [4.417824, 5.002459, 4.892722], atol=1e-6)
    for each in (policy, naive):
        assert each.choose(stats, OFFERED, np.random.default_rng(1)).action.tolist() == [1]


def _ridge(stats: LinearStats) -> Ridge:
    return Ridge.of(stats, 1.0)


def test_oracle_window_three_exact_and_frozen() -> None:
    exact = make_contextual_policy("otf-linucb", {"correction": "exact"})
    stats = oracle_stats("otf-linucb", {"correction": "exact"}, 3)
    assert exact.window_sum(stats, _ridge(stats))[0] == pytest.approx(1.861807, abs=1e-6)
    np.testing.assert_allclose(exact.index(stats, OFFERED)[0, :2], [5.492739, 6.318955], atol=1e-6)
    frozen = make_contextual_policy("otf-linucb", {"correction": "frozen"})
    stats = oracle_stats("otf-linucb", {"correction": "frozen"}, 3)
    assert stats.window_footprint[0] == pytest.approx(2 / math.sqrt(2) + 1 / math.sqrt(3))
    assert frozen.window_sum(stats, _ridge(stats))[0] == pytest.approx(1.991564, abs=1e-6)


def test_oracle_released_form() -> None:
    stats = oracle_stats("otf-linucb", {"correction": "released"}, 2)
    assert stats.window_footprint[0] == pytest.approx(1.0 + 0.5)  # q = 1, 1, 0.5; the window holds rounds 2, 3
    policy = make_contextual_policy("otf-linucb", {"correction": "released"})
    np.testing.assert_allclose(policy.index(stats, OFFERED)[0], [1.742408, 2.113612, 2.059979], atol=1e-6)


def test_oracle_normalised_thompson_draw() -> None:
    params = {"sigma0": 0.5}
    stats = oracle_stats("otf-lints", params, 2)
    policy = make_contextual_policy("otf-lints", params)
    assert policy.inflation(stats)[0] == pytest.approx(1.744444, abs=1e-6)
    np.testing.assert_allclose(policy.estimate(stats, OFFERED)[0], [0.444444, 0.0, 0.266667], atol=1e-6)
    _, _, scores = policy._sample(stats, OFFERED, Scripted([1.0, -1.0]))  # type: ignore[arg-type]
    np.testing.assert_allclose(scores[0], [1.324961, -1.181336, -0.150093], atol=1e-6)
    assert policy.choose(stats, OFFERED, Scripted([1.0, -1.0])).action.tolist() == [0]  # type: ignore[arg-type]


def test_one_hot_reduction() -> None:
    """a = e_k: θ̂_k = S_k/(N_k + λ) and ‖e_k‖_{V⁻¹} = 1/sqrt(N_k + λ), pending pulls counted in N_k."""
    history = [E1] * 5 + [E2] * 3
    stats = build_stats("linucb", {}, [history], [[True, True, False, False, False, True, False, False]], 4)
    estimate = make_contextual_policy("linucb", {}).estimate(stats, OFFERED[:, :2])
    np.testing.assert_allclose(estimate[0], [2 / 6, 1 / 4])
    exact = make_contextual_policy("otf-linucb", {"correction": "exact"})
    window = 1 / math.sqrt(6) + 3 / math.sqrt(4)  # the last 4 pulls: one of arm 1, three of arm 2
    assert exact.window_sum(stats, _ridge(stats))[0] == pytest.approx(window)


# --- the slow reference on random histories ---------------------------------------------------------------------

unit = st.lists(st.floats(-1.0, 1.0), min_size=3, max_size=3).filter(lambda a: 1e-3 < sum(x * x for x in a) <= 3.0)


@settings(max_examples=40, deadline=None)
@given(
    runs=st.lists(st.lists(st.tuples(unit, st.booleans()), min_size=1, max_size=8), min_size=2, max_size=3),
    offered=st.lists(unit, min_size=1, max_size=4),
    window=st.integers(0, 9),
    alpha=st.sampled_from([1.0, 0.1]),
    ridge=st.sampled_from([1.0, 0.5]),
)
def test_indices_match_the_slow_reference(
    runs: list[list[tuple[list[float], bool]]], offered: list[list[float]], window: int, alpha: float, ridge: float
) -> None:
    length = min(len(run) for run in runs)
    histories = [[list(a) for a, _ in run[:length]] for run in runs]
    converted = [[y for _, y in run[:length]] for run in runs]
    actions = np.array([offered] * len(runs))
    for name, form in [("linucb", "paper"), ("linucb", "released"), *(("otf-linucb", f) for f in FORMS)]:
        params = {"alpha": alpha, "lam": ridge, ("form" if name == "linucb" else "correction"): form}
        stats = build_stats(name, params, histories, converted, window)
        ours = make_contextual_policy(name, params).index(stats, actions)
        for r in range(len(runs)):
            for k, action in enumerate(offered):
                expected = ref_index(name, form, histories[r], converted[r], window, action, alpha, ridge)
                assert ours[r, k] == pytest.approx(expected, rel=1e-9, abs=1e-9), (name, form, r, k)


# --- properties -------------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(history=st.lists(unit, min_size=1, max_size=10), window=st.integers(1, 12), probe=unit)
def test_frozen_bounds_exact_and_cauchy_schwarz_bounds_exact(history: list[list[float]], window: int, probe) -> None:
    converted = [[False] * len(history)]
    sums_of = {form: build_stats("otf-linucb", {"correction": form}, [history], converted, window) for form in FORMS}
    s = {}
    for form in ("exact", "frozen", "cs"):
        policy = make_contextual_policy("otf-linucb", {"correction": form})
        s[form] = policy.window_sum(sums_of[form], _ridge(sums_of[form]))[0]
    assert 0.0 <= s["exact"] <= s["frozen"] + 1e-12
    assert s["exact"] <= s["cs"] + 1e-12


@settings(max_examples=30, deadline=None)
@given(history=st.lists(st.tuples(unit, st.booleans()), min_size=0, max_size=10), offered=st.lists(unit, min_size=1))
def test_nothing_pending_means_no_correction(
    history: list[tuple[list[float], bool]], offered: list[list[float]]
) -> None:
    """m = 0 (or an empty window): OTFLinUCB is LinUCB, in every servable form."""
    actions = [list(a) for a, _ in history] or []
    converted = [[y for _, y in history]]
    naive = make_contextual_policy("linucb", {})
    for form in ("exact", "frozen", "cs", "none"):
        stats = (
            build_stats("otf-linucb", {"correction": form}, [actions], converted, 0)
            if actions
            else LinearStats.empty(1, 3)
        )
        assert stats.window_count[0] == 0 and stats.window_footprint[0] == 0.0
        corrected = make_contextual_policy("otf-linucb", {"correction": form}).index(stats, np.array([offered]))
        np.testing.assert_array_equal(corrected, naive.index(stats, np.array([offered])))


def test_released_forms_agree_without_a_window_at_unit_ridge() -> None:
    """The authors' ablation sqrt(β + sqrt λ) equals their OTFLinUCB's sqrt(β + λ) with no window at λ = 1."""
    stats = oracle_stats("otf-linucb", {"correction": "released"}, 0)
    corrected = make_contextual_policy("otf-linucb", {"correction": "released"}).index(stats, OFFERED)
    np.testing.assert_allclose(corrected, make_contextual_policy("linucb", {"form": "released"}).index(stats, OFFERED))


@settings(max_examples=30, deadline=None)
@given(history=st.lists(unit, min_size=0, max_size=8), action=unit, ridge=st.sampled_from([1.0, 0.25, 3.0]))
def test_footprints_are_norms_after_the_update(history: list[list[float]], action: list[float], ridge: float) -> None:
    """Sherman–Morrison: sqrt(q/(1+q)) and q/(1+q) (q against V before the action) are its norms against V after."""
    d = 3
    after = ref_leverage(ref_v([*history, action], ridge, d), action)
    stats = build_stats("linucb", {}, [history], [[False] * len(history)], 0) if history else LinearStats.empty(1, d)
    offered = np.array([[action]])
    frozen = make_contextual_policy("otf-linucb", {"correction": "frozen", "lam": ridge})
    assert frozen.choose(stats, offered, np.random.default_rng(0)).footprint[0] == pytest.approx(math.sqrt(after))
    sampling = make_contextual_policy("otf-lints", {"sigma0": math.sqrt(ridge)})
    assert sampling.choose_actions(stats, offered, np.random.default_rng(0)).footprint[0] == pytest.approx(after)


def test_thompson_propensity_is_an_estimate_of_the_sampling_law() -> None:
    """The logged propensity matches the frequency of each action over many decisions from the same state,
    and repeats for the same state (its generator is seeded by the state, not the decision's)."""
    stats = oracle_stats("otf-lints", {}, 2)
    policy = make_contextual_policy("otf-lints", {"propensity_samples": 20_000})
    rng = np.random.default_rng(5)
    runs = 4000
    many = LinearStats(*(np.repeat(getattr(stats, f), runs, axis=0) for f in ("gram", "reward", "decisions",
                       "window_count", "window_footprint")))  # fmt: skip
    frequency = np.bincount(policy.choose_actions(many, np.repeat(OFFERED, runs, 0), rng).action, minlength=3) / runs
    for k in range(3):
        logged = policy.propensity(stats, OFFERED, np.array([k]))[0]
        assert logged == pytest.approx(frequency[k], abs=0.03)
        assert logged == policy.propensity(stats, OFFERED, np.array([k]))[0]


def test_batch_runs_decide_independently() -> None:
    """Runs do not leak into each other: a run's index is the same in a batch as alone."""
    rng = np.random.default_rng(3)
    histories = rng.normal(size=(3, 6, 4)) / 2
    converted = rng.random((3, 6)) < 0.5
    offered = rng.normal(size=(3, 5, 4)) / 2
    for name, params in [("otf-linucb", {"correction": "exact"}), ("otf-linucb", {"correction": "cs"}), ("linucb", {})]:
        batch = make_contextual_policy(name, params).index(
            build_stats(name, params, histories.tolist(), converted.tolist(), 3), offered
        )
        for r in range(3):
            alone = build_stats(name, params, histories[r : r + 1].tolist(), converted[r : r + 1].tolist(), 3)
            np.testing.assert_allclose(
                batch[r : r + 1], make_contextual_policy(name, params).index(alone, offered[r : r + 1])
            )


def test_inverses_carried_over_decisions_score_as_fresh_ones() -> None:
    """V⁻¹ inverted once and updated by Sherman–Morrison for each decision added since, in a group
    (LinearStats.with_decision) and in the store's sums (LinearSums.with_decisions), past FRESH_EVERY updates,
    equals the inverse of the same gram computed afresh, and so do the indices."""
    rng = np.random.default_rng(7)
    d, blocks = 5, 2
    policy = make_contextual_policy("otf-linucb", {})
    stats, model = LinearStats.empty(blocks, d), LinearSums.zeros(blocks, d)

    def of_model(inverses: bool) -> LinearStats:
        held = {"inverses": model.inverses} if inverses else {}
        return LinearStats(model.gram, model.reward, stats.decisions, stats.window_count, stats.window_footprint,
                           **held)  # fmt: skip

    for step in range(FRESH_EVERY + 40):
        offered = rng.normal(size=(blocks, 4, d)) / 3
        for carried in (stats, of_model(True)):
            policy.choose(carried, offered, rng)  # inverts, or takes the held inverse
        a = rng.normal(size=d) / 3
        stats = stats.with_decision(step % blocks, a, 0.1)
        model = model.with_decisions([(step % blocks, a)])
        fresh = of_model(False)
        np.testing.assert_array_equal(stats.gram, fresh.gram)
        for carried in (stats, of_model(True)):
            np.testing.assert_allclose(Ridge.of(carried, 1.0).inverse, Ridge.of(fresh, 1.0).inverse, rtol=0,
                                       atol=1e-13)  # fmt: skip
            np.testing.assert_allclose(policy.index(carried, offered), policy.index(fresh, offered), rtol=1e-12)


def test_parameters_are_validated_and_contextual_names_refused_by_the_arm_policies() -> None:
    with pytest.raises(ValueError, match="correction must be one of"):
        make_contextual_policy("otf-linucb", {"correction": "bogus"})
    with pytest.raises(ValueError, match="no parameter 'sigma0'"):
        make_contextual_policy("linucb", {"sigma0": 1})
    with pytest.raises(ValueError, match="alpha must be"):
        make_contextual_policy("linucb", {"alpha": -1})
    with pytest.raises(ValueError, match="alpha must be"):
        make_contextual_policy("linucb", {"alpha": True})
    with pytest.raises(ValueError, match="unknown contextual policy"):
        make_contextual_policy("ucb1", {})
    with pytest.raises(ValueError, match="is contextual"):
        make_policy("otf-linucb", {}, 3)
    with pytest.raises(ValueError, match="needs the window's actions"):
        make_contextual_policy("otf-linucb", {"correction": "exact"}).index(
            LinearStats(np.zeros((1, 2, 2)), np.zeros((1, 2)), np.zeros(1), np.zeros(1), np.zeros(1)), OFFERED
        )


def stacked(blocks: list[LinearStats]) -> LinearStats:
    """One LinearStats with each block a run (the disjoint form's layout: a block per arm)."""
    fields = ("gram", "reward", "decisions", "window_count", "window_footprint")
    return LinearStats(*(np.concatenate([getattr(block, name) for block in blocks]) for name in fields))


@settings(max_examples=30, deadline=None)
@given(
    arms=st.lists(st.lists(st.tuples(unit, st.booleans()), min_size=1, max_size=6), min_size=2, max_size=4),
    context=unit,
    window=st.integers(0, 6),
)
def test_the_disjoint_form_plays_the_arm_of_the_best_reference_index(
    arms: list[list[tuple[list[float], bool]]], context: list[float], window: int
) -> None:
    """choose_arm (a parameter per arm, the context in every arm's block) plays the arm whose own index, the
    slow reference over that arm's history alone, is the highest; its footprint is that arm's frozen norm."""
    for name, params in [("linucb", {}), ("otf-linucb", {"correction": "frozen"})]:
        blocks = [build_stats(name, params, [[list(a) for a, _ in run]], [[y for _, y in run]], window) for run in arms]
        choice = make_contextual_policy(name, params).choose_arm(
            stacked(blocks), np.array(context), np.random.default_rng(0)
        )
        form = "paper" if name == "linucb" else "frozen"
        expected = [
            ref_index(name, form, [list(a) for a, _ in run], [y for _, y in run], window, context) for run in arms
        ]
        best = int(choice.action[0])
        assert expected[best] == pytest.approx(max(expected), rel=1e-9, abs=1e-9), (name, expected, best)
        q = ref_leverage(ref_v([list(a) for a, _ in arms[best]], 1.0, len(context)), context)
        assert choice.footprint[0] == pytest.approx(math.sqrt(q / (1 + q)) if name == "otf-linucb" else 0.0)


def test_the_disjoint_thompson_propensity_estimates_how_often_each_arm_wins() -> None:
    """Repeated draws from one state: each arm's estimated propensity is near the share of draws it won."""
    rng = np.random.default_rng(5)
    blocks = [
        build_stats("otf-lints", {}, [[list(rng.normal(size=2) / 3) for _ in range(n)]], [[True] * n], 2)
        for n in (1, 4, 8)
    ]
    stats, policy = stacked(blocks), make_contextual_policy("otf-lints", {"sigma0": 0.3})
    draws = [policy.choose_arm(stats, np.array([0.6, 0.0]), np.random.default_rng(seed)) for seed in range(2000)]
    for arm in range(3):
        won = [choice for choice in draws if choice.action[0] == arm]
        if won:
            assert won[0].propensity[0] == pytest.approx(len(won) / len(draws), abs=0.05)


# --- prepared models ---------------------------------------------------------------------------------------------

SERVED = [
    *(("otf-linucb", {"correction": form}) for form in ("frozen", "released", "none")),
    *(("linucb", {"form": form}) for form in ("paper", "released")),
    *(("otf-lints", {"form": form, "propensity_samples": 200}) for form in ("normalised", "released")),
]


def random_stats(rng: np.random.Generator, blocks: int, d: int) -> LinearStats:
    """Sums of random histories of at most unit-norm vectors, a random share converted, a random window."""
    gram, reward, decisions, count, footprint = [], [], [], [], []
    for _ in range(blocks):
        n = int(rng.integers(0, 12))
        played = rng.normal(size=(n, d)) / math.sqrt(d)
        gram.append(played.T @ played)
        reward.append(played[rng.random(n) < 0.4].sum(axis=0))
        decisions.append(float(n))
        count.append(float(rng.integers(0, n + 1)))
        footprint.append(count[-1] * rng.uniform(0.0, 0.8))
    return LinearStats(np.array(gram), np.array(reward), *(np.array(part) for part in (decisions, count, footprint)))


def vectors(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    drawn = rng.normal(size=shape)
    return drawn / np.maximum(1.0, np.linalg.norm(drawn, axis=-1, keepdims=True))


def assert_same_choice(got: LinearChoice, expected: LinearChoice) -> None:
    np.testing.assert_array_equal(got.action, expected.action)
    np.testing.assert_array_equal(got.propensity, expected.propensity)
    np.testing.assert_array_equal(got.footprint, expected.footprint)


def separated(index: np.ndarray) -> bool:
    """Whether each row's best index beats the next by far more than rounding (the argmax cannot flip)."""
    top = np.sort(index, axis=1)[:, ::-1]
    return index.shape[1] == 1 or bool((top[:, 0] - top[:, 1] > 1e-7 * (1.0 + np.abs(top[:, 0]))).all())


def decision(decider: ContextualPolicy | PreparedModel, stats: LinearStats | None, offer: np.ndarray,
             rng: np.random.Generator) -> LinearChoice:  # fmt: skip
    """A policy's call on ``stats`` (a prepared model's: stats None): choose_arm for a context (d,), choose for
    actions (1, K, d)."""
    if isinstance(decider, PreparedModel):
        return decider.choose_arm(offer, rng) if offer.ndim == 1 else decider.choose(offer, rng)
    return decider.choose_arm(stats, offer, rng) if offer.ndim == 1 else decider.choose(stats, offer, rng)


@settings(max_examples=60, deadline=None)
@given(
    served=st.sampled_from(SERVED),
    seed=st.integers(0, 2**32 - 1),
    d=st.integers(1, 5),
    offered=st.integers(1, 6),
    blocks=st.integers(1, 4),
    alpha=st.sampled_from([1.0, 0.3]),
    ridge=st.sampled_from([1.0, 0.25]),
)
def test_a_prepared_model_decides_as_the_policy_does_on_its_stats(
    served: tuple[str, dict], seed: int, d: int, offered: int, blocks: int, alpha: float, ridge: float
) -> None:
    """prepare(stats).choose and .choose_arm give the policy's own choice on the stats (action, propensity,
    footprint) and draw as many numbers; prepare(stats).with_decision(...) decides as the policy does on
    stats.with_decision(...): the same indices to 1e-9, so the same action where no two are that close."""
    name, form = served
    params = {**form, **({"sigma0": math.sqrt(ridge)} if name == "otf-lints" else {"alpha": alpha, "lam": ridge})}
    policy, rng = make_contextual_policy(name, params), np.random.default_rng(seed)
    one, arms = random_stats(rng, 1, d), random_stats(rng, blocks, d)
    actions, context = vectors(rng, (1, offered, d)), vectors(rng, (d,))
    block, features, footprint = int(rng.integers(blocks)), vectors(rng, (d,)), float(rng.uniform(0.0, 1.0))
    for stats, offer, added in ((one, actions, 0), (arms, context, block)):
        prepared = policy.prepare(stats)
        ours, theirs = np.random.default_rng(seed), np.random.default_rng(seed)
        assert_same_choice(decision(prepared, None, offer, ours), decision(policy, stats, offer, theirs))
        assert ours.random() == theirs.random()  # as many draws

        later = prepared.with_decision(added, features, footprint)
        expected = stats.with_decision(added, features, footprint)
        got = decision(later, None, offer, np.random.default_rng(seed))
        wanted = decision(policy, expected, offer, np.random.default_rng(seed))
        if isinstance(later, PreparedIndex):  # the optimistic indices, every block's for a context
            probe = np.broadcast_to(offer, (blocks, 1, d)) if offer.ndim == 1 else offer
            reference = policy.index(expected, probe)  # type: ignore[attr-defined]
            np.testing.assert_allclose(later.index(probe), reference, rtol=1e-9, atol=1e-12)
            if not separated(reference.T if offer.ndim == 1 else reference):
                continue  # rounding may pick another of the best
        np.testing.assert_array_equal(got.action, wanted.action)
        np.testing.assert_allclose(got.propensity, wanted.propensity, rtol=1e-12)
        np.testing.assert_allclose(got.footprint, wanted.footprint, rtol=1e-9, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    history=st.lists(st.tuples(unit, st.booleans()), min_size=0, max_size=6),
    group=st.lists(st.lists(unit, min_size=1, max_size=4), min_size=1, max_size=5),
    served=st.sampled_from([("linucb", "paper"), ("linucb", "released"),
                            *(("otf-linucb", form) for form in ("frozen", "released", "none"))]),
)  # fmt: skip
def test_a_group_chosen_in_turn_scores_as_the_slow_reference(
    history: list[tuple[list[float], bool]], group: list[list[list[float]]], served: tuple[str, str]
) -> None:
    """The decisions of a group chosen in turn from one prepared model, each with_decision of the one before:
    every index equals the slow reference's over the history extended by the group's earlier choices (their
    conversions pending, a window holding them all), and the choice is its argmax."""
    name, form = served
    params = {"form" if name == "linucb" else "correction": form}
    played, converted, window = [list(a) for a, _ in history], [y for _, y in history], 64
    stats = build_stats(name, params, [played], [converted], window) if played else LinearStats.empty(1, 3)
    model = make_contextual_policy(name, params).prepare(stats)
    rng = np.random.default_rng(0)
    for offer in group:
        expected = [ref_index(name, form, played, converted, window, action) for action in offer]
        assert isinstance(model, PreparedIndex)
        np.testing.assert_allclose(model.index(np.array([offer]))[0], expected, rtol=1e-9, atol=1e-9)
        choice = model.choose(np.array([offer]), rng)
        chosen = int(choice.action[0])
        assert expected[chosen] == pytest.approx(max(expected), rel=1e-9, abs=1e-9)
        model = model.with_decision(0, np.array(offer[chosen]), float(choice.footprint[0]))
        played, converted = [*played, offer[chosen]], [*converted, False]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), served=st.sampled_from(SERVED[:5]), ties=st.booleans())
def test_a_batch_of_runs_chooses_as_each_run_alone(seed: int, served: tuple[str, dict], ties: bool) -> None:
    """R runs in one call (the simulator's) choose what R one-run calls (the service's, whose ties are found on
    Python floats) choose from the same generator, ties included: the same actions, propensities, draws."""
    name, params = served
    policy, rng = make_contextual_policy(name, params), np.random.default_rng(seed)
    runs = [random_stats(rng, 1, 3) for _ in range(4)]
    actions = vectors(rng, (4, 5, 3))
    if ties:
        actions[:, 3] = actions[:, 1]  # the same action twice: a tie of (at least) two
    batch, alone = np.random.default_rng(seed), np.random.default_rng(seed)
    together = policy.choose(stacked(runs), actions, batch)
    for r, stats in enumerate(runs):
        choice = policy.choose(stats, actions[r : r + 1], alone)
        assert (choice.action[0], choice.propensity[0]) == (together.action[r], together.propensity[r])
        assert choice.footprint[0] == pytest.approx(together.footprint[r], rel=1e-12)
    assert batch.random() == alone.random()
