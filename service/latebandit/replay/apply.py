"""Re-apply an event log (docs/reference/event-log.md) to the campaigns' own policies, through the live service's
own feedback ingest (engine/ingest.py), store semantics and state description (engine/describe.py), so
``replay --dump-state`` equals ``GET /state``.

Time is virtual and each campaign has its own: the latest time of its events seen (``Replayer._advance``),
and ``as_of`` cuts the log (decisions made and conversions occurred after it are left out). Conversions
whose decision line is missing from the log cannot be attributed to a pull and are skipped and counted in
``skipped`` (a planning campaign, which learns from sums, takes them all the same), as is every event the
service's ingest rejects.

The log is streamed, and so is what the replay holds of it: a decision is forgotten once its campaign's
log has moved past its window plus the dedup retention, because a conversion arriving after that changes
nothing in the service either (engine/feedback.py, ``forgotten``), and histogram cells whose pulls have
all left the window are folded into the arm's matured count, as the service folds them when it reads
them. Memory follows the traffic of one window, not the length of the log.

A planning campaign (ODAAF, ARS-*, CLW) is replayed from its plan lines (the plans the service committed,
with the RNG draws they embody) and its decisions, aggregates and watermarks at the times the service
recorded them, which rebuilds its schedule exactly.
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from latebandit.audit.export import record_to_line
from latebandit.audit.records import Outcome, Record
from latebandit.campaign import ArmsRefused, Campaign, CampaignStatus, PolicyChange
from latebandit.config import Settings
from latebandit.engine.describe import describe_state
from latebandit.engine.exposure import bucket_moments
from latebandit.engine.feedback import Conversion, Reason, Rejection
from latebandit.engine.ingest import Ingest, Item
from latebandit.engine.scheduling import describe_schedule
from latebandit.policies.schedule import Plan
from latebandit.store.base import AnonymousEvent, PreparedConversion, Pull
from latebandit.store.memory import MemoryStore
from latebandit.store.schedule import ClaimStatus
from latebandit.timeutil import MICROS, parse_time

# Per kind of feedback line, the key of its event's time: its receipt in a log without ``received_at``.
EVENT_TIME = {"conversion": "occurred_at", "aggregate": "end", "watermark": "at"}


@dataclass(frozen=True)
class LoggedDecision:
    campaign: str
    arm: int
    at: int
    counted: bool
    version: int


def campaign_from_line(line: dict[str, Any]) -> Campaign:
    """A campaign line is a campaign body (as POST /campaigns takes it) plus, from an export, the stored
    fields (status, version, created_at)."""
    body = {key: value for key, value in line.items() if key in Campaign.model_fields and key != "created_at"}
    created = line.get("created_at")
    if isinstance(created, str):
        body["created_at"] = parse_time(created)
    elif isinstance(created, int):
        body["created_at"] = created
    return Campaign.model_validate(body)


class Skips:
    """The replay's ledger (engine/ingest.py): the feedback lines the ingest did not apply, counted in
    ``Replayer.skipped`` by kind and reason. What the store made of the others is the state itself."""

    def __init__(self, skipped: Counter[str], kind: str) -> None:
        self.skipped = skipped
        self.kind = kind

    def reject(self, index: int, rejection: Rejection) -> None:
        reason = "refused" if rejection.reason is Reason.CAMPAIGN_PAUSED else rejection.reason.value
        self.skipped[f"{self.kind}_{reason}"] += 1

    def tally(self, campaign: Campaign, items: list[tuple[int, PreparedConversion]], outcomes: list[Outcome]) -> None:
        pass

    def tally_anonymous(
        self, campaign: Campaign, items: list[tuple[int, AnonymousEvent]], outcomes: list[Outcome]
    ) -> None:
        pass


class Replayer:
    """Feedback is applied through the service's ingest at the time the service received it
    (``received_at`` in an export, else the event's own time): that time decides deduplication expiry and
    whether it lies before ``as_of``. Pass the service's ``dedup_retention``, ``max_skew`` and
    ``request_ttl`` to reproduce it exactly."""

    def __init__(self, as_of: int | None = None, settings: Settings | None = None) -> None:
        settings = settings or Settings()
        self.now = 0  # the store's clock: the time of the campaign whose event is being applied
        self.latest = 0  # the log's latest event time, for the state as of the log's end
        self._clocks: Counter[str] = Counter()  # per campaign, its latest event time
        self.as_of = as_of
        self._retention_us = round(settings.dedup_retention * MICROS)
        self.request_ttl = math.ceil(settings.request_ttl)
        self.store = MemoryStore(clock=lambda: self.now, keep_audit=False)
        self.ingest = Ingest(self.store, settings.max_skew, settings.dedup_retention)
        self.campaigns: dict[str, Campaign] = {}
        self.decisions: dict[str, LoggedDecision] = {}
        # Per campaign, its decisions in log order with the moment they may be forgotten, and its latest
        # decision time (the service folds matured cells when a decision reads them, not on feedback).
        self._forgettable: defaultdict[str, deque[tuple[int, str]]] = defaultdict(deque)
        self._latest: Counter[str] = Counter()
        self._bucket: dict[str, int] = {}  # per campaign, the histogram bucket of its latest event
        self.skipped: Counter[str] = Counter()
        self._campaign_lines: set[bytes] = set()  # campaign events are few, and are archived yet kept

    def _advance(self, campaign_id: str, moment: int) -> bool:
        """Move ``campaign_id``'s virtual clock to ``moment``, and the store's clock to it; False if the
        event lies after ``as_of`` and must be left out. Each campaign has its own clock, as each had the
        real time of its own events: a log holds campaigns one after another (and an archive followed by the
        log, pieces of one campaign on either side of the others), and on one shared clock a campaign's
        deduplication entries would expire at another campaign's later times, letting a repeat count."""
        if self.as_of is not None and moment > self.as_of:
            return False
        self._clocks[campaign_id] = self.now = max(self._clocks[campaign_id], moment)
        self.latest = max(self.latest, moment)
        return True

    async def apply_all(self, lines: Iterable[dict[str, Any]]) -> None:
        for line in lines:
            await self.apply(line)

    async def apply(self, line: dict[str, Any]) -> None:
        kind = line.get("type")
        if kind == "campaign":
            await self._campaign(line)
        elif kind == "decision":
            await self._decision(line)
        elif kind == "archive":
            await self._archive(line)
        elif kind in EVENT_TIME:
            await self._feedback(kind, line)
        elif kind == "arms":
            await self._arms(line)
        else:
            self.skipped[f"{kind}_event"] += 1

    async def _campaign(self, line: dict[str, Any]) -> None:
        if "at" in line or "created_at" in line:  # an export's line: the same line again is the same event
            identity = orjson.dumps(line, option=orjson.OPT_SORT_KEYS)
            if identity in self._campaign_lines:  # an archive followed by the log repeats the kept lines
                self.skipped["repeated_campaign_line"] += 1
                return
            self._campaign_lines.add(identity)
        if "arms" in line:
            campaign = campaign_from_line(line)
            if not self._advance(campaign.id, campaign.created_at):
                return
            if await self.store.create_campaign(campaign, {}):
                self.campaigns[campaign.id] = campaign
            return
        campaign_id, status = line.get("id") or line.get("campaign"), line.get("status", "")
        if campaign_id not in self.campaigns:
            return
        at = line.get("at")
        if at is not None and not self._advance(campaign_id, parse_time(at)):
            return
        if "plan" in line:
            await self._plan(self.campaigns[campaign_id], line)
            return
        if "policy" in line:  # the next policy version, with a fresh state, as the service started it
            change = PolicyChange(policy=line["policy"], delay=line.get("delay"))
            changed = await self.store.change_policy(self.campaigns[campaign_id].with_policy(change), {})
        elif status in CampaignStatus.__members__.values():
            changed = await self.store.set_status(campaign_id, CampaignStatus(status), {})
        else:
            return
        self.campaigns[campaign_id] = changed or self.campaigns[campaign_id]

    async def _archive(self, line: dict[str, Any]) -> None:
        """The campaign's archive, as the service made it: its later feedback is refused after its
        feedback_until, by the same store rule. A second archive line changes nothing, as a second DELETE."""
        campaign = self.campaigns.get(line["campaign"])
        if campaign is None:
            self.skipped["archive_without_campaign"] += 1
            return
        at = parse_time(line["at"])
        if self._advance(campaign.id, at):
            self.campaigns[campaign.id] = await self.store.archive(campaign.archived(at), {}) or campaign

    async def _arms(self, line: dict[str, Any]) -> None:
        """Arms added and retired, as the service changed them (Campaign.with_arms); a change the campaign
        could not have taken is skipped (``arms_refused``)."""
        identity = orjson.dumps(line, option=orjson.OPT_SORT_KEYS)
        current = self.campaigns.get(line.get("campaign", ""))
        if current is None or identity in self._campaign_lines:
            self.skipped["arms_without_campaign" if current is None else "repeated_campaign_line"] += 1
            return
        self._campaign_lines.add(identity)
        if not self._advance(current.id, parse_time(line["at"])):
            return
        try:
            campaign = current.with_arms(line.get("added", []), line.get("retired", []), bool(line.get("restart")))
        except ArmsRefused:
            self.skipped["arms_refused"] += 1
            return
        if campaign.version != current.version:
            changed = await self.store.change_policy(campaign, {}, arms_before=current.arms_version)
        else:
            changed = await self.store.change_arms(campaign, {})
        self.campaigns[current.id] = changed or current

    async def _plan(self, campaign: Campaign, line: dict[str, Any]) -> None:
        plan, version = Plan.from_json(line["plan"]), int(line["version"])
        if not await self.store.commit_plan(
            campaign, version - 1, plan, int(line["consumed"]), {"config": {}}, self.now
        ):
            self.skipped["plan_out_of_order"] += 1

    async def _decision(self, line: dict[str, Any]) -> None:
        campaign = self.campaigns.get(line["campaign"])
        if campaign is None or (campaign.offers != "actions" and line["arm"] not in campaign.arm_index):
            self.skipped["decision_without_campaign"] += 1
            return
        if line["decision_id"] in self.decisions:  # a log has each decision once: an archive given twice
            self.skipped["repeated_decision"] += 1
            return
        at = parse_time(line["at"])
        if not self._advance(campaign.id, at):
            return
        arm = 0 if campaign.offers == "actions" else campaign.arm_index[line["arm"]]  # an actions campaign's one block
        counted = not line.get("fallback", False)
        await self._settle(campaign, at)
        self.decisions[line["decision_id"]] = LoggedDecision(
            campaign.id, arm, at, counted, line.get("version", campaign.version)
        )
        # Forgotten a max_skew after that: the workers' clocks, which stamped the log, may differ by as much.
        forget_at = at + campaign.window_us + self._retention_us + self.ingest.max_skew
        self._forgettable[campaign.id].append((forget_at, line["decision_id"]))
        bucket, offset, moments = bucket_moments(campaign, at)
        propensity = float(line.get("propensity", 1.0))
        pull = Pull(arm, bucket, offset, moments, line["decision_id"], propensity, {"at": at})
        if campaign.contextual and "features" in line:  # what its conversion adds to b, its window footprint
            pull.features, pull.footprint = np.array(line["features"], dtype=np.float64), float(line["footprint"])
            pull.action = line["arm"] if campaign.offers == "actions" else None
        if counted and campaign.plays_schedule:
            claim = await self.store.claim_slot(campaign, pull, None, self.request_ttl)
            if claim.status is not ClaimStatus.NEW:
                self.skipped[f"decision_{claim.status.value}"] += 1
        elif counted:  # every logged pull counts, whatever its request_id: the service counted it
            await self.store.record_decision(campaign, pull, None, self.request_ttl)
        self.store.remember_request(campaign, line.get("request_id"), pull, self.request_ttl)

    async def _settle(self, campaign: Campaign, moment: int) -> None:
        """Drop what no event of ``campaign`` from ``moment`` on can change: decisions past their window
        plus retention, and (each time a new bucket starts) the histogram cells that left the window."""
        self._latest[campaign.id] = latest = max(self._latest[campaign.id], moment)
        aging = self._forgettable[campaign.id]
        while aging and aging[0][0] < latest:
            self.decisions.pop(aging.popleft()[1], None)
        bucket = latest // campaign.bucket_width_us
        if campaign.plays_schedule or self._bucket.get(campaign.id) == bucket:
            return
        self._bucket[campaign.id] = bucket
        hist = (await self.store.snapshot(campaign)).histogram
        matured = latest - (hist.bucket + 1) * campaign.bucket_width_us >= campaign.window_us  # as exposure() says
        if matured.any():
            await self.store.fold_matured(campaign, hist.arm[matured], hist.bucket[matured])

    async def _feedback(self, kind: str, line: dict[str, Any]) -> None:
        """A feedback line, applied by the service's own ingest as of its receipt. An aggregate or a
        watermark goes in as the client sent it; a conversion as the service verified it (``_conversion``)."""
        item: Item
        if kind == "conversion":
            conversion = self._conversion(line)
            if conversion is None:
                return
            campaign, item = self.campaigns[conversion.campaign], conversion
        else:
            known = self.campaigns.get(line.get("campaign", ""))
            if known is None:
                self.skipped[f"{kind}_without_campaign"] += 1
                return
            campaign, item = known, line
        received = parse_time(line["received_at"] if "received_at" in line else line[EVENT_TIME[kind]])
        if not self._advance(campaign.id, received):
            return
        left = await self.ingest.apply(campaign, [(0, item)], received, Skips(self.skipped, kind))
        if left:  # never in fact: the replay's campaigns follow its store's policy versions, none moves under it
            self.skipped[f"{kind}_refused"] += len(left)

    def _conversion(self, line: dict[str, Any]) -> Conversion | None:
        """The conversion as the service verified it: its decision id told the service the arm, the
        decision's time and policy version and whether the pull counted, which the replay reads from the
        decision's line."""
        decision = self.decisions.get(line["decision_id"])
        if decision is None:
            campaign = self.campaigns.get(line["campaign"])
            if campaign is None or not campaign.plays_schedule:
                late = (
                    campaign is not None
                    and {"decided_at", "received_at"} <= line.keys()
                    and parse_time(line["received_at"]) - parse_time(line["decided_at"])
                    > campaign.window_us + self._retention_us
                )
                self.skipped["conversion_after_retention" if late else "conversion_without_decision"] += 1
                return None
            # A planning campaign reads a conversion as an aggregate over the instant it occurred
            # (anonymous_event), so it learns from one whose decision line is not held (forgotten, or not in
            # the log) all the same; the arm and decision time an export gives it only label it.
            arm = campaign.arm_index.get(line.get("arm", ""), len(campaign.arms))  # past the arms: none named
            at = parse_time(line.get("decided_at", line["occurred_at"]))
            decision = LoggedDecision(campaign.id, arm, at, True, campaign.version)
        return Conversion(
            decision.campaign, line["decision_id"], decision.arm, decision.at, decision.counted, decision.version,
            parse_time(line["occurred_at"]), float(line.get("value", 1.0)), line.get("event_id"),
        )  # fmt: skip

    async def state(self, campaign_id: str, as_of: int | None = None) -> dict[str, Any]:
        campaign = self.campaigns[campaign_id]
        snapshot = await self.store.snapshot(campaign)
        moment = as_of if as_of is not None else self.as_of or self.latest
        if campaign.plays_schedule:
            return describe_schedule(campaign, snapshot.counters, await self.store.schedule_view(campaign), moment)
        return describe_state(campaign, snapshot, moment)


GZIP_MAGIC = b"\x1f\x8b"


def read_log(path: str) -> Iterable[dict[str, Any]]:
    """The lines of an event log, plain or gzip-compressed (``latebandit archive``), told by its first bytes,
    not its name. ValueError names the line that is not JSON, or a compressed file cut short."""
    with open(path, "rb") as first:
        compressed = first.read(2) == GZIP_MAGIC
    number = 0
    try:
        with gzip.open(path, "rb") if compressed else open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if raw.strip():
                    try:
                        yield orjson.loads(raw)
                    except orjson.JSONDecodeError as error:
                        raise ValueError(f"{path}:{number}: not JSON ({error})") from error
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise ValueError(f"{path}: compressed data cut short or damaged after line {number} ({error})") from error


def records_as_lines(records: Iterable[Record]) -> Iterable[dict[str, Any]]:
    """Audit records in the event-log form (the export), for replaying straight from the audit log."""
    for record in records:
        yield record_to_line(record)
