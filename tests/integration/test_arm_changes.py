"""Arms added to and retired from a live campaign, on both stores (and Redis Cluster): the store keeps the
statistics and refuses a decision chosen among another arm set, the engine opens a new arm and never
chooses a retired one, and every change is an audit event that a replay reproduces."""

from __future__ import annotations

import numpy as np
import pytest

from latebandit.campaign import ArmsRefused, Campaign, PolicyChange
from latebandit.store.base import CampaignMoved, DecisionStatus, StateStore
from tests.integration.test_store_contract import T0, conversion, make_campaign, pull, store  # noqa: F401


async def test_an_arm_change_keeps_the_statistics_and_moves_stale_deciders(store: StateStore) -> None:  # noqa: F811
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    for arm, name in ((0, "d0"), (1, "d1"), (2, "d2")):
        await store.record_decision(campaign, pull(campaign, arm, T0, name), None, 60)
    assert await store.apply_conversions(campaign, [conversion(campaign, "d1", 1, T0, "e1")]) == ["counted"]

    added = campaign.with_arms(["d"], [], restart=False)
    changed = await store.change_arms(added, {"type": "campaign", "action": "arms"})
    assert changed is not None and (changed.arms, changed.arms_version, changed.version) == (["a", "b", "c", "d"], 1, 1)
    assert await store.get_campaign("c1") == changed
    state = await store.snapshot(changed)
    assert (state.counters.decisions, state.counters.pulls.tolist()) == (3, [1, 1, 1, 0])
    assert state.counters.conversions.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert state.delay_counts().shape[0] == 4

    # A caller holding the earlier arm set is told to reload, for a decision and a read; not for feedback.
    assert (await store.record_decision(campaign, pull(campaign, 2, T0, "dx"), None, 60)).status is DecisionStatus.MOVED
    with pytest.raises(CampaignMoved):
        await store.snapshot(campaign)
    assert await store.apply_conversions(campaign, [conversion(campaign, "d2", 2, T0, "e2")]) == ["counted"]
    new = await store.record_decision(changed, pull(changed, 3, T0, "d3"), None, 60)
    assert new.status is DecisionStatus.NEW
    assert (await store.snapshot(changed)).counters.pulls.tolist() == [1, 1, 1, 1]

    # Retired: the arm stays, with its statistics; a second change from the same copy lost the race.
    retired = changed.with_arms([], ["c"], restart=False)
    assert (await store.change_arms(retired, {})) == retired.model_copy(update={"status": changed.status})
    with pytest.raises(CampaignMoved):
        await store.change_arms(changed.with_arms(["e"], [], restart=False), {})
    with pytest.raises(CampaignMoved):  # a policy change from a copy of the earlier arm set would undo the change
        await store.change_policy(changed.with_policy(PolicyChange(policy={"name": "ucb1"})), {})
    state = await store.snapshot(retired)
    assert state.counters.conversions.tolist() == [0.0, 1.0, 1.0, 0.0]
    assert await store.change_arms(make_campaign("ghost").with_arms(["z"], [], restart=False), {}) is None

    # A restart is the next policy version: a fresh state over the arms, the arms version checked too.
    restarted = retired.with_arms(["e"], [], restart=True)
    assert (restarted.version, restarted.arms_version) == (2, 3)
    again = await store.change_policy(restarted, {}, arms_before=retired.arms_version)
    assert again is not None and again.arms == ["a", "b", "c", "d", "e"] and again.retired == ["c"]
    state = await store.snapshot(again)
    assert (state.counters.decisions, state.counters.pulls.tolist()) == (0, [0] * 5)
    assert (await store.record_decision(again, pull(again, 4, T0, "d4"), None, 60)).status is DecisionStatus.NEW


