"""When to send a request again: on a 503 and on a connection error only, with exponential backoff and
jitter, within a bounded number of attempts and a bounded total time.

Both are answers after which the service promises nothing was partly applied that a retry would double
(a 503 of /feedback; a 503 of /choose made no decision), or after which the request may have been applied
whole, which the request's identity makes harmless: /choose is retried with the same ``request_id`` (the
service returns the decision it made), /feedback with the same event ids (applied events come back as
``duplicates``). Nothing else is retried: a 4xx would be refused again, and a 500 is a fault in the
service that the contract does not call transient. Timeouts are connection errors here: the request may
or may not have arrived, and the identity makes both cases safe.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import httpx

from latebandit.client.protocol import ClientError, Unreachable, service_error

RETRYABLE_STATUSES = frozenset({503})
log = logging.getLogger("latebandit.client")


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` sends at most (the first included), none started later than ``total`` seconds after the
    first. The n-th wait is drawn in [b/2, b] with b = min(``max_wait``, ``first_wait`` · 2^(n-1)) seconds
    ("equal jitter": clients that failed together do not retry together), and is at least the answer's
    ``Retry-After`` when it has one (capped at ``max_wait``)."""

    attempts: int = 5
    total: float = 30.0
    first_wait: float = 0.1
    max_wait: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.total < 0 or not 0 < self.first_wait <= self.max_wait:
            raise ValueError(f"a retry policy needs attempts >= 1, total >= 0 and 0 < first_wait <= max_wait: {self}")

    def wait(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number ``retry`` (1 for the first retry)."""
        bound = min(self.max_wait, self.first_wait * 2.0 ** (retry - 1))
        return rng.uniform(bound / 2, bound)

    def start(self, now: float) -> Attempts:
        return Attempts(self, now)


NO_RETRY = RetryPolicy(attempts=1)


@dataclass
class Attempts:
    """One request's retry state. ``verdict`` is pure given the clock reading, so the sync and async clients
    share it and differ only in how they send and sleep."""

    policy: RetryPolicy
    started: float
    made: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def verdict(self, outcome: httpx.Response | httpx.TransportError, now: float) -> httpx.Response | float:
        """After one send: the response to use (any that is not a 503), or the seconds to wait before sending
        again; raises ``Unreachable`` or the 503's ``ServiceError`` once the budget is spent."""
        self.made += 1
        if isinstance(outcome, httpx.Response) and outcome.status_code not in RETRYABLE_STATUSES:
            return outcome
        wait = self.policy.wait(self.made, self.rng)
        if isinstance(outcome, httpx.Response):
            wait = max(wait, min(self.policy.max_wait, retry_after(outcome)))
        if self.made >= self.policy.attempts or now + wait - self.started > self.policy.total:
            raise self.failure(outcome)
        log.warning("retrying in %.2f s (attempt %d of %d): %s", wait, self.made + 1, self.policy.attempts,
                    describe(outcome))  # fmt: skip
        return wait

    def failure(self, outcome: httpx.Response | httpx.TransportError) -> ClientError:
        if isinstance(outcome, httpx.Response):
            return service_error(outcome, self.made)
        error = Unreachable(outcome, self.made)
        error.__cause__ = outcome
        return error


def retry_after(response: httpx.Response) -> float:
    """The answer's ``Retry-After`` in seconds (the service sends whole seconds; a date form counts as 0)."""
    try:
        return max(0.0, float(response.headers.get("retry-after", 0)))
    except ValueError:
        return 0.0


def describe(outcome: httpx.Response | httpx.TransportError) -> str:
    if isinstance(outcome, httpx.Response):
        return f"{outcome.status_code} {outcome.text[:200]}"
    return repr(outcome)
