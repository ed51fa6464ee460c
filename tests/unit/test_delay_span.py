"""The defaults a declared delay model sets: a campaign's window, patient-bandits' tail envelope."""

from __future__ import annotations

import math

import numpy as np
import pytest

from latebandit.campaign import DEFAULT_WINDOW_SECONDS, Campaign, CampaignSpec
from latebandit.delays.models import delay_from_spec
from latebandit.delays.span import envelope_scale, reach
from latebandit.delays.tail import BUCKETS, bucket_of
from latebandit.policies import make_policy
from latebandit.policies.base import Envelope, Setting
from latebandit.sim.runner import simulate
from latebandit.sim.scenario import scenario_from_mapping
from tests.unit.test_manegueu import one

MODELS = [
    {"family": "pareto", "alpha": 1.5, "scale": 60},
    {"family": "exponential", "mean": 3600},
    {"family": "geometric", "p": 0.01},
    {"family": "uniform", "low": 0, "high": 600},
    {"family": "mixture", "weights": [0.5, 0.5],
     "components": [{"family": "exponential", "mean": 60}, {"family": "pareto", "alpha": 0.8, "scale": 600}]},
]  # fmt: skip


def body(**extra: object) -> dict[str, object]:
    return {"id": "c", "arms": ["a", "b"], "policy": {"name": "patient-bandits"}, **extra}


def test_reach_is_the_tail_quantile() -> None:
    assert reach(delay_from_spec(MODELS[0])) == pytest.approx(6000.0, rel=1e-9)  # 60·1000^(1/1.5)
    assert reach(delay_from_spec(MODELS[1])) == pytest.approx(3600 * math.log(1000), rel=1e-9)
    assert reach(delay_from_spec({"family": "fixed", "value": 0})) == 0.0


def test_default_window_follows_the_delay_model_and_a_given_one_stays() -> None:
    assert CampaignSpec.model_validate(body(delay=MODELS[0])).window == 6000.0
    assert CampaignSpec.model_validate(body(delay=MODELS[1])).window == math.ceil(3600 * math.log(1000))
    assert CampaignSpec.model_validate(body()).window == DEFAULT_WINDOW_SECONDS  # no model: 30 days
    heavy = {"family": "pareto", "alpha": 0.3, "scale": 60}  # 99.9 % only after centuries
    assert CampaignSpec.model_validate(body(delay=heavy)).window == DEFAULT_WINDOW_SECONDS
    assert CampaignSpec.model_validate(body(delay=MODELS[0], window=86_400.0)).window == 86_400.0
    stored = Campaign(**CampaignSpec.model_validate(body(delay=MODELS[0], window=3600.0)).model_dump())
    assert Campaign.model_validate_json(stored.model_dump_json()).window == 3600.0


def test_a_bad_delay_is_still_reported_as_such() -> None:
    with pytest.raises(ValueError, match="pareto delay: alpha"):
        CampaignSpec.model_validate(body(delay={"family": "pareto", "alpha": -1, "scale": 60}))


@pytest.mark.parametrize("spec", MODELS)
@pytest.mark.parametrize("alpha", [0.3, 0.5, 1.5])
def test_envelope_scale_is_the_smallest_that_bounds_the_tail(spec: dict[str, object], alpha: float) -> None:
    """ψ at the derived scale lies above the model's survival at every age up to its reach, and ψ at a
    scale 1 % smaller does not (checked here on a grid 10x finer than the derivation's)."""
    model = delay_from_spec(spec)
    up_to = reach(model)
    scale = envelope_scale(model, alpha, up_to)
    ages = np.geomspace(up_to * 1e-6, up_to, 40_000)
    survival = 1.0 - model.cdf(ages)
    envelope = Envelope(np.array([alpha]), scale).weights(ages[None, :])[0]
    assert (envelope >= survival - 1e-12).all()
    tighter = Envelope(np.array([alpha]), 0.99 * scale).weights(ages[None, :])[0]
    assert (tighter < survival).any()


def test_patient_policies_take_their_envelope_from_the_declared_delay() -> None:
    pareto = Setting(None, (delay_from_spec(MODELS[0]),) * 2, seconds=True)
    params = make_policy("patient-bandits", {}, 2, pareto).params()
    assert params["alpha"] == 1.5 and params["scale"] == pytest.approx(60.0, rel=0.005)
    assert make_policy("patient-bandits", {"scale": 5.0}, 2, pareto).params()["scale"] == 5.0
    unknown = Setting(None, (delay_from_spec({"family": "unknown"}),) * 2, seconds=True)
    for setting in (None, unknown):  # no model: the fixed defaults
        assert {key: make_policy("patient-bandits", {}, 2, setting).params()[key] for key in ("alpha", "scale")} == {
            "alpha": 0.5,
            "scale": 3600.0,
        }
    exponential = Setting(None, (delay_from_spec(MODELS[1]),) * 2, seconds=True)
    derived = make_policy("patient-bandits", {}, 2, exponential).params()  # least area up to the mean delay
    assert derived["alpha"] == 0.5 and derived["scale"] == pytest.approx(3600 * 0.5 / math.e, rel=0.005)
    alone = make_policy("patient-bandits", {"alpha": 1.5}, 2, exponential).params()
    assert alone["alpha"] == 1.5 and alone["scale"] == pytest.approx(3600 * 1.5 / math.e, rel=0.005)
    adaptive = make_policy("adapt-patient-bandits", {}, 2, exponential)  # α_t at most the model's 0.5
    assert adaptive.alpha_cap == 0.5 and adaptive.params()["scale"] == pytest.approx(3600 / (2 * math.e), rel=0.005)
    assert make_policy("adapt-patient-bandits", {}, 2, pareto).alpha_cap == 1.0  # 1.5 fitted, capped at 1


def test_adapt_patient_bandits_simulates_at_its_defaults() -> None:
    """Age-aware (its default) in the simulator; it used to stop the run with a ScenarioError."""
    scenario = scenario_from_mapping(
        {"horizon": 400, "runs": 2, "seed": 1, "arms": [0.5, 0.3], "delay": {"family": "geometric", "p": 0.05},
         "policies": [{"name": "adapt-patient-bandits"}]}
    )  # fmt: skip
    (result,) = simulate(scenario)
    assert np.isfinite(result.final).all()


def test_adapt_patient_bandits_never_goes_past_the_declared_models_envelope() -> None:
    """Light-tailed observed delays (α̂ near 3) move α_t up to the declared exponential's 0.5, not to 1."""
    rng = np.random.default_rng(5)
    light = np.bincount(bucket_of(10.0 * (1.0 + rng.pareto(3.0, 50_000))), minlength=BUCKETS)
    stats = one([10, 10], [1, 1], delay_counts=np.stack([light, light])[None])
    exponential = Setting(None, (delay_from_spec(MODELS[1]),) * 2, seconds=True)
    assert make_policy("adapt-patient-bandits", {}, 2, exponential).alpha(stats)[0] == 0.5
    assert make_policy("adapt-patient-bandits", {}, 2).alpha(stats)[0] == 1.0
