"""A campaign: its arms, policy, delay model and censoring window, validated once at creation.

The body POST /campaigns takes; ``buckets`` (optional, ours) sets how finely the histogram of recent pulls
divides the window, which bounds the error of the effective count Ñ (see engine/exposure.py).

The default window follows the declared delay model: the age by which all but 0.1 % of its conversions have
arrived (delays/span.py), at most 30 days, and 30 days without a model. A fixed 30 days cut every
histogram cell 11.25 hours wide, so a campaign whose conversions take minutes saw every recent pull in one
cell: the age-aware policies (patient-bandits' bias term, Ñ) read each cell at its youngest edge and took
every pull for fresh, qpm-d kept a pull pending for 30 days. Cells of window/64 of the model's reach keep
the decision cost (arms × buckets) and the Redis layout; a stored campaign keeps the window it was given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from latebandit.delays.facts import with_delay_facts
from latebandit.delays.models import DelayModel, delay_from_spec
from latebandit.delays.span import reach
from latebandit.ids import Identifier
from latebandit.policies import (
    CONTEXTUAL_POLICIES,
    POLICIES,
    ArmStats,
    ContextualPolicy,
    Policy,
    SchedulePolicy,
    Setting,
    make_contextual_policy,
    make_policy,
    takes_new_arms,
)
from latebandit.policies.floor import check_floor
from latebandit.timeutil import MICROS, format_time

DEFAULT_WINDOW_SECONDS = 30 * 86_400.0
DEFAULT_BUCKETS = 64
MAX_ARMS = 256
MIN_WINDOW_SECONDS = 1.0
MAX_WINDOW_SECONDS = 10 * 365 * 86_400.0
MAX_EXACT_DECAY = 30.0
DEFAULT_LATENESS_SECONDS = 3600.0
# The largest reward of one decision on a campaign whose policy learns from attributed conversions: S, at most
# max·pulls with pulls < 2^63, stays below 1e220, far inside float range (a planning campaign's sums are
# bounded by store/schedule.py's CREDIT_LIMIT instead, so its ``max`` may be any finite number).
MAX_ATTRIBUTED_REWARD = 1e200
MAX_FEATURES = 256
# The one model block (arm index 0: its counters and histogram cells) of a contextual campaign whose requests
# offer their own actions: one parameter θ shared by every action, so no arm of the user's.
ACTIONS_BLOCK = "actions"
# The correction forms a service can afford: ``exact`` reads every pending vector at each decision and ``cs``
# keeps Σ AAᵀ per window bucket (docs/algorithms/linear.md); both are the simulator's.
SERVED_CORRECTIONS = ("frozen", "none", "released")


class CampaignStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    ARCHIVED = "archived"  # ended: no decisions, late feedback until ``feedback_until``, then its state goes


class RewardSpec(BaseModel):
    """How a decision's conversions make its reward: ``max`` is the most one decision earns (value units); with
    ``first`` its first conversion's value counts (at max 1, a Bernoulli reward), with ``sum`` the values of
    its conversions add up, capped at ``max``. Policies learn on value / max, in [0, 1]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max: float = Field(default=1.0, gt=0.0, allow_inf_nan=False, description="the largest reward of one decision")
    per_decision: Literal["first", "sum"] = "first"

    @property
    def sums(self) -> bool:
        return self.per_decision == "sum"

    def credit(self, value: float, credited: float) -> float:
        """What a later conversion of ``value`` adds to a decision already credited ``credited``: never
        negative, never past ``max`` (``max - credited`` may round below 0 once the cap is reached)."""
        return max(0.0, min(value, self.max - credited))


class PolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