def test_what_an_arm_change_may_not_do() -> None:
    campaign = make_campaign()  # arms a, b, c; default a
    refusals = {
        "arm_exists": lambda: campaign.with_arms(["b"], [], False),
        "unknown_arm": lambda: campaign.with_arms([], ["z"], False),
        "arm_required": lambda: campaign.with_arms([], ["a"], False),  # the default arm
    }
    for code, change in refusals.items():
        with pytest.raises(ArmsRefused) as refused:
            change()
        assert refused.value.code == code
    one_left = campaign.with_arms([], ["b"], False).with_arms([], ["c"], False)
    assert one_left.active_arms == (0,)
    with pytest.raises(ArmsRefused, match="retired already"):
        one_left.with_arms([], ["c"], False)
    with pytest.raises(ArmsRefused) as refused:  # a retired arm's id is not reused either
        one_left.with_arms(["c"], [], False)
    assert refused.value.code == "arm_exists"
    fixed = Campaign(**{**campaign.model_dump(), "policy": {"name": "fixed", "params": {"arm": "b"}}})
    with pytest.raises(ArmsRefused) as refused:  # the arm a fixed policy plays
        fixed.with_arms([], ["b"], False)
    assert refused.value.code == "invalid_arm_change"
    planning = Campaign(**{**campaign.model_dump(), "policy": {"name": "guha-bayes"}, "decisions_per_second": 1.0})
    with pytest.raises(ArmsRefused) as refused:
        planning.with_arms(["d"], [], False)
    assert refused.value.code == "policy_cannot_change_arms"
    assert planning.with_arms(["d"], [], True).version == 2
    linear = {"policy": {"name": "otf-linucb"}, "features": 2, "window": 600.0}
    context = Campaign(**{"id": "ctx", "arms": ["a", "b"], **linear}).with_arms(["c"], ["b"], False)
    assert (context.arms, context.retired, context.active_arms, context.version) == (["a", "b", "c"], ["b"], (0, 2), 1)
    with pytest.raises(ArmsRefused) as refused:  # an actions campaign has no arms: its requests offer actions
        Campaign(**{"id": "feed", **linear}).with_arms(["c"], [], False)
    assert refused.value.code == "policy_cannot_change_arms"


def test_policies_see_the_active_arms_alone() -> None:
    campaign = make_campaign().with_arms(["d"], [], False).with_arms([], ["b"], False)
    assert campaign.active_arms == (0, 2, 3) and campaign.policy_impl.n_arms == 3
    from latebandit.policies import ArmStats

    stats = ArmStats(np.array([[1.0, 2.0, 3.0, 4.0]]), np.zeros((1, 4)), np.ones((1, 4)), np.array([5]))
    seen = campaign.on_active_arms(stats)
    assert seen.pulls.tolist() == [[1.0, 3.0, 4.0]] and seen.t.tolist() == [5]


def test_off_policy_evaluation_follows_the_logged_arm_set() -> None:
    """A uniform log over a, b; c added at 100 s, b retired at 200 s: the evaluated policy's distribution at
    each decision covers the arms active then (probability 0 elsewhere), and its value is estimated."""
    from latebandit.replay.evaluate import evaluate, target_campaign
    from latebandit.replay.logged import read_campaign_log
    from latebandit.replay.reenact import reenact
    from latebandit.timeutil import format_time
    from tests.unit.test_offpolicy import campaign_line, conversion, decision

    rng = np.random.default_rng(3)
    lines = [campaign_line()]
    changes = {100: {"added": ["c"], "retired": []}, 200: {"added": [], "retired": ["b"]}}
    for n in range(300):
        if n in changes:
            lines.append({"type": "arms", "campaign": "c", "at": format_time(n * 1_000_000), **changes[n]})
        active = ["a", "b"] if n < 100 else ["a", "b", "c"] if n < 200 else ["a", "c"]
        lines.append(decision(n, active[int(rng.integers(len(active)))], n + 0.5, 1 / len(active)))
        if rng.random() < 0.4:
            lines.append(conversion(n, n + 1.0))
    log = read_campaign_log(lines, None, None)
    assert [change.at for change in log.arm_changes] == [100_000_000, 200_000_000]
    played = reenact(log, target_campaign(log.campaign, "thompson", {}), 100.0, np.random.default_rng(0))
    rows = played.probabilities
    assert rows.shape == (300, 3) and np.allclose(rows.sum(axis=1), 1.0)
    assert (rows[:100, 2] == 0).all() and (rows[100:200] > 0).all() and (rows[200:, 1] == 0).all()
    value = evaluate(log, "thompson", {}).primary.value
    assert 0.0 <= value <= 1.0
