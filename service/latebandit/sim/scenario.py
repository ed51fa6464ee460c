"""Scenario files (docs/reference/scenarios.md): loading, validation and the normalised form.

Every mistake in a file becomes a ScenarioError whose message names the field, because the CLI shows it
to the user as is (exit code 2) instead of a traceback. Time is in rounds: one decision per round,
delays and ``window`` in rounds.
"""

from __future__ import annotations

import itertools
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from latebandit.delays.facts import FACT_PARAMS, delay_fact, with_delay_facts
from latebandit.delays.models import DelayModel, delay_from_spec
from latebandit.policies import POLICIES, Policy, SchedulePolicy, Setting, make_policy, takes_new_arms
from latebandit.policies.floor import check_floor
from latebandit.sim.rewards import Revenue, RewardError, reward_spec, value_arm

REWARDS = ("bernoulli", "bounded")
FEEDBACKS = ("attributed", "anonymous", "composite")
# What a policy is shown (service/latebandit/sim/feeds.py). None in a spec means the policy's own: "resolution" for a
# policy that reads pending pulls (qpm-d), "delayed" for a delay-corrected policy, "naive" otherwise.
FEEDS = ("naive", "delayed", "discarding", "discarding-literal", "plugin", "resolution")
KEYS = {
    "horizon", "runs", "seed", "arms", "reward", "delay", "window", "feedback", "spread", "policies", "checkpoints",
    "prior", "arrivals",
}  # fmt: skip
POLICY_KEYS = {"name", "params", "label", "feed", "exploration_floor"}
MAX_LABEL = 64
MAX_SPREAD = 10_000  # parts of a composite reward (each round's pulls schedule all of them)
SPREAD_SUM_TOLERANCE = 1e-6


class ScenarioError(ValueError):
    """A scenario that cannot run, with a message meant for the user."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(value: object, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ScenarioError(f"{where} must be an integer >= {minimum} (got {_show(value)})")
    return int(value)


def _probability(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise ScenarioError(f"{where} must be a number in [0, 1] (got {_show(value)})")
    return float(value)


def _choice(value: object, where: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ScenarioError(f"{where} must be one of {', '.join(allowed)} (got {_show(value)})")
    return str(value)


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where} must be an object (got {_show(value)})")
    unknown = sorted(str(key) for key in value if not isinstance(key, str))
    if unknown:
        raise ScenarioError(f"{where} has a non-string key {unknown[0]!r}")
    return value


def _list(value: object, where: str) -> Sequence[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
        raise ScenarioError(f"{where} must be a non-empty list (got {_show(value)})")
    return value


def _no_extra(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise ScenarioError(f"{where}: unknown field {extra[0]!r}; fields: {', '.join(sorted(allowed))}")


@dataclass(frozen=True)
class Feed:
    """Which statistics a policy is shown; ``gamma`` is App. D's step exponent (uncensored plug-in)."""

    kind: str | None = None
    gamma: float | None = None

    def to_json(self) -> str | dict[str, Any] | None:
        return self.kind if self.gamma is None else {"kind": self.kind, "gamma": self.gamma}


@dataclass(frozen=True)
class PolicySpec:
    name: str
    params: Mapping[str, Any]
    label: str
    feed: Feed = field(default_factory=Feed)
    exploration_floor: float = 0.0  # as the campaign option (service/latebandit/policies/floor.py)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "params": dict(self.params), "label": self.label}
        if self.feed.kind is not None:
            out["feed"] = self.feed.to_json()
        if self.exploration_floor:
            out["exploration_floor"] = self.exploration_floor
        return out


