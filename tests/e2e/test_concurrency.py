"""Many clients on the same campaigns at once: several processes, many keep-alive connections, two uvicorn
workers, each request sometimes repeated as after a lost answer. Counts are exact in GET /state and in the
audit log, per campaign and per arm. Then the same on a three-master Redis Cluster, with a rebuild.

(Anonymous-feedback policies with block schedules (ODAAF) are not built yet; their block lengths are to be
added here when they are.)"""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime, timedelta

import pytest
import redis

from tests.e2e.server import cli, running, service_env
from tests.e2e.test_embedded import CAMPAIGN, assert_same_state
from tests.e2e.traffic import Fleet, Plan, assert_exact, wait_for_audit

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]

SPAWN = multiprocessing.get_context("spawn")
CAMPAIGNS = [
    {**CAMPAIGN, "id": "klucb"},
    {**CAMPAIGN, "id": "ucb", "policy": {"name": "ucb1", "params": {}}, "delay": {"family": "unknown"}},
    {**CAMPAIGN, "id": "ts", "policy": {"name": "thompson", "params": {}}, "delay": {"family": "unknown"}},
]
NAMES = [campaign["id"] for campaign in CAMPAIGNS]


def drive(url: str, clients: int, connections: int, decisions: int) -> object:
    plan = Plan(url, NAMES, decisions=decisions, batch=5, connections=connections, repeat=0.2)
    return Fleet.start(plan, clients=clients, context=SPAWN).join()


def test_many_clients_same_campaigns_exact_counts(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url)
    cli(env, tmp_path, "migrate")
    with running(env, tmp_path, workers=2) as server, server.client() as http:
        for campaign in CAMPAIGNS:
            assert http.post("/campaigns", json=campaign).status_code == 201
        ledger = drive(server.url, clients=4, connections=6, decisions=25)
        assert len(ledger.decisions) == 4 * 6 * 25 and not ledger.fallbacks and not ledger.retries
        wait_for_audit(redis_url, redis_prefix, NAMES)
        assert_exact(http, ledger, NAMES, postgres_url)


def test_redis_cluster_end_to_end(tmp_path, redis_cluster_url, postgres_url) -> None:
    """The service on a three-master cluster: campaigns land on different masters, every script and key
    layout works, counts are exact; after the cluster loses the state, `latebandit rebuild` restores it."""
    env = service_env(tmp_path, redis_url=redis_cluster_url, redis_cluster="true", database_url=postgres_url)
    cli(env, tmp_path, "migrate")
    cluster = redis.RedisCluster.from_url(redis_cluster_url)
    slots = {cluster.keyslot(f"lb:{{{name}}}:counters") for name in NAMES}
    owners = {cluster.get_node_from_key(f"lb:{{{name}}}:counters").name for name in NAMES}
    assert len(slots) == 3 and len(owners) >= 2  # the campaigns really are spread over the masters
    with running(env, tmp_path, workers=2) as server, server.client() as http:
        for campaign in CAMPAIGNS:
            assert http.post("/campaigns", json=campaign).status_code == 201
        ledger = drive(server.url, clients=2, connections=4, decisions=20)
        wait_for_audit(redis_cluster_url, "lb", NAMES, cluster=True)
        assert_exact(http, ledger, NAMES, postgres_url)
        later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        before = {name: http.get(f"/campaigns/{name}/state", params={"at": later}).json() for name in NAMES}
        for node in cluster.get_primaries():
            client = cluster.get_redis_connection(node)
            for key in client.scan_iter(match="lb:*"):
                client.delete(key)
        assert http.post("/choose", json={"campaign": NAMES[0]}).json()["fallback"] is True
        cli(env, tmp_path, "rebuild")
        for name in NAMES:
            assert_same_state(before[name], http.get(f"/campaigns/{name}/state", params={"at": later}).json())
        assert http.post("/choose", json={"campaign": NAMES[0]}).json()["fallback"] is False
    cluster.close()
