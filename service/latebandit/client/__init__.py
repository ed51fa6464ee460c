"""``latebandit.client``: call a latebandit service from Python, sync (``Client``) or asyncio (``AsyncClient``).

Decisions come back typed (``Decision``), feedback answers too (``FeedbackResult``). Event helpers draw each
event's id once, so retries (on 503 and connection errors only, ``RetryPolicy``) never count an event twice;
``send`` batches events in the background. How-to: docs/client.md.
"""

from latebandit.client.aio import AsyncClient
from latebandit.client.batching import Batching, BufferFull, DeliveryReport, FeedbackNotDelivered, Undelivered
from latebandit.client.events import Event, aggregate, conversion, new_event_id, watermark
from latebandit.client.protocol import (
    MAX_EVENTS,
    ClientError,
    Decision,
    FeedbackResult,
    Rejection,
    ServiceError,
    Unreachable,
)
from latebandit.client.retry import NO_RETRY, RetryPolicy
from latebandit.client.sync import Client

__all__ = [
    "MAX_EVENTS", "NO_RETRY", "AsyncClient", "Batching", "BufferFull", "Client", "ClientError", "Decision",
    "DeliveryReport", "Event", "FeedbackNotDelivered", "FeedbackResult", "Rejection", "RetryPolicy",
    "ServiceError", "Undelivered", "Unreachable", "aggregate", "conversion", "new_event_id", "watermark",
]  # fmt: skip
