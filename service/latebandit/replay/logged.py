"""One campaign's logged traffic as an off-policy evaluation sees it: its counted decisions in time order,
each with the logged propensity, the conversions the log holds for it, and its reward within the window.

The reward of a decision (value units) is the value of its first conversion that occurred within the window
(``reward.per_decision`` "first"), or the values of all those added up and capped at ``reward.max`` ("sum",
as the service credits them), 0 if none did. It is known only once the window has closed by
the end of the log: a decision younger than the window at the end may still convert, so its reward is
unknown (``None``) rather than 0 (censored by the log's end, not by the window).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from latebandit.campaign import Campaign
from latebandit.policies.linear import CONTEXTUAL_POLICIES
from latebandit.replay.apply import campaign_from_line
from latebandit.timeutil import parse_time


class NotEvaluable(ValueError):
    """The log cannot support the estimate asked for; the message says why and what would."""


@dataclass(frozen=True)
class LoggedConversion:
    occurred_at: int
    value: float
    event_id: str | None
    received_at: int  # when the service took it (``received_at``; its ``occurred_at`` in a log without it)


@dataclass(frozen=True)
class LoggedDecision:
    decision_id: str
    arm: int
    at: int
    propensity: float
    conversions: tuple[LoggedConversion, ...]  # those that occurred by the log's end, in log order
    reward: float | None  # value counted within the window; None while the window is open at the end


@dataclass(frozen=True)
class ArmChange:
    """Arms added and retired at ``at`` (an ``arms`` line): the evaluated policy's arm set changes then too."""

    at: int
    added: tuple[str, ...]
    retired: tuple[str, ...]


@dataclass
class CampaignLog:
    campaign: Campaign  # as created: its arms then
    decisions: list[LoggedDecision]  # arms indexed by every arm the campaign had by ``end`` (arms are appended)
    end: int  # µs: the evaluation horizon (``--at`` or the log's latest time)
    skipped: Counter[str] = field(default_factory=Counter)
    arm_changes: list[ArmChange] = field(default_factory=list)  # in time order, up to ``end``


@dataclass
class LogLines:
    """One campaign's lines of a log, as read for an evaluation: the decisions still to be made into
    LoggedDecision (the campaign's, counted, up to ``end``) and the conversions by decision id."""

    campaign: Campaign
    decisions: list[tuple[int, dict[str, Any]]]  # (at, line)
    conversions: dict[str, list[dict[str, Any]]]
    end: int
    skipped: Counter[str]
    arm_changes: list[ArmChange]

    def arm_index(self) -> dict[str, int]:
        """Every arm the campaign had by ``end``, by its index (arms are only ever appended)."""
        every_arm = [*self.campaign.arms, *(arm for change in self.arm_changes for arm in change.added)]
        return {arm: index for index, arm in enumerate(every_arm)}


def read_lines(lines: Iterable[dict[str, Any]], campaign_id: str | None, at: int | None) -> LogLines:
    """The campaign's decision and conversion lines up to ``at`` (default: the latest time in the log); a
    fallback decision is left out (the default arm, not the policy's choice: nothing to learn from)."""
    campaigns: dict[str, Campaign] = {}
    decisions: list[dict[str, Any]] = []
    conversions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    changes: dict[str, list[ArmChange]] = defaultdict(list)
    latest = 0
    for line in lines:
        kind = line.get("type")
        if kind == "campaign" and "arms" in line:
            campaign = campaign_from_line(line)
            campaigns.setdefault(campaign.id, campaign)
        elif kind == "arms":
            change = ArmChange(parse_time(line["at"]), tuple(line.get("added", ())), tuple(line.get("retired", ())))
            changes[line["campaign"]].append(change)
        elif kind == "decision":
            decisions.append(line)
            latest = max(latest, parse_time(line["at"]))
        elif kind == "conversion":
            conversions[line["decision_id"]].append(line)
            latest = max(latest, parse_time(line["occurred_at"]))
    campaign = _pick(campaigns, campaign_id)
    end = latest if at is None else at
    arm_changes = sorted((c for c in changes[campaign.id] if c.at <= end), key=lambda change: change.at)
    read = LogLines(campaign, [], conversions, end, Counter(), arm_changes)
    for line in decisions:
        if line.get("campaign") != campaign.id:
            continue
        moment = parse_time(line["at"])
        if moment > end:
            continue
        if line.get("fallback", False):
            read.skipped["fallback decisions"] += 1
            continue
        read.decisions.append((moment, line))
    return read


def read_campaign_log(lines: Iterable[dict[str, Any]], campaign_id: str | None, at: int | None) -> CampaignLog:
    """The campaign's decisions and conversions up to ``at`` (default: the latest time in the log)."""
    read = read_lines(lines, campaign_id, at)
    campaign = read.campaign
    if campaign.contextual:
        raise NotEvaluable(
            f"campaign {campaign.id!r} is contextual: evaluate a contextual policy on it "
            f"({', '.join(CONTEXTUAL_POLICIES)})"
        )
    log = CampaignLog(campaign, [], read.end, read.skipped, read.arm_changes)
    arm_index = read.arm_index()
    for moment, line in read.decisions:
        if line["arm"] not in arm_index:
            raise NotEvaluable(f"decision {line['decision_id'][:40]!r} names an unknown arm {line['arm']!r}")
        log.decisions.append(logged_decision(campaign, arm_index[line["arm"]], line, moment, read))
    log.decisions.sort(key=lambda decision: decision.at)
    return log


def _pick(campaigns: dict[str, Campaign], campaign_id: str | None) -> Campaign:
    if not campaigns:
        raise NotEvaluable("the log holds no campaign line: export it with `latebandit export`")
    if campaign_id is None:
        if len(campaigns) > 1:
            raise NotEvaluable(f"the log holds several campaigns ({', '.join(campaigns)}): pass --campaign")
        return next(iter(campaigns.values()))
    if campaign_id not in campaigns:
        raise NotEvaluable(f"no campaign {campaign_id!r} in the log")
    return campaigns[campaign_id]


def logged_decision(campaign: Campaign, arm: int, line: dict[str, Any], at: int, read: LogLines) -> LoggedDecision:
    """Decision ``line`` (at ``at``) with its propensity checked, its conversions seen by the log's end and its
    reward; ``arm``: its index among every arm (a contextual campaign's model block)."""
    propensity = line.get("propensity")
    if isinstance(propensity, bool) or not isinstance(propensity, int | float) or not 0.0 < propensity <= 1.0:
        raise NotEvaluable(
            f"decision {line['decision_id'][:40]!r} has no propensity in (0, 1] (got {propensity!r}): "
            "an off-policy estimate needs the logging policy's probability of every logged choice"
        )
    seen = []
    for conversion in read.conversions.get(line["decision_id"], []):
        occurred = max(at, parse_time(conversion["occurred_at"]))  # the service clamps a small skew to 0
        if occurred <= read.end:
            received = max(occurred, parse_time(conversion.get("received_at", conversion["occurred_at"])))
            value, event_id = float(conversion.get("value", 1.0)), conversion.get("event_id")
            seen.append(LoggedConversion(occurred, value, event_id, received))
    reward = None
    if at + campaign.window_us <= read.end:
        counted = [c.value for c in seen if c.occurred_at - at <= campaign.window_us]
        reward = 0.0 if not counted else min(sum(counted), campaign.reward.max) if campaign.reward.sums else counted[0]
    return LoggedDecision(line["decision_id"], arm, at, float(propensity), tuple(seen), reward)
