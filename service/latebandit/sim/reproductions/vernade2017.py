"""Vernade, Cappé & Perchet (UAI 2017): every experiment of the paper, and a Criteo-like delay scenario.

The paper's figures are images without numbers; the references printed beside ours are an independent
re-simulation under the conventions we also use: the age convention of docs/reference/scenarios.md,
geometric delays with support {0, 1, …} and p = 1/μ, ε = 0, random tie-breaking with +∞ indices
least-pulled first, pseudo-regret Σ Δ_{A_s}.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from latebandit.delays.models import delay_from_spec
from latebandit.policies.indices import kl_bernoulli
from latebandit.sim.reproductions.base import (
    Check,
    Panel,
    Reference,
    Reproduction,
    Results,
    paired_difference,
    result_of,
)
from latebandit.sim.runner import mean_and_error
from latebandit.sim.scenario import scenario_from_mapping

PAPER = "vernade2017"
HORIZON = 10_000
MU = 500
WINDOW = 1000
GEOMETRIC = {"family": "geometric", "p": 1 / MU}
THETA_H = (0.5, 0.4, 0.3)
THETA_L = (0.1, 0.05, 0.03)
CHECKPOINTS = (1000, 2000, 5000, 10_000)
FIG2_CHECKPOINTS = (1000, 2000, 3000, 5000, 10_000)
THETA_L_KLUCB = (22, 30, 39, 46)  # the reference re-simulation's d-klucb on θL at CHECKPOINTS
SWEEP = (100, 250, 500, 1000, 2000, 5000, None)
SOURCE = "an independent re-simulation (the reference; the paper prints no numbers)"
# Our Criteo-like fit (15 min, 26 h, 14 d) with one round = 20 minutes, which puts the mixture's mean (≈ 169 h)
# at ≈ 500 rounds, the paper's μ; m = 30 days.
MINUTES_PER_ROUND = 20
CRITEO_DELAY = {
    "family": "mixture",
    "weights": [0.33, 0.18, 0.49],
    "components": [{"family": "exponential", "mean": minutes / MINUTES_PER_ROUND} for minutes in (15, 1560, 20_160)],
}
CRITEO_WINDOW = 30 * 24 * 60 // MINUTES_PER_ROUND


def _policy(name: str, label: str, feed: Any = None) -> dict[str, Any]:
    return {"name": name, "label": label} | ({} if feed is None else {"feed": feed})


def _panel(
    title: str,
    arms: Sequence[float],
    window: int | None,
    policies: list[dict[str, Any]],
    runs: int,
    checkpoints: Sequence[int] = CHECKPOINTS,
    delay: dict[str, Any] = GEOMETRIC,
) -> Panel:
    data = {
        "horizon": HORIZON,
        "runs": runs,
        "seed": 2017,
        "arms": list(arms),
        "delay": delay,
        "window": window,
        "policies": policies,
        "checkpoints": list(checkpoints),
    }
    return Panel(title, scenario_from_mapping(data))


def _ratio(results: Results, panel: str, numerator: str, denominator: str) -> float:
    return float(
        result_of(results, panel, numerator).final.mean() / result_of(results, panel, denominator).final.mean()
    )


def pseudo_regret_bound(theta: Sequence[float], tau_m: float) -> float:
    """The coefficient of log T below which no uniformly efficient policy's pseudo-regret Σ Δ_k·E[N_k]
    grows, censored at τ_m: Σ_k Δ_k / d(τ_m·θ_k, τ_m·θ*) (τ_m = 1: Lai–Robbins). Theorem 3 states
    τ_m times this, the bound on the τ-weighted L(T), whose pulls each cost τ_m·Δ once matured."""
    theta_array = np.asarray(theta)
    best = theta_array.max()
    others = theta_array[theta_array < best]
    return float(np.sum((best - others) / kl_bernoulli(tau_m * others, tau_m * best)))


def tau(window: int | None, delay: dict[str, Any] = GEOMETRIC) -> float:
    return 1.0 if window is None else float(delay_from_spec(delay).cdf(window))


# --- Fig. 1 ---------------------------------------------------------------------------------------------


def _fig1_panels(arms: Sequence[float], name: str) -> Callable[[int], list[Panel]]:
    def panels(runs: int) -> list[Panel]:
        return [
            _panel(
                f"{name} censored m={WINDOW}",
                arms,
                WINDOW,
                [_policy("delayed-ucb", "d-ucb"), _policy("delayed-klucb", "d-klucb")],
                runs,
            ),
            _panel(
                f"{name} uncensored",
                arms,
                None,
                [_policy("delayed-ucb", "ud-ucb"), _policy("delayed-klucb", "ud-klucb")],
                runs,
            ),
        ]

    return panels


def _same_until_window(results: Results, name: str) -> Check:
    """With the same seeds, censored and uncensored runs coincide exactly until round m."""
    censored, uncensored = f"{name} censored m={WINDOW}", f"{name} uncensored"
    identical = []
    for index in ("ucb", "klucb"):
        a, b = result_of(results, censored, f"d-{index}"), result_of(results, uncensored, f"ud-{index}")
        early = a.rounds <= WINDOW
        identical.append(bool(np.array_equal(a.regret[early], b.regret[early])))
    return Check(
        f"{name}: censored and uncensored runs are identical for t <= m",
        f"d-ucb/ud-ucb {'identical' if identical[0] else 'differ'}, "
        f"d-klucb/ud-klucb {'identical' if identical[1] else 'differ'}",
        all(identical),
    )


def _fig1a_checks(results: Results) -> list[Check]:
    ratio = _ratio(results, f"θH censored m={WINDOW}", "d-ucb", "d-klucb")
    return [
        Check(
            "θH: d-ucb and d-klucb within about 25 % of each other at T",
            f"d-ucb/d-klucb = {ratio:.2f}",
            abs(ratio - 1.0) <= 0.25,
        ),
        _same_until_window(results, "θH"),
    ]


def _fig1b_checks(results: Results) -> list[Check]:
    panel = f"θL censored m={WINDOW}"
    ratio = _ratio(results, panel, "d-ucb", "d-klucb")
    klucb = result_of(results, panel, "d-klucb")
    half = HORIZON // 2
    per_run = (klucb.at([HORIZON])[0] - klucb.at([half])[0]) / math.log(2)
    slope, slope_se = mean_and_error(per_run)
    tau_m = tau(WINDOW)
    bound = pseudo_regret_bound(THETA_L, tau_m)
    at = dict(zip(CHECKPOINTS, THETA_L_KLUCB, strict=True))
    reference = (at[HORIZON] - at[half]) / math.log(2)
    # The reference expects a slope "close to 5" at large t, but the bound is asymptotic: the reference's own
    # re-simulation has the slope at 10.1 over [T/2, T], and so do we. What can be checked at T = 10⁴ is
    # that the slope matches that re-simulation and does not fall below the bound.
    return [
        Check("θL: d-klucb far below d-ucb at T, ratio about 2.5–3", f"d-ucb/d-klucb = {ratio:.2f}", ratio >= 2.0),
        _same_until_window(results, "θL"),
        Check(
            f"θL: d-klucb's pseudo-regret slope against log t over [T/2, T] matches the reference's {reference:.1f} "
            f"and lies above the asymptotic lower bound {bound:.2f} (Theorem 3's {tau_m * bound:.2f} is "
            "the bound on L(T) = τ_m·R(T); not reached by T = 10⁴, in the reference's own numbers either)",
            f"{slope:.1f} ± {slope_se:.1f}",
            abs(slope - reference) <= 2 * slope_se and slope >= bound - 2 * slope_se,
        ),
    ]


def _fig1_references(name: str, rows: dict[str, tuple[tuple[float, ...], float]]) -> dict[str, dict[str, Reference]]:
    out: dict[str, dict[str, Reference]] = {}
    for label, (values, se) in rows.items():
        panel = f"{name} censored m={WINDOW}" if label.startswith("d-") else f"{name} uncensored"
        out.setdefault(panel, {})[label] = Reference(CHECKPOINTS, values, se)
    return out


FIG1_SETTING = (
    f"K = 3 Bernoulli arms, T = {HORIZON:,}, geometric delays with mean μ = {MU} rounds (p = 1/μ, support from 0); "
    f"censored panel m = {WINDOW} (τ_m = {tau(WINDOW):.4f}), uncensored panel no window; 100 runs."
)
FIG1A = Reproduction(
    name="vernade2017-fig1a",
    paper=PAPER,
    figure="Fig. 1 (a), θH = (0.5, 0.4, 0.3)",
    setting=FIG1_SETTING,
    claim="UCB-based policies do satisfactorily at central conversion rates: DelayedUCB and DelayedKLUCB are close.",
    runs=100,
    panels=_fig1_panels(THETA_H, "θH"),
    references=_fig1_references(
        "θH",
        {
            "d-ucb": ((54, 86, 119, 132), 2.8),
            "d-klucb": ((48, 68, 90, 109), 2.9),
            "ud-ucb": ((54, 78, 109, 124), 3.4),
            "ud-klucb": ((48, 67, 85, 102), 2.4),
        },
    ),
    reference_source=SOURCE,
    checks=_fig1a_checks,
)
FIG1B = Reproduction(
    name="vernade2017-fig1b",
    paper=PAPER,
    figure="Fig. 1 (b), θL = (0.1, 0.05, 0.03)",
    setting=FIG1_SETTING,
    claim="At realistic low rates UCB is clearly sub-optimal; DelayedKLUCB's loss from the Poisson divergence "
    "is not significant at θ* = 0.1.",
    runs=100,
    panels=_fig1_panels(THETA_L, "θL"),
    references=_fig1_references(
        "θL",
        {
            "d-ucb": ((41, 64, 93, 132), 1.4),
            "d-klucb": (THETA_L_KLUCB, 1.4),
            "ud-ucb": ((41, 63, 76, 123), 2.1),
            "ud-klucb": ((22, 29, 37, 44), 1.3),
        },
    ),
    reference_source=SOURCE,
    checks=_fig1b_checks,
)

# --- Fig. 2 ---------------------------------------------------------------------------------------------

FIG2_PANEL = f"θL censored m={WINDOW}"
DISCARDING = {"discarding-ucb": "d-ucb", "discarding-ucb-literal": "d-ucb", "discarding-klucb": "d-klucb"}


def _fig2_panels(runs: int) -> list[Panel]:
    policies = [
        _policy("delayed-ucb", "d-ucb"),
        _policy("delayed-klucb", "d-klucb"),
        _policy("delayed-ucb", "discarding-ucb", "discarding"),
        _policy("delayed-ucb", "discarding-ucb-literal", "discarding-literal"),
        _policy("delayed-klucb", "discarding-klucb", "discarding"),
    ]
    return [_panel(FIG2_PANEL, THETA_L, WINDOW, policies, runs, FIG2_CHECKPOINTS)]


def _fig2_checks(results: Results) -> list[Check]:
    checks = []
    for discarding, delayed in DISCARDING.items():
        mean, se = paired_difference(
            result_of(results, FIG2_PANEL, discarding), result_of(results, FIG2_PANEL, delayed)
        )
        checks.append(Check(f"{discarding} above {delayed} at T", f"difference {mean:+.1f} ± {se:.1f}", mean > 2 * se))
    warmup = result_of(results, FIG2_PANEL, "discarding-klucb")
    gaps = np.max(THETA_L) - np.array(THETA_L)
    in_turn = float(gaps[np.arange(WINDOW) % len(gaps)].sum())  # every index is +inf: the opening's round-robin
    mean, se = mean_and_error(warmup.at([WINDOW])[0])
    checks.append(
        Check(
            f"Discarding plays the arms in turn until m (round-robin or uniform would both fit the text; the three "
            f"Discarding policies coincide until m): regret at t = m is Σ Δ over the turns = {in_turn:.2f} "
            f"≈ m·ΣΔ/K = {WINDOW * gaps.mean():g}",
            f"{mean:.2f} ± {se:.2f}",
            abs(mean - in_turn) <= max(2 * se, 1e-9),
        )
    )
    return checks


FIG2 = Reproduction(
    name="vernade2017-fig2",
    paper=PAPER,
    figure="Fig. 2, DelayedUCB/KLUCB against the Discarding baselines",
    setting=f"θL = (0.1, 0.05, 0.03), censored m = {WINDOW}, geometric μ = {MU}, T = {HORIZON:,}, 200 runs. "
    "Discarding = the same index code fed only matured pulls (age >= m) with Ñ = τ_m·N_old; "
    "'-literal' feeds N = τ_m·N_old, which gives the printed width sqrt(β/(2·τ_m·N)).",
    claim="Discarding has a linear-regret phase at the start and reaches the expected growth rate only after "
    "many rounds: a non-negligible gap to the delayed policies.",
    runs=200,
    panels=_fig2_panels,
    references={
        FIG2_PANEL: {
            "d-ucb": Reference(FIG2_CHECKPOINTS, (41, 65, 68, 92, 135), 1.1),
            "d-klucb": Reference(FIG2_CHECKPOINTS, (23, 30, 33, 39, 46), 1.0),
            "discarding-ucb": Reference(FIG2_CHECKPOINTS, (40, 46, 56, 134, 174), 0.9),
            "discarding-ucb-literal": Reference(FIG2_CHECKPOINTS, (40, 46, 54, 119, 169), 1.2),
            "discarding-klucb": Reference(FIG2_CHECKPOINTS, (40, 47, 48, 57, 73), 2.1),
        }
    },
    reference_source=SOURCE,
    checks=_fig2_checks,
)

# --- Fig. 3 (App. D): plug-in delay estimation --------------------------------------------------------------


def _fig3_panels(runs: int) -> list[Panel]:
    panels = []
    for name, arms in (("θL", THETA_L), ("θH", THETA_H)):
        panels.append(
            _panel(
                f"{name} censored m={WINDOW}",
                arms,
                WINDOW,
                [_policy("delayed-klucb", "d-klucb"), _policy("delayed-klucb", "d-klucb plug-in", "plugin")],
                runs,
            )
        )
        panels.append(
            _panel(
                f"{name} uncensored",
                arms,
                None,
                [
                    _policy("delayed-klucb", "ud-klucb"),
                    _policy("delayed-klucb", "ud-klucb plug-in γ=1", {"kind": "plugin", "gamma": 1.0}),
                    _policy("delayed-klucb", "ud-klucb plug-in γ=0.6", {"kind": "plugin", "gamma": 0.6}),
                ],
                runs,
            )
        )
    return panels


def _fig3_checks(results: Results) -> list[Check]:
    checks = []
    for panel, (known, *plugins) in results.items():  # each panel lists the known-τ policy first
        for plugin in plugins:
            mean, se = paired_difference(plugin, known)
            checks.append(
                Check(
                    f"{panel}: {plugin.label} does not hurt against known τ",
                    f"difference {mean:+.1f} ± {se:.1f}",
                    mean <= 2 * se,
                )
            )
    return checks


def _fig3_references() -> dict[str, dict[str, Reference]]:
    table = {  # the reference, Fig. 3 setting, regret at T = 10^4 (no standard errors given)
        "θL": (46.0, 45.2, 45.1, 40.3, 42.8),
        "θH": (114.6, 111.6, 104.9, 99.4, 101.1),
    }
    out: dict[str, dict[str, Reference]] = {}
    for name, (known, plugin, u_known, u_one, u_six) in table.items():
        out[f"{name} censored m={WINDOW}"] = {
            "d-klucb": Reference((HORIZON,), (known,)),
            "d-klucb plug-in": Reference((HORIZON,), (plugin,)),
        }
        out[f"{name} uncensored"] = {
            "ud-klucb": Reference((HORIZON,), (u_known,)),
            "ud-klucb plug-in γ=1": Reference((HORIZON,), (u_one,)),
            "ud-klucb plug-in γ=0.6": Reference((HORIZON,), (u_six,)),
        }
    return out


FIG3 = Reproduction(
    name="vernade2017-fig3",
    paper=PAPER,
    figure="Fig. 3 (App. D), known τ against the plug-in estimate",
    setting=f"The paper gives no parameters; we use the Fig. 1 settings (θL and θH, m = {WINDOW} or none, "
    f"geometric μ = {MU}, T = {HORIZON:,}, 100 runs). Censored plug-in: τ̂_s = δ_s/n_d from every delay seen; "
    "uncensored: geometric μ̂ by stochastic approximation with step n_d^−γ. Both assume no delay before the "
    "first observed one.",
    claim="Estimating the delay parameters on the fly does not hurt the cumulative regret.",
    runs=100,
    panels=_fig3_panels,
    references=_fig3_references(),
    reference_source=SOURCE,
    checks=_fig3_checks,
)

# --- Window sweep (Lemma 15, Theorem 3) --------------------------------------------------------------------


def _window_title(window: int | None) -> str:
    return "no window" if window is None else f"m={window}"


def _sweep_panels(runs: int) -> list[Panel]:
    policies = [_policy("delayed-klucb", "d-klucb"), _policy("delayed-ucb", "d-ucb")]
    return [_panel(_window_title(window), THETA_L, window, policies, runs) for window in SWEEP]


def _sweep_checks(results: Results) -> list[Check]:
    checks = []
    for smaller, larger in itertools.pairwise(SWEEP):
        a = result_of(results, _window_title(larger), "d-klucb")
        b = result_of(results, _window_title(smaller), "d-klucb")
        mean, se = paired_difference(a, b)
        bounds = [pseudo_regret_bound(THETA_L, tau(m)) * math.log(HORIZON) for m in (smaller, larger)]
        checks.append(
            Check(
                f"d-klucb: widening {_window_title(smaller)} → {_window_title(larger)} does not raise the regret "
                f"(Lemma 15; lower bound·log T {bounds[0]:.0f} → {bounds[1]:.0f})",
                f"{b.final.mean():.1f} → {a.final.mean():.1f} (difference {mean:+.1f} ± {se:.1f})",
                mean <= 2 * se,
            )
        )
    return checks


WINDOWS = Reproduction(
    name="vernade2017-window",
    paper=PAPER,
    figure="Window sweep (Theorem 3, Lemma 15; no figure in the paper)",
    setting=f"θL, geometric μ = {MU}, T = {HORIZON:,}, 100 runs, m ∈ {{{', '.join(_window_title(m) for m in SWEEP)}}}.",
    claim="The censored lower bound grows as τ_m shrinks: a shorter window makes the problem harder (Theorem 3 "
    "with Lemma 15, corrected as docs/reproductions.md says). The checks quote the pseudo-regret form Σ Δ_k/d(τ_mθ_k, "
    "τ_mθ*)·log T; at low rates its τ_m-weighted form, Theorem 3's, barely moves with m.",
    runs=100,
    panels=_sweep_panels,
    references={},
    reference_source="none: the paper states the bound, not numbers",
    checks=_sweep_checks,
)

# --- Criteo-like delays (ours) ----------------------------------------------------------------------------------------

CRITEO_PANEL = f"θL, Criteo-like delays, m={CRITEO_WINDOW}"


def _criteo_panels(runs: int) -> list[Panel]:
    policies = [_policy("delayed-klucb", "d-klucb"), _policy("delayed-ucb", "d-ucb"), _policy("klucb", "klucb (naive)")]
    return [_panel(CRITEO_PANEL, THETA_L, CRITEO_WINDOW, policies, runs, delay=CRITEO_DELAY)]


def _criteo_checks(results: Results) -> list[Check]:
    mean, se = paired_difference(result_of(results, CRITEO_PANEL, "d-klucb"), result_of(results, CRITEO_PANEL, "d-ucb"))
    return [Check("d-klucb below d-ucb at low rates (paper, §1)", f"difference {mean:+.1f} ± {se:.1f}", mean < -2 * se)]


CRITEO = Reproduction(
    name="vernade2017-criteo",
    paper=PAPER,
    figure="Criteo-like delay mixture (Vernade et al. 2017; no figure in the paper)",
    setting=f"θL, T = {HORIZON:,}, 100 runs; delays: fit A, 0.33·Exp(15 min) + 0.18·Exp(26 h) + 0.49·Exp(14 d) "
    f"with one round = {MINUTES_PER_ROUND} minutes (mean ≈ 500 rounds), m = 30 days = {CRITEO_WINDOW} rounds "
    f"(τ_m = {tau(CRITEO_WINDOW, CRITEO_DELAY):.3f}); the naive KL-UCB reads pending pulls as failures.",
    claim="35 % of conversions within an hour, 13 % after two weeks (Chapelle 2014): heavy-tailed, realistic "
    "delays; DelayedKLUCB is the variant to use at low rates.",
    runs=100,
    panels=_criteo_panels,
    references={},
    reference_source="none: a scenario of ours, not a figure of the paper",
    checks=_criteo_checks,
)

REPRODUCTIONS = (FIG1A, FIG1B, FIG2, FIG3, WINDOWS, CRITEO)