@dataclass(frozen=True)
class Scenario:
    """A validated scenario. ``delays`` has one model per arm (the same object when one was given)."""

    horizon: int
    runs: int
    seed: int
    arms: tuple[float, ...]
    reward: str
    delays: tuple[DelayModel, ...]
    shared_delay: bool
    window: int | None
    feedback: str
    spread: tuple[float, ...]  # the fraction of a composite reward paid in each of its consecutive rounds
    policies: tuple[PolicySpec, ...]
    checkpoints: tuple[int, ...]
    prior: tuple[float, float] | None = None  # Beta(a, b): each run draws its own arm means from it
    arrivals: tuple[int, ...] = ()  # per arm, the first round it can be chosen; () when every arm is there from 1
    revenue: Revenue | None = None  # the campaign field reward and each arm's value distribution; arms: p

    @property
    def n_arms(self) -> int:
        return len(self.arms)

    def arm_sets(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """(first round, the arms present from then on) for round 1 and each round an arm arrives."""
        return arm_sets(self.arrivals, self.n_arms)

    @property
    def setting(self) -> Setting:
        return Setting(self.horizon, self.delays, seconds=False)

    def with_overrides(self, runs: int | None = None, seed: int | None = None) -> Scenario:
        """The same scenario with the CLI's --runs / --seed applied."""
        return replace(self, runs=self.runs if runs is None else runs, seed=self.seed if seed is None else seed)

    def to_json(self) -> dict[str, Any]:
        """The normalised scenario (defaults filled in); loading it again gives an equal scenario."""
        delay: Any = self.delays[0].to_spec() if self.shared_delay else [d.to_spec() for d in self.delays]
        out: dict[str, Any] = {
            "horizon": self.horizon,
            "runs": self.runs,
            "seed": self.seed,
            "arms": list(self.arms) if self.revenue is None else self.revenue.arms_json(),
            "reward": self.reward if self.revenue is None else self.revenue.to_json(),
            "delay": delay,
            "window": self.window,
            "feedback": self.feedback,
            "policies": [policy.to_json() for policy in self.policies],
            "checkpoints": list(self.checkpoints),
        }
        if self.feedback == "composite":
            equal = all(part == 1.0 / len(self.spread) for part in self.spread)
            out["spread"] = len(self.spread) if equal else list(self.spread)
        if self.prior is not None:
            out["prior"] = {"a": self.prior[0], "b": self.prior[1]}
        if self.arrivals:
            out["arrivals"] = {str(arm): first for arm, first in enumerate(self.arrivals) if first > 1}
        return out


def arm_sets(arrivals: Sequence[int], n_arms: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(first round, the arms present from then on) for round 1 and each later round an arm arrives;
    ``arrivals`` () means every arm from round 1."""
    firsts = arrivals or (1,) * n_arms
    return tuple((first, tuple(k for k in range(n_arms) if firsts[k] <= first)) for first in sorted(set(firsts)))


def _arrivals(value: object, n_arms: int, horizon: int) -> tuple[int, ...]:
    """Our extension: ``{"<arm index>": round}``, the first round each listed arm can be chosen (1: from the
    start, the default). Until then the policies play the arms present (module sim/arrivals.py)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping) or not value:
        raise ScenarioError(f"arrivals must be a non-empty object {{arm index: round}} (got {_show(value)})")
    firsts = [1] * n_arms
    named: set[int] = set()
    for key, first in value.items():
        text = str(key)
        if isinstance(key, bool) or not text.isdigit() or int(text) >= n_arms:
            raise ScenarioError(f"arrivals: no arm {key!r}; arms are named by their index in arms, 0 to {n_arms - 1}")
        if int(text) in named:
            raise ScenarioError(f"arrivals names arm {text} twice")
        named.add(int(text))
        firsts[int(text)] = _integer(first, f"arrivals[{text!r}]", 1)
        if firsts[int(text)] > horizon:
            raise ScenarioError(f"arrivals[{text!r}] must be a round within the horizon {horizon} (got {first})")
    if min(firsts) > 1:
        raise ScenarioError("arrivals: at least one arm must be present from round 1")
    return () if max(firsts) == 1 else tuple(firsts)


def _delays(value: object, n_arms: int) -> tuple[tuple[DelayModel, ...], bool]:
    shared = isinstance(value, Mapping)
    specs = [value] if shared else _list(value, "delay")
    if not shared and len(specs) != n_arms:
        raise ScenarioError(f"delay: a list needs one delay per arm ({n_arms}), got {len(specs)}")
    models = []
    for i, spec in enumerate(specs):
        where = "delay" if shared else f"delay[{i}]"
        try:
            model = delay_from_spec(spec)
        except ValueError as error:
            raise ScenarioError(f"{where}: {error}") from error
        if model.family == "unknown":
            raise ScenarioError(f"{where}: the simulator draws delays, so it needs a delay family, not 'unknown'")
        models.append(model)
    return (tuple(models) * n_arms if shared else tuple(models)), shared


def _feed(value: object, where: str) -> Feed:
    if value is None or isinstance(value, str):
        return Feed(None if value is None else _choice(value, where, FEEDS))
    data = _mapping(value, where)
    _no_extra(data, {"kind", "gamma"}, where)
    kind = _choice(data.get("kind"), f"{where}.kind", FEEDS)
    if "gamma" not in data:
        return Feed(kind)
    gamma = data["gamma"]
    if kind != "plugin" or isinstance(gamma, bool) or not isinstance(gamma, numbers.Real):
        raise ScenarioError(f"{where}.gamma is the step exponent of feed 'plugin', a number in [0.5, 1]")
    if not 0.5 <= float(gamma) <= 1.0:
        raise ScenarioError(f"{where}.gamma must be in [0.5, 1] (Vernade et al. 2017, App. D; got {_show(gamma)})")
    return Feed(kind, float(gamma))


def _check_feed(feed: Feed, policy: Policy, scenario: Mapping[str, Any], where: str) -> None:
    """Refuse feeds that would silently change nothing or have no meaning in this scenario."""
    if policy.needs_pending or feed.kind == "resolution":
        if feed.kind not in (None, "resolution") or not policy.needs_pending:
            raise ScenarioError(
                f"{where}: feed 'resolution' (pending pulls) is the feed of qpm-d, and qpm-d needs it; "
                f"got feed {feed.kind!r} for policy {policy.name!r}"
            )
        return
    if feed.kind in (None, "naive"):
        return
    if not policy.delay_corrected:
        raise ScenarioError(
            f"{where}: feed {feed.kind!r} changes the count a delay-corrected policy divides by; this policy is "
            "delay-naive (it divides by raw pulls), so use delayed-ucb or delayed-klucb"
        )
    censored = scenario["window"] is not None
    if feed.kind.startswith("discarding") and not censored:
        raise ScenarioError(f"{where}: feed {feed.kind!r} keeps only pulls older than the window; set a window")
    if feed.kind == "plugin":
        if not scenario["shared_delay"]:
            raise ScenarioError(f"{where}: feed 'plugin' pools the delays of all arms; it needs one shared delay")
        if censored and feed.gamma is not None:
            raise ScenarioError(f"{where}: gamma is for the uncensored plug-in (no window); the censored one counts")


def scenario_policy(name: object, params: Mapping[str, Any], delays: Sequence[DelayModel], horizon: int) -> Policy:
    """The policy of a scenario entry. A policy playing planned segments gets, unless its params say
    otherwise, the scenario's horizon and the delay facts it needs (in rounds) from the delay model; with one
    delay per arm, the largest fact over the arms (the papers assume one delay for all arms, and an upper
    bound is allowed by their assumptions A1–A3)."""
    cls = POLICIES.get(name) if isinstance(name, str) else None
    setting = Setting(horizon, tuple(delays), seconds=False)
    if cls is None or not issubclass(cls, SchedulePolicy):
        return make_policy(name, params, len(delays), setting)
    filled = cls.declared_defaults({"horizon": horizon, **params}, delays, 1.0)
    for param, fact in FACT_PARAMS.items():
        largest = max(delay_fact(model, fact) for model in delays)
        if param in cls.PARAMS and filled.get(param) is None and math.isfinite(largest):
            filled[param] = largest
    return make_policy(name, with_delay_facts(str(name), cls.PARAMS, filled, delays[0], 1.0), len(delays), setting)


def policy_on_arms(
    name: str, params: Mapping[str, Any], delays: Sequence[DelayModel], horizon: int, arms: Sequence[int]
) -> Policy:
    """The policy over the arms present, its arm j being ``arms[j]``: built for their delays, as the service
    builds a campaign's policy over its active arms (Campaign.policy_impl), with fixed's ``arm`` counted among
    them as the service maps the arm it names."""
    chosen = params.get("arm")
    if name == "fixed" and isinstance(chosen, int) and not isinstance(chosen, bool) and 0 <= chosen < len(delays):
        if chosen not in arms:
            raise ValueError(f"policy 'fixed' plays arm {chosen}, which is not present yet")
        params = {**params, "arm": list(arms).index(chosen)}
    return scenario_policy(name, params, [delays[k] for k in arms], horizon)


def _check_arrivals(policy: Policy, params: Mapping[str, Any], scenario: Mapping[str, Any], where: str) -> None:
    """A policy meeting arms that arrive must take them as the service's policies take an added arm, and be
    buildable over every set of arms present."""
    if not takes_new_arms(policy):
        raise ScenarioError(
            f"{where}: policy {policy.name!r} plays a schedule or a plan over its arms, so it cannot take an arm "
            "that arrives during the run (the service refuses it an added arm without a restart, which starts a "
            "fresh state); use an index or Bayesian policy, or drop arrivals"
        )
    if policy.needs_band():
        raise ScenarioError(f"{where}: the band estimator (estimator 0) answers queries over every arm; with arrivals "
                            "use estimator 1")  # fmt: skip
    for first, arms in arm_sets(scenario["arrivals"], len(scenario["delays"]))[:-1]:
        try:
            policy_on_arms(policy.name, params, scenario["delays"], scenario["horizon"], arms)
        except ValueError as error:
            raise ScenarioError(f"{where}: with arms {list(arms)} present from round {first}: {error}") from error


def _policies(value: object, scenario: Mapping[str, Any]) -> tuple[PolicySpec, ...]:
    specs = []
    for i, entry in enumerate(_list(value, "policies")):
        where = f"policies[{i}]"
        data = _mapping(entry, where)
        _no_extra(data, POLICY_KEYS, where)
        name, params = data.get("name"), data.get("params", {})
        try:
            policy = scenario_policy(name, _mapping(params, f"{where}.params"), scenario["delays"], scenario["horizon"])
        except ValueError as error:
            raise ScenarioError(f"{where}: {error}") from error
        label = data.get("label", name)
        if not isinstance(label, str) or not 0 < len(label) <= MAX_LABEL:
            raise ScenarioError(f"{where}.label must be a string of 1 to {MAX_LABEL} characters")
        if scenario["arrivals"]:
            _check_arrivals(policy, _mapping(params, f"{where}.params"), scenario, where)
        feed = _feed(data.get("feed"), f"{where}.feed")
        _check_feed(feed, policy, scenario, where)
        floor = _probability(data.get("exploration_floor", 0.0), f"{where}.exploration_floor")
        try:
            check_floor(policy, floor)
        except ValueError as error:
            raise ScenarioError(f"{where}: {error}") from error
        specs.append(PolicySpec(policy.name, dict(params), label, feed, floor))  # the name, known to be valid
    labels = [spec.label for spec in specs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ScenarioError(f"policies: label {repeated[0]!r} is used twice; give each entry its own 'label'")
    return tuple(specs)


def _prior(value: object, arms: tuple[float, ...]) -> tuple[float, float] | None:
    """Our extension: ``{"a": a, "b": b}`` draws every run's arm means from Beta(a, b), for Bayesian regret
    averaged over the prior. ``arms`` keeps its meaning, each arm's mean (here: in expectation over runs),
    so every entry must equal a/(a + b)."""
    if value is None:
        return None
    data = _mapping(value, "prior")
    _no_extra(data, {"a", "b"}, "prior")
    a, b = (_prior_parameter(data.get(key), key) for key in ("a", "b"))
    mean = a / (a + b)
    if any(abs(arm - mean) > 1e-9 for arm in arms):
        raise ScenarioError(f"with a prior, every entry of arms is the prior mean a/(a + b) = {mean:g}")
    return a, b


def _prior_parameter(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < 1e6:
        raise ScenarioError(f"prior.{key} must be a number in (0, 1e6) (got {_show(value)})")
    return float(value)


def _spread(value: object) -> tuple[float, ...]:
    """An integer n (equal parts over n rounds) or the list of the parts' fractions, summing to 1 (a shape
    of Wang et al. 2021, Figs. 2–4, e.g. linearly decreasing; an infinite shape is given truncated)."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        count = _integer(value, "spread", 1)
        return (1.0 / count,) * count
    parts = _list(value, "spread")
    if len(parts) > MAX_SPREAD:
        raise ScenarioError(f"spread lists at most {MAX_SPREAD} parts (got {len(parts)})")
    fractions = []
    for i, part in enumerate(parts):
        if isinstance(part, bool) or not isinstance(part, numbers.Real) or not 0.0 <= float(part) <= 1.0:
            raise ScenarioError(f"spread[{i}] must be a number in [0, 1] (got {_show(part)})")
        fractions.append(float(part))
    if abs(sum(fractions) - 1.0) > SPREAD_SUM_TOLERANCE:
        raise ScenarioError(f"spread: the parts' fractions must sum to 1 (got {sum(fractions):.6g})")
    return tuple(fractions)


def _checkpoints(value: object, horizon: int) -> tuple[int, ...]:
    points = [_integer(point, f"checkpoints[{i}]", 1) for i, point in enumerate(_list(value, "checkpoints"))]
    if any(b <= a for a, b in itertools.pairwise(points)) or points[-1] > horizon:
        raise ScenarioError(f"checkpoints must increase strictly and stay within the horizon {horizon}")
    return tuple(points)


def scenario_from_mapping(data: object) -> Scenario:
    """Validate a parsed scenario document (defaults: runs 100, seed 0, bernoulli, attributed, no window)."""
    data = _mapping(data, "the scenario")
    _no_extra(data, KEYS, "the scenario")
    for key in ("horizon", "arms", "delay", "policies"):
        if key not in data:
            raise ScenarioError(f"the scenario needs the {key!r} field")
    horizon = _integer(data["horizon"], "horizon", 1)
    revenue = _revenue(data.get("reward"), _list(data["arms"], "arms"))
    if revenue is None:
        arms = tuple(_probability(mean, f"arms[{i}]") for i, mean in enumerate(data["arms"]))
    else:
        arms = tuple(arm.converts for arm in revenue.arms)
    if len(arms) < 2:
        raise ScenarioError("arms must list at least two means")
    delays, shared = _delays(data["delay"], len(arms))
    window = data.get("window")
    window = None if window is None else _integer(window, "window", 0)
    feedback = _choice(data.get("feedback", "attributed"), "feedback", FEEDBACKS)
    if "spread" in data and feedback != "composite":
        raise ScenarioError("spread is only used with feedback 'composite'")
    spread = _spread(data.get("spread")) if feedback == "composite" else (1.0,)
    arrivals = _arrivals(data.get("arrivals"), len(arms), horizon)
    context = {
        "arms": arms, "window": window, "shared_delay": shared, "delays": delays, "horizon": horizon,
        "arrivals": arrivals,
    }  # fmt: skip
    return Scenario(
        horizon=horizon,
        runs=_integer(data.get("runs", 100), "runs", 1),
        seed=_integer(data.get("seed", 0), "seed", 0),
        arms=arms,
        reward="bernoulli" if revenue else _choice(data.get("reward", "bernoulli"), "reward", REWARDS),
        delays=delays,
        shared_delay=shared,
        window=window,
        feedback=feedback,
        spread=spread,
        policies=_policies(data["policies"], context),
        checkpoints=_checkpoints(data.get("checkpoints", [horizon]), horizon),
        prior=_prior(data.get("prior"), arms),
        arrivals=arrivals,
        revenue=revenue,
    )


def _revenue(reward: object, arms: Sequence[Any]) -> Revenue | None:
    """Our extension (service/latebandit/sim/rewards.py): ``reward`` as the campaign field, {"max", "per_decision"},
    and arms that are value distributions; None for the Bernoulli and bounded worlds of a ``reward`` name."""
    try:
        if not isinstance(reward, Mapping):
            for i, arm in enumerate(arms):
                if isinstance(arm, Mapping):
                    value_arm(arm, f"arms[{i}]", None)
            return None
        spec = reward_spec(reward)
        return Revenue(spec, tuple(value_arm(arm, f"arms[{i}]", spec) for i, arm in enumerate(arms)))
    except RewardError as error:
        raise ScenarioError(str(error)) from error


def read_scenario_document(path: Path) -> Any:
    """The parsed .json, .yaml or .yml file; every failure is a ScenarioError naming the file."""
    suffix = path.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise ScenarioError(f"{path}: a scenario file ends in .json, .yaml or .yml")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError(f"{path}: cannot read it ({error})") from error
    try:
        return json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise ScenarioError(f"{path}: not valid {'JSON' if suffix == '.json' else 'YAML'} ({error})") from error


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file; every failure is a ScenarioError naming the file."""
    data = read_scenario_document(path)
    try:
        return scenario_from_mapping(data)
    except ScenarioError as error:
        raise ScenarioError(f"{path}: {error}") from error
