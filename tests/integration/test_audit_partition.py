"""A network partition in the middle of an audit transaction: the database never learns that the writer's
connection is gone, so the orphaned transaction keeps the locks of the rows it inserted. The writer's retry
of the same rows must get through once the server ends that transaction, not wait on its locks until the
statement times out (and again on every retry, for as long as the server's TCP keepalive takes: hours)."""

from __future__ import annotations

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from latebandit.audit.log import AuditLog
from latebandit.audit.queue import QueueEntry
from latebandit.config import Settings
from tests.faults import tcp_proxy

pytestmark = pytest.mark.postgres

ENTRIES = [QueueEntry("c", "1-0", [{"type": "campaign", "campaign": "c", "at": 0, "action": "create"}])]


def sqlalchemy_url(plain: str) -> str:
    return Settings(_env_file=None, database_url=plain).sqlalchemy_url


def test_a_write_cut_before_its_commit_does_not_block_the_retry(postgres_url: str) -> None:
    direct = AuditLog(sqlalchemy_url(postgres_url))
    direct.create_schema()
    with tcp_proxy(postgres_url) as (proxy, proxied_url):
        partitioned = AuditLog(sqlalchemy_url(proxied_url))
        event.listen(partitioned.engine, "commit", lambda _connection: proxy.cut())  # the rows are inserted
        with pytest.raises(OperationalError):
            partitioned.write(ENTRIES)
        assert direct.write(ENTRIES) == 1  # waits for the orphan to be ended, then inserts
        assert direct.write(ENTRIES) == 0
        with direct.engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM audit_campaign_events").scalar() == 1
        partitioned.dispose()
    direct.dispose()
