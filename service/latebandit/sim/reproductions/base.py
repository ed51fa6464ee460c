"""What a paper reproduction is: panels (scenarios run at the paper's settings), the reference numbers
to print beside ours, and checks of the statements the paper makes, evaluated on our results."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from latebandit.sim.contextual import run_contextual_policy
from latebandit.sim.contextual_scenario import ContextualScenario
from latebandit.sim.runner import PolicyResult, Progress, check_runnable, contract_json, mean_and_error, run_policy
from latebandit.sim.scenario import PolicySpec, Scenario

DETERMINISTIC_TOLERANCE = 1e-6  # relative: the floor of the combined standard error
Z_LIMIT = 2.0  # docs/reproductions.md: reproduced "within about 2 standard errors"


@dataclass(frozen=True)
class Panel:
    title: str
    scenario: Scenario | ContextualScenario

    def check_runnable(self) -> None:
        """Refuse a policy that cannot run before any does (a contextual scenario was checked when built)."""
        if isinstance(self.scenario, Scenario):
            check_runnable(self.scenario)

    def run(self, spec: PolicySpec, progress: Progress | None) -> PolicyResult:
        if isinstance(self.scenario, ContextualScenario):
            return run_contextual_policy(self.scenario, spec, progress)
        return run_policy(self.scenario, spec, progress)


@dataclass(frozen=True)
class Reference:
    """Mean regret at ``rounds`` from the paper or its spec, with the standard error at the last round
    when the source gives one."""

    rounds: tuple[int, ...]
    values: tuple[float, ...]
    se: float | None = None


@dataclass(frozen=True)
class Check:
    statement: str
    observed: str
    passed: bool


Results = Mapping[str, Sequence[PolicyResult]]  # panel title → that panel's policy results, in order


@dataclass(frozen=True)
class Reproduction:
    name: str
    paper: str
    figure: str
    setting: str
    claim: str
    runs: int  # default runs: the paper's, or fewer where ``setting`` says so (to keep a reproduction near a minute)
    panels: Callable[[int], list[Panel]]  # runs → panels
    references: Mapping[str, Mapping[str, Reference]]  # panel → policy label → numbers
    reference_source: str
    checks: Callable[[Results], list[Check]]
    ratio_to: str | None = None  # plot every policy's mean regret over this one's (the paper's ratio curves)


def result_of(results: Results, panel: str, label: str) -> PolicyResult:
    return next(result for result in results[panel] if result.label == label)


def paired_difference(a: PolicyResult, b: PolicyResult) -> tuple[float, float]:
    """Mean and standard error of a − b at the horizon, run by run (both met the same world)."""
    return mean_and_error(a.final - b.final)


def standard_error(result: PolicyResult) -> float:
    return mean_and_error(result.final)[1]


def comparison(reference: Reference, result: PolicyResult) -> tuple[list[float], float]:
    """Our means at the reference's rounds, and z = (ours − reference)/combined standard error at the last
    round; a missing reference standard error is taken equal to ours (same number of runs)."""
    ours = result.at(reference.rounds).mean(axis=1)
    own_se = standard_error(result)
    other_se = own_se if reference.se is None else reference.se
    # a deterministic result (no spread, e.g. ODAAF's elimination round) must match to float precision
    combined = max(math.hypot(own_se, other_se), DETERMINISTIC_TOLERANCE * max(1.0, abs(reference.values[-1])))
    z = (ours[-1] - reference.values[-1]) / combined
    return ours.tolist(), float(z)


def reference_checks(reproduction: Reproduction, results: Results) -> list[Check]:
    """One check per reference row: our value at the last reference round within Z_LIMIT standard errors."""
    checks = []
    for panel, rows in reproduction.references.items():
        for label, reference in rows.items():
            ours, z = comparison(reference, result_of(results, panel, label))
            checks.append(
                Check(
                    f"{panel}, {label}: regret at t={reference.rounds[-1]} matches the reference "
                    f"{reference.values[-1]:g} within {Z_LIMIT:g} standard errors",
                    f"{ours[-1]:.1f} (z = {z:+.1f})",
                    abs(z) <= Z_LIMIT,
                )
            )
    return checks


def run_reproduction(
    reproduction: Reproduction,
    panels: list[Panel],
    progress: Callable[[Panel, PolicySpec], Progress | None] | None = None,
) -> tuple[dict[str, list[PolicyResult]], list[Check]]:
    """Every policy of every panel (``reproduction.panels(runs)``), and the checks on the results;
    ``progress(panel, spec)`` gives the callback for one policy's rounds."""
    for panel in panels:
        panel.check_runnable()
    results = {
        panel.title: [panel.run(spec, progress(panel, spec) if progress else None) for spec in panel.scenario.policies]
        for panel in panels
    }
    return results, reproduction.checks(results) + reference_checks(reproduction, results)


def reproduction_json(
    reproduction: Reproduction, panels: list[Panel], results: Mapping[str, list[PolicyResult]], checks: list[Check]
) -> dict[str, Any]:
    """Each panel in the simulate --json form (docs/reference/), the references beside our numbers, and the checks."""
    references: dict[str, Any] = {}
    for panel, rows in reproduction.references.items():
        for label, reference in rows.items():
            ours, z = comparison(reference, result_of(results, panel, label))
            references.setdefault(panel, {})[label] = {
                "rounds": list(reference.rounds),
                "reference": list(reference.values),
                "reference_se": reference.se,
                "ours": ours,
                "ours_se": standard_error(result_of(results, panel, label)),
                "z": z,
            }
    return {
        "reproduction": reproduction.name,
        "paper": reproduction.paper,
        "figure": reproduction.figure,
        "panels": {panel.title: contract_json(panel.scenario, results[panel.title]) for panel in panels},
        "reference_source": reproduction.reference_source,
        "references": references,
        "checks": [{"statement": c.statement, "observed": c.observed, "passed": c.passed} for c in checks],
    }


def markers(reproduction: Reproduction) -> dict[str, dict[str, tuple[Sequence[int], Sequence[float]]]]:
    """The references as plot markers."""
    return {
        panel: {label: (ref.rounds, ref.values) for label, ref in rows.items()}
        for panel, rows in reproduction.references.items()
    }
