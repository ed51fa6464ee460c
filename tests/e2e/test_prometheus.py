"""The operator's view end to end: a real Prometheus scrapes a real `latebandit serve --workers 2` (Redis and
PostgreSQL each behind a proxy the test cuts), with deploy/prometheus.yml's scrape settings and
deploy/alerts.yml's rules (each ``for:`` shortened). Every expression of the Grafana dashboard answers
with data; the store and audit database alerts fire when the test partitions Redis or PostgreSQL under
traffic, and resolve when it heals them; the decision counter Prometheus reads, summed over both workers
by prometheus-client's multiprocess mode, is exactly the number of decisions the clients were answered."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.multiprocess import MultiProcessCollector

from tests.conftest import installed
from tests.deploy.promql import ALERTS, DEPLOY, dashboard_expressions
from tests.e2e.server import Server, cli, free_port, running, service_env
from tests.e2e.test_client import OFFER, RANKED
from tests.e2e.test_embedded import CAMPAIGN, iso
from tests.e2e.test_faults import NAMES, create_campaigns, workers
from tests.e2e.test_planning import ODAAF
from tests.e2e.traffic import Fleet, Gate, Plan, now_iso
from tests.faults import tcp_proxy
from tests.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]

SPAWN = multiprocessing.get_context("spawn")
DECIDE_KEY, ADMIN_KEY, METRICS_KEY = (f"{scope}-{uuid.uuid4().hex}" for scope in ("decide", "admin", "metrics"))
FOR = "3s"  # every rule's `for:` in the test's copy (minutes in deploy/alerts.yml)
WAIT = 90.0  # seconds any one awaited change may take on a loaded machine (a bound, not an expectation)
LAG_SEEN = 3.0  # seconds of audit lag that only an outage explains (drains run every 0.2 s)
MAY_BE_ZERO = {  # dashboard expressions whose value is legitimately 0 on a healthy service, and why
    "max(latebandit_audit_backlog)": "the audit queue is drained to 0 entries between the writer's passes",
}


@dataclass
class Prometheus:
    url: str

    def query(self, expression: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's series as (labels, value)."""
        answer = httpx.post(f"{self.url}/api/v1/query", data={"query": expression}, timeout=30.0).json()
        assert answer["status"] == "success", (expression, answer)
        return [(series["metric"], float(series["value"][1])) for series in answer["data"]["result"]]

    def value(self, expression: str) -> float | None:
        series = self.query(expression)
        return series[0][1] if series else None

    def alerts(self, state: str = "firing") -> dict[str, list[dict[str, str]]]:
        """The labels of each alert in ``state`` (pending or firing; a resolved alert is not listed)."""
        answer = httpx.get(f"{self.url}/api/v1/alerts", timeout=30.0).json()
        found: dict[str, list[dict[str, str]]] = {}
        for alert in answer["data"]["alerts"]:
            if alert["state"] == state:
                found.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return found

    def active(self) -> set[str]:
        return set(self.alerts("pending")) | set(self.alerts("firing"))


