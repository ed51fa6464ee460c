"""Every Redis key latebandit uses, built in one place.

A campaign's keys share the hash tag ``{campaign}``, so they sit in one Redis Cluster slot and every Lua
script over them stays legal on a cluster. Only the registries of campaign ids (every campaign with keys,
and the archived ones) live outside the tag.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

RETIRED = ("dedup",)  # the hash of seen feedback that versions before the sorted set alone also kept


@dataclass(frozen=True)
class Keys:
    prefix: str = "lb"

    def registry(self) -> str:
        return f"{self.prefix}:campaigns"

    def archived(self) -> str:
        """Hash: archived campaign id → the archived campaign (JSON), kept after its state is purged, so that its
        id is never reused and it is still listed and answered as archived."""
        return f"{self.prefix}:archived"

    def _tagged(self, campaign: str, name: str) -> str:
        return f"{self.prefix}:{{{campaign}}}:{name}"

    def state(self, campaign: str) -> list[str]:
        """The keys that hold a campaign's state (not its audit queue, whose entries are still owed to the
        audit log, nor request-id keys)."""
        names = (self.config, self.counters, self.cells, self.delays, self.dedup, self.credited, self.model,
                 self.decided)  # fmt: skip
        retired = [self._tagged(campaign, name) for name in RETIRED]
        return [*(name(campaign) for name in (*names, *self.schedule_names())), *retired]

    def purged(self, campaign: str) -> list[str]:
        """Every key of a campaign with a fixed name, what the purge of an archived campaign deletes (its
        ``req:`` keys, one per request id, are found by ``requests``)."""
        return [*self.state(campaign), self.audit(campaign), self.audit_lease(campaign)]

    def requests(self, campaign: str) -> str:
        """The pattern (SCAN MATCH) of a campaign's request-id keys (a campaign id holds no glob character)."""
        return self._tagged(campaign, "req:*")

    def all_features(self, campaign: str) -> str:
        """The pattern (SCAN MATCH) of a contextual campaign's ``features`` hashes."""
        return self._tagged(campaign, "feat:*")

    def config(self, campaign: str) -> str:
        return self._tagged(campaign, "config")

    def counters(self, campaign: str) -> str:
        """Hash: ``d`` decisions, ``paused``, ``v`` the policy version (absent: 1), ``a`` the arms version (absent:
        0), ``w`` the write stamp (campaign_lib.lua's ``stamp_counters``), once archived ``archived`` and
        ``until`` (its archive time and ``feedback_until``, µs), and per arm ``n:k`` pulls, ``s:k`` S (the
        credited reward, value units), ``c:k`` counted conversions, ``m:k`` matured."""
        return self._tagged(campaign, "counters")

    def cells(self, campaign: str) -> str:
        """Hash of the pull histogram: ``arm:bucket:c|o|v|e1..eJ`` (count, offset, converted, moments), and for a
        contextual campaign ``arm:bucket:f`` (the sum of its decisions' footprints)."""
        return self._tagged(campaign, "cells")

    def model(self, campaign: str) -> str:
        """Hash of a contextual campaign's model sums per block (store/base.py's LinearSums), each a blob of
        little-endian float64: ``g:k`` Σ AAᵀ (d·d) over the decisions folded so far, ``b:k`` b (d); ``fold``
        names the last fold (store/lua/fold_model.lua), which a later fold must find unchanged."""
        return self._tagged(campaign, "model")

    def decided(self, campaign: str) -> str:
        """String of a contextual campaign's decisions recorded since the last fold, appended by
        record_decisions.lua: per decision d + 1 little-endian float64, its block then its features. Σ AAᵀ is the
        model's ``g:k`` plus these; a worker folds them in (store/redis.py's ``fold_model``) once they are many."""
        return self._tagged(campaign, "decided")

    def features(self, campaign: str, bucket: int) -> str:
        """Hash of the chosen features of a contextual campaign's decisions of histogram ``bucket``, by the
        decision id's signature (store/base.py's ``features_field``) → float64 blob; it expires when the last
        conversion that can count has been reported (Campaign.features_expire_at)."""
        return self._tagged(campaign, f"feat:{bucket}")

    def delays(self, campaign: str) -> str:
        """Hash of observed conversion delays: ``arm:bucket`` → count (buckets of service/latebandit/delays/tail.py)."""
        return self._tagged(campaign, "delays")

    def audit(self, campaign: str) -> str:
        """Stream of audit entries waiting for the writer."""
        return self._tagged(campaign, "audit")

    def audit_lease(self, campaign: str) -> str:
        """Which worker's audit writer drains the campaign's stream for now."""
        return self._tagged(campaign, "audit:lease")

    def request(self, campaign: str, request_id: str) -> str:
        return self._tagged(campaign, f"req:{request_id}")

    def dedup(self, campaign: str) -> str:
        """Sorted set of what feedback has been seen, ``ev:<event id>`` and ``cv:<decision id>`` (converted),
        scored by expiry time (seconds), so old entries can be dropped in bulk. Named as when it sat beside
        a hash of the same members, so that a deployment's entries carry over."""
        return self._tagged(campaign, "dedup:expiry")

    def credited(self, campaign: str) -> str:
        """Hash ``cv:<decision id>`` → the reward credited to that counted decision so far, on a campaign whose
        decisions' conversions add up (``reward.per_decision`` "sum"); an entry leaves with its dedup entry."""
        return self._tagged(campaign, "credited")

    def schedule_names(self) -> tuple[Callable[[str], str], ...]:
        return (self.sched, self.segments, self.starts, self.closed)

    def sched(self, campaign: str) -> str:
        """Hash of a planning policy's schedule: plan, version, slots, watermark (store/schedule.py)."""
        return self._tagged(campaign, "sched")

    def segments(self, campaign: str) -> str:
        """Hash of the open segment records: ``<id>:j|a|c|f|s|x|y|r`` (segment JSON, arm, counted, first
        slot, start, end, next first slot, reward)."""
        return self._tagged(campaign, "segments")

    def starts(self, campaign: str) -> str:
        """Sorted set of the open segment record ids by start time (µs)."""
        return self._tagged(campaign, "starts")

    def closed(self, campaign: str) -> str:
        """List of the closed segment records (JSON) not yet given to a plan."""
        return self._tagged(campaign, "closed")

    def tagged(self, campaign: str, suffix: str) -> str:
        """A campaign key from its suffix, for keys restored by a rebuild (``req:<request id>``)."""
        return self._tagged(campaign, suffix)