def build_policy(
    spec: PolicySpec, arms: list[str], delay: DelayModel, seconds_per_slot: float | None, rate: float | None = None
) -> Policy:
    """The policy object; a ``fixed`` policy may name its arm by id, policies see arm indices; a planning
    policy gets the delay facts it needs from the delay model, in slots, unless its params give them; a
    policy that counts in decisions (guha-bayes) gets the campaign's declared decision ``rate`` unless its
    params give one. The service knows no horizon (guha-bayes plans over its rolling window) and counts
    delays in seconds."""
    params = dict(spec.params)
    if rate is not None and "decisions_per_second" in POLICIES[spec.name].PARAMS:
        params.setdefault("decisions_per_second", rate)
    if spec.name == "fixed" and isinstance(params.get("arm"), str):
        if params["arm"] not in arms:
            raise ValueError(f"policy param arm {params['arm']!r} is not one of the arms")
        params["arm"] = arms.index(params["arm"])
    cls = POLICIES[spec.name]
    delays = () if delay.family == "unknown" else (delay,) * len(arms)
    if issubclass(cls, SchedulePolicy):
        params = cls.declared_defaults(params, delays, seconds_per_slot)
        params = with_delay_facts(spec.name, cls.PARAMS, params, delay, seconds_per_slot)
    return make_policy(spec.name, params, len(arms), Setting(None, delays, seconds=True))


def default_window(delay: DelayModel) -> float:
    """The window a campaign gets when its body sets none (module docstring)."""
    if delay.family == "unknown":
        return DEFAULT_WINDOW_SECONDS
    return min(DEFAULT_WINDOW_SECONDS, max(MIN_WINDOW_SECONDS, float(math.ceil(reach(delay)))))