@contextlib.contextmanager
def prometheus(workdir: Path, target: str) -> Iterator[Prometheus]:
    """Prometheus (Debian's package; fails under CI, skips elsewhere when it is missing) scraping ``target``
    every second with deploy/prometheus.yml's job and the rules of deploy/alerts.yml, whose ``for:`` are
    shortened to FOR; its database in ``workdir``."""
    executable = installed("prometheus", "prometheus")
    workdir.mkdir()
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    (workdir / job["authorization"]["credentials_file"]).write_text(METRICS_KEY + "\n")  # beside, as in compose
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = FOR
    assert config["rule_files"] == [ALERTS.name]
    (workdir / ALERTS.name).write_text(yaml.safe_dump(rules))
    port = free_port()
    with open(workdir / "prometheus.log", "wb") as log:
        process = subprocess.Popen(
            [executable, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:

        def ready() -> bool:
            assert process.poll() is None, (workdir / "prometheus.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{server.url}/-/ready", timeout=1.0).status_code == 200
            return False

        until(ready, "Prometheus answering", timeout=WAIT)
        yield server
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Requests:
    """The test's own requests (besides the clients'), keeping count of the decisions it was answered."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.http = server.client(headers=admin())
        self.decisions = 0

    def choose(self, campaign: str, fresh: bool = False, **offer: object) -> dict:
        """A /choose (with a contextual campaign's ``offer``); ``fresh``: on a new connection, which either
        worker may accept."""
        with self.server.client(headers=admin()) if fresh else contextlib.nullcontext(self.http) as http:
            answer = http.post("/choose", json={"campaign": campaign, **offer})
        assert answer.status_code == 200, answer.text
        self.decisions += 1
        return answer.json()

    def feedback(self, *events: dict) -> dict:
        answer = self.http.post("/feedback", json={"events": list(events)})
        assert answer.status_code == 200, answer.text
        return answer.json()

    def close(self) -> None:
        self.http.close()


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def conversion(decision: dict, occurred_at: str | None = None) -> dict:
    return {"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": occurred_at or now_iso()}


def feed_every_panel(requests: Requests, prom: Prometheus) -> None:
    """What the clients' attributed traffic on NAMES does not show: censored conversions ("brief", whose
    1 s window they miss), decisions of a paused campaign and feedback refused for it, a forged decision id,
    a planning campaign's decisions with an aggregate and a watermark ("banner"), and a contextual
    campaign's model gauges, published as it serves (nothing asks its GET /state)."""
    http = requests.http
    for spec in ({**CAMPAIGN, "id": "brief", "window": 1.0}, {**CAMPAIGN, "id": "quiet"},
                 {**ODAAF, "id": "banner", "policy": {"name": "ars-ucb"}}, RANKED):  # fmt: skip
        assert http.post("/campaigns", json=spec).status_code == 201
    requests.feedback(conversion(requests.choose("ranked", actions=OFFER)))
    gauges = [f'max(latebandit_model_{name}{{campaign="ranked"}})'
              for name in ("pending_decisions", "correction_share", "theta_norm")]  # fmt: skip

    def model_shown() -> bool:  # a decision a snapshot read after the conversion publishes it: θ̂ ≠ 0
        requests.choose("ranked", actions=OFFER)
        return all((prom.value(gauge) or 0) > 0 for gauge in gauges)

    eventually(model_shown, "the contextual campaign's model gauges, each above 0", prom)
    early = [requests.choose("brief") for _ in range(2)]
    since = datetime.now(UTC)
    decided = [requests.choose("banner") for _ in range(10)]
    assert http.post("/campaigns/quiet/pause").json()["status"] == "paused"
    paused = [requests.choose("quiet") for _ in range(3)]
    assert all(decision["fallback"] for decision in paused)
    forged = {**conversion(decided[0]), "decision_id": decided[0]["decision_id"][:-4] + "AAAA"}
    now = datetime.now(UTC)
    aggregate = {"type": "aggregate", "campaign": "banner", "start": iso(since), "end": iso(now), "value": 4}
    answer = requests.feedback(conversion(paused[0]), forged, aggregate,
                               {"type": "watermark", "campaign": "banner", "at": iso(now)})  # fmt: skip
    assert {item["reason"] for item in answer["rejected"]} == {"campaign_paused", "bad_decision_id"}
    until(lambda: datetime.now(UTC) > since + timedelta(seconds=1.5), "the brief window passing")
    assert requests.feedback(conversion(early[0]))["censored"] == 1
    # A labelled counter starts to exist at its first increase, which rate() cannot see: another one after.
    censored = 'latebandit_feedback_events_total{campaign="brief", outcome="censored"}'
    eventually(lambda: prom.value(censored) is not None, "Prometheus seeing the first censored conversion")
    assert requests.feedback(conversion(early[1]))["censored"] == 1
    requests.choose("brief")  # a histogram read after the censored conversions: its per-arm gauges


def per_worker_decisions(server: Server) -> dict[int, float]:
    """latebandit_decisions_total of each worker, from the files prometheus-client's multiprocess mode
    keeps per process in the directory `serve` gave the workers."""
    environ = Path(f"/proc/{workers(server)[0]}/environ").read_bytes().split(b"\0")
    directory = dict(item.decode().split("=", 1) for item in environ if b"=" in item)["PROMETHEUS_MULTIPROC_DIR"]
    totals = {}
    for path in Path(directory).glob("counter_*.db"):
        metrics = MultiProcessCollector.merge([str(path)])
        samples = [sample for metric in metrics for sample in metric.samples]
        totals[int(path.stem.split("_")[1])] = sum(s.value for s in samples if s.name == "latebandit_decisions_total")
    return totals


def dashboard_shows_data(prom: Prometheus, nonzero: bool) -> list[str]:
    """The dashboard's expressions that answer no series with a finite value (or, with ``nonzero``, none
    with a finite value other than 0, unless MAY_BE_ZERO says why it may be 0)."""
    missing = []
    for expression in dashboard_expressions():
        assert "$" not in expression, f"a dashboard variable to fill in: {expression}"
        values = [value for _, value in prom.query(expression) if math.isfinite(value)]
        if nonzero and expression not in MAY_BE_ZERO:
            values = [value for value in values if value != 0]
        if not values:
            missing.append(expression)
    return missing


def eventually(condition: Callable[[], bool], what: str, prom: Prometheus | None = None) -> None:
    """``until`` with WAIT; on failure, what Prometheus's alerts were (when given ``prom``)."""
    try:
        until(condition, what, timeout=WAIT)
    except AssertionError as failure:
        if prom is None:
            raise
        raise AssertionError(f"{failure}; pending {prom.alerts('pending')}, firing {prom.alerts()}") from None


def until_dashboard_shows_data(prom: Prometheus, nonzero: bool) -> None:
    """Until every expression of the dashboard answers (dashboard_shows_data); fails naming those that
    still do not."""
    missing: list[str] = []

    def complete() -> bool:
        missing[:] = dashboard_shows_data(prom, nonzero)
        return not missing

    with contextlib.suppress(AssertionError):
        eventually(complete, "every dashboard panel with data")
    assert not missing, f"dashboard expressions without data: {missing}"


def test_prometheus_scrapes_the_workers_and_the_alerts_fire_and_resolve(
    tmp_path, redis_url, redis_prefix, postgres_url
) -> None:
    cli(service_env(tmp_path, database_url=postgres_url), tmp_path, "migrate")
    keys = f"decide:{DECIDE_KEY},admin:{ADMIN_KEY},metrics:{METRICS_KEY}"
    with (
        tcp_proxy(redis_url) as (redis_proxy, proxied_redis),
        tcp_proxy(postgres_url) as (pg_proxy, proxied_pg),
        running(
            service_env(tmp_path, redis_url=proxied_redis, redis_prefix=redis_prefix, database_url=proxied_pg,
                        api_keys=keys, metrics_access="key"),
            tmp_path, workers=2,
        ) as server,
        prometheus(tmp_path / "prometheus", server.url.removeprefix("http://")) as prom,
        contextlib.closing(Requests(server)) as requests,
    ):  # fmt: skip
        # Counts before Prometheus's first scrape would be invisible to rate(): wait for it.
        eventually(lambda: prom.value('up{job="latebandit"}') is not None, "a first scrape")
        assert prom.value('up{job="latebandit"}') == 1  # the scrape sends the metrics key
        create_campaigns(requests.http)
        gate = Gate.make(SPAWN)
        plan = Plan(server.url, NAMES, decisions=100_000, headers={"Authorization": f"Bearer {DECIDE_KEY}"})
        fleet = Fleet.start(plan, clients=1, gate=gate, context=SPAWN)
        try:
            feed_every_panel(requests, prom)
            # Both workers serve decisions (new connections go to either), so that the sum is a sum.
            eventually(lambda: bool(requests.choose(NAMES[0], fresh=True))
                       and sum(count > 0 for count in per_worker_decisions(server).values()) >= 2,
                       "both workers serving decisions")  # fmt: skip
            until_dashboard_shows_data(prom, nonzero=False)
            eventually(lambda: [alert["campaign"] for alert in prom.alerts().get("LatebanditDelaysExceedWindow", [])]
                       == ["brief"], "the censored share alert firing for brief alone", prom)  # fmt: skip
            assert not prom.active() & {"LatebanditDown", "LatebanditRedisUnreachable", "LatebanditFallbackDecisions",
                                        "LatebanditAuditDatabaseDown"}  # fmt: skip

            redis_proxy.cut()  # fallback decisions; the clients retry their /feedback (503) meanwhile

            def redis_alerts() -> bool:
                for _ in range(5):
                    assert requests.choose(NAMES[0])["fallback"] is True  # decisions go on, as fallbacks
                return {"LatebanditRedisUnreachable", "LatebanditFallbackDecisions"} <= set(prom.alerts())

            eventually(redis_alerts, "the Redis alerts firing", prom)
            assert prom.value("min(latebandit_store_up)") == 0
            redis_proxy.restore()
            eventually(lambda: "LatebanditRedisUnreachable" not in prom.active(), "the Redis alert resolving", prom)

            pg_proxy.cut()  # the clients go on, unaware
            eventually(lambda: "LatebanditAuditDatabaseDown" in prom.alerts(), "the audit database alert firing", prom)
            eventually(lambda: (prom.value("max(latebandit_audit_lag_seconds)") or 0) > LAG_SEEN, "the lag growing")
            pg_proxy.restore()
            eventually(lambda: "LatebanditAuditDatabaseDown" not in prom.active(), "the audit alert resolving", prom)
            eventually(lambda: (prom.value("max(latebandit_audit_lag_seconds)") or 0) < LAG_SEEN, "the lag falling")

            gate.finish.set()
            ledger = fleet.join()
        finally:
            for process in fleet.processes:  # a failed test leaves no client retrying against a stopped server
                process.terminate()
        assert ledger.retries["/feedback 503"] > 0, ledger.retries  # the clients' traffic went on through it
        done = time.time()
        eventually(lambda: (prom.value('timestamp(up{job="latebandit"})') or 0) > done, "a scrape after the traffic")
        answered = len(ledger.decisions) + requests.decisions  # every /choose answered, once
        assert prom.value("sum(latebandit_decisions_total)") == answered
        assert prom.value("sum(latebandit_decision_seconds_count)") == answered
        per_worker = per_worker_decisions(server)
        assert sum(per_worker.values()) == answered, per_worker
        until_dashboard_shows_data(prom, nonzero=True)  # the error panels too, after the outages
