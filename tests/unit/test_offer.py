"""An offer is checked against its campaign in one pass over its norms, which a nan or an infinity fails too:
the engine refuses what the API's validation would (a caller in process, such as the load test, skips it)."""

from __future__ import annotations

import numpy as np
import pytest

from latebandit.campaign import Campaign, CampaignSpec
from latebandit.engine.contextual import Offer, OfferInvalid

CAMPAIGN = Campaign(**CampaignSpec(id="c", policy={"name": "linucb"}, features=2, window=60.0).model_dump(),
                    created_at=0)  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "field", "reason"),
    [
        ([[0.6, 0.8], [np.nan, 0.0]], "actions", "finite"),
        ([[np.inf, 0.0]], "actions", "finite"),
        ([[0.6, 0.8], [0.8, 0.8]], "actions[1]", "norm 1.13137 > 1"),
        ([[0.6, 0.8, 0.0]], "actions", "3 numbers"),
    ],
)
def test_an_offer_that_does_not_fit_names_its_field(rows, field, reason) -> None:
    offer = Offer.of_request([(f"a{k}", row) for k, row in enumerate(rows)], None)
    assert offer is not None
    with pytest.raises(OfferInvalid, match=reason) as refused:
        offer.check(CAMPAIGN)
    assert refused.value.field == field


def test_unit_norms_are_taken() -> None:
    offer = Offer.of_request([("a", [0.6, 0.8]), ("b", [1.0, 0.0]), ("c", [0.0, 0.0])], None)
    assert offer is not None
    offer.check(CAMPAIGN)