class CampaignSpec(BaseModel):
    """What a user sends to ``POST /campaigns``."""

    model_config = ConfigDict(extra="forbid")

    id: Identifier
    arms: list[Identifier] = Field(min_length=1, max_length=MAX_ARMS)
    policy: PolicySpec
    delay: dict[str, Any] = Field(default_factory=lambda: {"family": "unknown"})
    window: float = Field(
        default=DEFAULT_WINDOW_SECONDS,
        ge=MIN_WINDOW_SECONDS,
        le=MAX_WINDOW_SECONDS,
        strict=True,
        description="censoring window m in seconds (default: the delay model's 99.9 % reach, at most 30 days)",
    )
    default_arm: Identifier | None = None
    buckets: int = Field(default=DEFAULT_BUCKETS, ge=4, le=1024)
    exploration_floor: float = Field(
        default=0.0, ge=0.0, le=1.0, description="minimum propensity of every arm (0: off), at most 1/#arms"
    )
    slot_seconds: float | None = Field(
        default=None, gt=0, le=MAX_WINDOW_SECONDS, description="planning policies: wall-clock slots of this length"
    )
    decisions_per_second: float | None = Field(
        default=None, gt=0, le=1e9, description="planning policies: the peak decision rate, to turn delays into slots"
    )
    allowed_lateness: float = Field(
        default=DEFAULT_LATENESS_SECONDS, ge=0, le=MAX_WINDOW_SECONDS,
        description="planning policies: how long after a segment's end its feedback is taken as complete; every "
        "campaign: how long after its window an archived campaign still records conversions",
    )  # fmt: skip
    reward: RewardSpec = Field(default_factory=RewardSpec)
    features: int | None = Field(
        default=None, ge=1, le=MAX_FEATURES, strict=True,
        description="contextual policies: the dimension d of every feature vector",
    )  # fmt: skip
    log_actions: bool = Field(
        default=False, description="contextual campaigns: log every offered action (what replay --policy needs)"
    )
    offers: Literal["actions", "context"] | None = Field(
        default=None,
        description="contextual campaigns, set from the body: 'actions' when each request offers its own actions "
        "(no arms given), 'context' when a request's context is every arm's features",
    )

    @model_validator(mode="before")
    @classmethod
    def _contextual_form(cls, data: Any) -> Any:
        """A contextual policy's body without ``arms`` is the actions form: its one model block stands as the
        arm ACTIONS_BLOCK (counters and cells name it), which its answers never show."""
        if not isinstance(data, dict) or "offers" in data:
            return data
        policy = data.get("policy")
        if not isinstance(policy, dict) or not isinstance(name := policy.get("name"), str):
            return data  # left to the checks after, which name what is wrong
        if name not in CONTEXTUAL_POLICIES:
            return data
        if "arms" not in data:
            return {**data, "arms": [ACTIONS_BLOCK], "offers": "actions"}
        return {**data, "offers": "context"}

    @model_validator(mode="before")
    @classmethod
    def _reward_cap(cls, data: Any) -> Any:
        """An anonymous policy's ``reward_cap`` param is the old name of ``reward.max``: either gives both
        (the policy divides by its param), and both given and different is an error. Left to the checks
        after when the body's parts are not what they should be."""
        if not isinstance(data, dict) or not isinstance(policy := data.get("policy"), dict):
            return data
        name, params, reward = policy.get("name"), policy.get("params", {}), data.get("reward", {})
        if not isinstance(name, str) or name not in POLICIES or "reward_cap" not in POLICIES[name].PARAMS:
            return data
        if not isinstance(params, dict) or not isinstance(reward, dict):
            return data
        cap, most = params.get("reward_cap"), reward.get("max")
        if cap is not None and most is not None and cap != most:
            raise ValueError(f"reward.max ({most!r}) and policy param reward_cap, its old name, ({cap!r}) differ")
        if most is not None:
            return {**data, "policy": {**policy, "params": {**params, "reward_cap": most}}}
        if cap is not None:
            return {**data, "reward": {**reward, "max": cap}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _default_window(cls, data: Any) -> Any:
        """A body without ``window`` gets the declared delay model's (module docstring); a delay spec that
        does not parse is left to the checks after (they name its error)."""
        if not isinstance(data, dict) or "window" in data:
            return data
        try:
            model = delay_from_spec(data.get("delay", {"family": "unknown"}))
        except (ValueError, ArithmeticError):
            return data
        return {**data, "window": default_window(model)}

    @model_validator(mode="after")
    def _consistent(self) -> CampaignSpec:
        if len(set(self.arms)) != len(self.arms):
            raise ValueError("arms must be distinct")
        if self.default_arm is None:
            self.default_arm = self.arms[0]
        elif self.default_arm not in self.arms:
            raise ValueError(f"default_arm {self.default_arm!r} is not one of the arms")
        try:
            model = delay_from_spec(self.delay)
        except ArithmeticError as error:  # e.g. mixture weights whose sum overflows
            raise ValueError(f"delay: {error}") from error
        if self.policy.name in CONTEXTUAL_POLICIES or self.offers is not None:
            self._check_contextual()
            return self
        if self.features is not None:
            raise ValueError(f"features: policy {self.policy.name!r} is not contextual; contextual policies: "
                             f"{', '.join(CONTEXTUAL_POLICIES)}")  # fmt: skip
        if self.policy.name not in POLICIES:
            known = sorted([*POLICIES, *CONTEXTUAL_POLICIES])
            raise ValueError(f"unknown policy {self.policy.name!r}; known: {', '.join(known)}")
        policy = build_policy(self.policy, self.arms, model, self.seconds_per_slot, self.decisions_per_second)
        check_floor(policy, self.exploration_floor)
        new = type(self) is CampaignSpec  # a request; a stored campaign made before a refusal rule still loads
        if new and isinstance(policy, SchedulePolicy) and (reason := policy.cannot_learn()) is not None:
            raise ValueError(reason)
        if policy.needs_band():
            raise ValueError(
                f"policy {self.policy.name!r} with estimator 0 (the paper's band estimator) needs per-pull delays "
                "by round age, which only the simulator keeps; the service supports estimator 1 (the default)"
            )
        self._check_reward(policy)
        if POLICIES[self.policy.name].delay_corrected:
            if model.family == "unknown":
                raise ValueError(f"policy {self.policy.name!r} needs a delay CDF; give a delay model")
            if float(model.cdf(self.window)) <= 0.0:
                raise ValueError("the delay model puts no conversion inside the window: none could ever count")
        return self

    def _check_contextual(self) -> None:
        """A contextual campaign: its policy, dimension and the forms the service serves."""
        if self.policy.name not in CONTEXTUAL_POLICIES:
            raise ValueError(f"a contextual campaign's policy is one of {', '.join(CONTEXTUAL_POLICIES)}")
        if self.features is None:
            raise ValueError(f'policy {self.policy.name!r} is contextual: give "features", the dimension d')
        if self.offers == "actions" and self.arms != [ACTIONS_BLOCK]:
            raise ValueError("offers 'actions': the requests offer the actions, so the campaign has no arms")
        policy = make_contextual_policy(self.policy.name, self.policy.params)
        correction = policy.params().get("correction", "frozen")
        if correction not in SERVED_CORRECTIONS:
            raise ValueError(
                f"correction {correction!r} is the simulator's (every decision would read each pending vector, or "
                f"keep Σ AAᵀ per window bucket); a campaign serves {', '.join(SERVED_CORRECTIONS)}"
            )
        if self.reward.sums:
            raise ValueError("reward.per_decision 'sum': a contextual policy's model is one conversion per decision")
        if self.reward.max > MAX_ATTRIBUTED_REWARD:
            raise ValueError(f"reward.max must be at most {MAX_ATTRIBUTED_REWARD:g}")
        if self.exploration_floor > 0:
            raise ValueError("exploration_floor: a contextual policy chooses among each request's actions, not arms")

    def _check_reward(self, policy: Policy) -> None:
        if isinstance(policy, SchedulePolicy):
            if self.reward.sums:
                raise ValueError(
                    f"reward.per_decision 'sum': policy {self.policy.name!r} learns from aggregates, which are "
                    "totals already; an attributed conversion to it is one decision's whole reward ('first')"
                )
        elif self.reward.max > MAX_ATTRIBUTED_REWARD:
            raise ValueError(f"reward.max must be at most {MAX_ATTRIBUTED_REWARD:g}")

    @property
    def seconds_per_slot(self) -> float | None:
        """How many seconds of delay make one slot (None when slots have no fixed duration)."""
        if self.slot_seconds is not None:
            return self.slot_seconds
        return None if self.decisions_per_second is None else 1.0 / self.decisions_per_second


class PolicyChange(BaseModel):
    """What ``POST /campaigns/{id}/policy`` takes: a new policy and, optionally, a new delay model (a
    delay-corrected policy needs one). Arms, window and buckets stay: tokens and histograms depend on them."""

    model_config = ConfigDict(extra="forbid")

    policy: PolicySpec
    delay: dict[str, Any] | None = None


class ArmsRefused(ValueError):
    """An arm change the campaign cannot take: ``code`` is the API's error code (409, or 404 for an arm it
    does not have), ``detail`` says why."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class ArmAdded(BaseModel):
    """What ``POST /campaigns/{id}/arms`` takes."""

    model_config = ConfigDict(extra="forbid")

    arm: Identifier


class Campaign(CampaignSpec):
    """A stored campaign: the spec plus what the service keeps about it.

    Arms are only ever appended, so an arm keeps its index (decision ids, counters and histogram cells name
    arms by index) for the campaign's life; a retired arm stays in ``arms``, listed in ``retired``. Its
    policy plays the active arms alone (``active_arms``, ``on_active_arms``). ``arms_version`` counts the arm
    changes: the store refuses a decision from a worker holding another (store/lua/record_decisions.lua),
    as it refuses one from another policy ``version``, but unlike a policy change an arm change keeps the
    statistics, so conversions of earlier decisions still count."""

    status: CampaignStatus = CampaignStatus.ACTIVE
    version: int = 1
    created_at: int = 0  # epoch microseconds
    retired: list[Identifier] = Field(default_factory=list)
    arms_version: int = 0
    archived_at: int | None = None  # epoch microseconds, once archived

    @model_validator(mode="after")
    def _arm_set(self) -> Campaign:
        if not set(self.retired) <= set(self.arms) or len(set(self.retired)) != len(self.retired):
            raise ValueError("retired must list distinct arms of the campaign")
        if self.default_arm in self.retired:
            raise ValueError(f"default_arm {self.default_arm!r} is retired")
        return self

    @property
    def feedback_until(self) -> int | None:
        """Until when (µs, inclusive) an archived campaign still records conversions: its archive time plus
        the window (a decision made just before the archive may convert that late and count) plus the
        allowed lateness (how late such a conversion may be reported). None while it is not archived."""
        if self.archived_at is None:
            return None
        return self.archived_at + self.window_us + self.lateness_us

    def archived(self, at: int) -> Campaign:
        """This campaign archived at ``at`` (µs)."""
        return self.model_copy(update={"status": CampaignStatus.ARCHIVED, "archived_at": at})

    @cached_property
    def delay_model(self) -> DelayModel:
        return delay_from_spec(self.delay)

    @property
    def contextual(self) -> bool:
        """Its policy chooses among each request's feature vectors (engine/contextual.py)."""
        return self.offers is not None

    @cached_property
    def contextual_policy(self) -> ContextualPolicy:
        return make_contextual_policy(self.policy.name, self.policy.params)

    def features_expire_at(self, bucket: int) -> int:
        """When (epoch seconds) the features of a contextual decision of histogram ``bucket`` may go: at the
        bucket's end plus the window (its last conversion that can count) plus the allowed lateness (how late
        that may be reported; later ones are recorded, not counted: engine/feedback.py), and a second more
        (expiry is whole seconds)."""
        return -(-((bucket + 1) * self.bucket_width_us + self.window_us + self.lateness_us) // MICROS) + 1

    @cached_property
    def policy_impl(self) -> Policy:
        """The policy over the active arms (its arm j is ``arms[active_arms[j]]``)."""
        active = [self.arms[k] for k in self.active_arms]
        return build_policy(self.policy, active, self.delay_model, self.seconds_per_slot, self.decisions_per_second)

    @cached_property
    def policy_on_every_arm(self) -> Policy:
        """The policy as if no arm were retired: what it makes of a retired arm's statistics (GET /state)."""
        if not self.retired:
            return self.policy_impl
        return build_policy(self.policy, self.arms, self.delay_model, self.seconds_per_slot, self.decisions_per_second)

    @cached_property
    def active_arms(self) -> tuple[int, ...]:
        """The indices of the arms not retired, in order: the policy's arm j is the campaign's arm
        ``active_arms[j]``."""
        retired = set(self.retired)
        return tuple(k for k, arm in enumerate(self.arms) if arm not in retired)

    def on_active_arms(self, stats: ArmStats) -> ArmStats:
        """The statistics of the arms the policy plays (``stats`` itself while no arm is retired): the one
        place a retired arm is taken out of the policy's sight, so no policy can choose it and the policies'
        propensities stay a distribution over the arms that can be chosen."""
        return stats.on_arms(self.active_arms) if self.retired else stats

    @cached_property
    def arms_need_restart(self) -> bool:
        """Its policy plays a schedule over its arms, or solves plans over them (guha-bayes): it cannot take
        an arm change within one policy version."""
        return not self.contextual and not takes_new_arms(self.policy_impl)

    def with_arms(self, added: Sequence[str], retired: Sequence[str], restart: bool) -> Campaign:
        """The campaign after adding and retiring these arms (ArmsRefused if it cannot take them): the next
        arms version, and with ``restart`` the next policy version too (a fresh state, as a policy change)."""
        if self.offers == "actions":
            raise ArmsRefused(
                "policy_cannot_change_arms",
                "an actions campaign has no arms: each request offers its own actions",
            )
        if self.arms_need_restart and not restart:
            raise ArmsRefused(
                "policy_cannot_change_arms",
                f"policy {self.policy.name!r} plays a schedule over its arms; send ?restart=true to start a new "
                "policy version (a fresh state, as a policy change) with the new arms",
            )
        for arm in added:
            if arm in self.arms:
                state = "retired" if arm in self.retired else "active"
                raise ArmsRefused("arm_exists", f"arm {arm!r} exists ({state}); an arm id is never reused")
        if len(self.arms) + len(added) > MAX_ARMS:
            raise ArmsRefused("too_many_arms", f"a campaign has at most {MAX_ARMS} arms, retired ones included")
        for arm in retired:
            if arm not in self.arms:
                raise ArmsRefused("unknown_arm", f"campaign {self.id!r} has no arm {arm!r}")
            if arm in self.retired:
                raise ArmsRefused("arm_retired", f"arm {arm!r} is retired already")
            if arm == self.default_arm:
                raise ArmsRefused("arm_required", f"arm {arm!r} is the default arm: it cannot be retired")
        if len(self.active_arms) + len(added) - len(retired) < 1:
            raise ArmsRefused("arm_required", "the campaign's last active arm cannot be retired")
        body = self.model_dump() | {
            "arms": [*self.arms, *added], "retired": [*self.retired, *retired],
            "arms_version": self.arms_version + 1, "version": self.version + restart,
        }  # fmt: skip
        try:
            changed = Campaign(**body)
            if not changed.contextual:  # a context campaign's arms are its model's blocks: no arm policy
                check_floor(changed.policy_impl, changed.exploration_floor)
        except ValueError as invalid:
            raise ArmsRefused("invalid_arm_change", str(invalid)) from invalid
        return changed

    @cached_property
    def plays_schedule(self) -> bool:
        """Its policy plays planned segments from a shared schedule (service/latebandit/store/schedule.py)."""
        return not self.contextual and isinstance(self.policy_impl, SchedulePolicy)

    @cached_property
    def slot_us(self) -> int | None:
        return None if self.slot_seconds is None else max(1, round(self.slot_seconds * MICROS))

    @cached_property
    def lateness_us(self) -> int:
        return round(self.allowed_lateness * MICROS)

    @cached_property
    def window_us(self) -> int:
        return round(self.window * MICROS)

    def settles_us(self, retention_us: int, skew_us: int) -> int:
        """How long after an event was recorded nothing that arrives can change what it did: the window (a
        conversion of the decision), for a planning campaign its allowed lateness (an aggregate over the
        slot; it reads conversions as aggregates), plus the dedup retention and the clock skew between the
        workers that stamped the log: ``latebandit archive`` takes a range that long after its end. (A replay
        forgets a decision line sooner, after the window: only an attributed conversion needs it.)"""
        return (self.lateness_us if self.plays_schedule else self.window_us) + retention_us + skew_us

    @cached_property
    def bucket_width_us(self) -> int:
        return -(-self.window_us // self.buckets)

    @cached_property
    def exact_components(self) -> tuple[tuple[float, float], ...]:
        """The exponential components of F whose moments the histogram keeps (engine/exposure.py): those not
        much faster than a bucket, so that exp(±λ·w) stays within float range."""
        width = self.bucket_width_us / MICROS
        components = self.delay_model.exponential_components() or ()
        return tuple((share, rate) for share, rate in components if rate * width <= MAX_EXACT_DECAY)

    @cached_property
    def arm_index(self) -> dict[str, int]:
        return {arm: index for index, arm in enumerate(self.arms)}

    def with_policy(self, change: PolicyChange) -> Campaign:
        """The campaign's next policy version, validated as a whole campaign (ValueError if inconsistent)."""
        spec = CampaignSpec.model_validate(
            self.model_dump(include=set(CampaignSpec.model_fields)) | change.model_dump(exclude_none=True)
        )
        return Campaign(
            **spec.model_dump(), status=self.status, version=self.version + 1, created_at=self.created_at,
            retired=self.retired, arms_version=self.arms_version,
        )  # fmt: skip

    def public(self) -> dict[str, Any]:
        """The campaign as the API shows it (an actions-form campaign has no arms of the user's to show)."""
        hidden = {
            "created_at",
            "archived_at",
            *(("arms", "default_arm", "retired") if self.offers == "actions" else ()),
        }
        body = self.model_dump(mode="json", exclude=hidden)
        body["created_at"] = format_time(self.created_at)
        if self.archived_at is not None and self.feedback_until is not None:
            body |= {"archived_at": format_time(self.archived_at), "feedback_until": format_time(self.feedback_until)}
        policy = self.contextual_policy if self.contextual else self.policy_impl
        body["policy"]["resolved_params"] = policy.params()
        return body
