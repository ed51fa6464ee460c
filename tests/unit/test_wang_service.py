"""Wang 2021's policies created in the service with only what a campaign declares (the W1 world: a Pareto
delay of scale 60 s, 20 decisions a second): CLW gets a bound it can serve with, the ARS rounds the median
delay, and a bound of millions of slots no longer turns the first /choose into a 500."""

from __future__ import annotations

import math
from pathlib import Path

from latebandit.config import Settings
from tests.inprocess import ManualClock, served

W1 = {
    "arms": ["a", "b", "c", "d"],
    "delay": {"family": "pareto", "alpha": 1.5, "scale": 60},
    "decisions_per_second": 20,
}


async def test_planning_policies_of_wang_serve_at_their_defaults(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, database_url=f"sqlite:///{tmp_path / 'audit.db'}")  # type: ignore[arg-type]
    campaigns = {
        "clw": {"name": "clw"},
        "clw-huge": {"name": "clw", "params": {"max_delay": 3_600_000}},
        "ucb": {"name": "ars-ucb"},
        "exp3": {"name": "ars-exp3"},
    }
    async with served(settings, ManualClock()) as http:
        for campaign, policy in campaigns.items():
            created = await http.post("/campaigns", json={**W1, "id": campaign, "policy": policy})
            assert created.status_code == 201, created.text
            for _ in range(3):
                answer = await http.post("/choose", json={"campaign": campaign})
                assert answer.status_code == 200, (campaign, answer.text)
        resolved = {
            name: (await http.get(f"/campaigns/{name}")).json()["policy"]["resolved_params"] for name in campaigns
        }
    assert resolved["clw"]["max_delay"] == math.ceil(20 * 60 * 2 ** (1 / 1.5) / math.e)  # 701 slots
    assert resolved["clw-huge"]["max_delay"] == 3_600_000
    assert resolved["ucb"]["round_unit"] == resolved["exp3"]["round_unit"] == math.ceil(20 * 60 * 2 ** (1 / 1.5))
