"""deploy/, docker-compose.yml and the Dockerfile, checked without a container engine or a cluster: the
PromQL parses, promtool accepts the Prometheus files, the Kubernetes manifests build into the official
client's models (required fields, known fields, types), and the compose file refers to services, ports,
files and settings that exist."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from latebandit.config import Settings, UnsafeSettings
from tests.conftest import installed, missing
from tests.deploy.promql import ALERTS, DASHBOARD, DEPLOY, alert_rules, dashboard_expressions, metric_names

ROOT = DEPLOY.parent
KUBERNETES = DEPLOY / "kubernetes"
SETTINGS = {f"LATEBANDIT_{name.upper()}" for name in Settings.model_fields}
ALERTS_ASKED = {  # issue 9: what the rules must watch, by the metric that shows it
    "LatebanditRedisUnreachable": "latebandit_store_up",
    "LatebanditAuditBacklogGrowing": "latebandit_audit_backlog",
    "LatebanditFallbackDecisions": "latebandit_decisions_total",
    "LatebanditFeedbackRejectionsSpiking": "latebandit_feedback_rejected_total",
    "LatebanditDelaysExceedWindow": "latebandit_feedback_events_total",
    "LatebanditChooseLatencyHigh": "latebandit_decision_seconds_bucket",
}


# Prometheus -------------------------------------------------------------------------------------------


def test_every_alert_and_dashboard_expression_parses() -> None:
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} >= ALERTS_ASKED.keys()
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning"} and rule["annotations"]["summary"]
        assert metric_names(rule["expr"]), rule["alert"]
    for name, metric in ALERTS_ASKED.items():
        assert metric in metric_names(next(rule["expr"] for rule in rules if rule["alert"] == name))
    expressions = dashboard_expressions()
    assert len(expressions) > 20
    for expression in expressions:
        assert metric_names(expression), expression


def test_the_parser_refuses_broken_promql() -> None:
    """The check above can fail: a broken expression is refused."""
    with pytest.raises(ValueError):
        metric_names("sum(rate(latebandit_decisions_total[5m])")
    with pytest.raises(ValueError):
        metric_names("rate(latebandit_decisions_total[5x])")


def test_promtool_accepts_the_config_and_the_rules_and_their_unit_tests_pass(tmp_path: Path) -> None:
    """deploy/alerts_test.yml: each alert fires on synthetic series of its situation, and only then. The files
    are checked as Prometheus's container sees them: with the metrics key compose mounts beside them.
    .ci/run installs promtool (Debian package prometheus), so CI never skips this."""
    promtool = installed("promtool", "prometheus")
    for name in ("prometheus.yml", ALERTS.name, "alerts_test.yml"):
        shutil.copy(DEPLOY / name, tmp_path / name)
    (tmp_path / scrape_config()["authorization"]["credentials_file"]).write_text("metrics-key-for-promtool\n")
    checks = (
        ["check", "config", "prometheus.yml"],
        ["check", "rules", ALERTS.name],
        ["test", "rules", "alerts_test.yml"],
    )
    for command in checks:
        result = subprocess.run([promtool, *command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def scrape_config() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["scrape_configs"][0]


# Grafana ----------------------------------------------------------------------------------------------


def test_dashboard_is_provisioned_from_the_prometheus_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert {panel["datasource"]["uid"] for panel in panels} == {uid}
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    variable = dashboard["templating"]["list"][0]
    assert variable["name"] == "campaign" and metric_names(variable["definition"].split("(", 1)[1].split(",")[0])
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/latebandit.yml").read_text())
    mounts = compose()["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{provider['providers'][0]['options']['path']}:ro" in mounts
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


# docker-compose.yml -----------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


COMPOSE_VARIABLE = re.compile(r"\$\{(\w+)(?::?[-?][^}]*)?\}")


def interpolated(environment: dict[str, str], variables: dict[str, str]) -> dict[str, str]:
    """A service's environment as compose passes it, each ``${NAME...}`` taken from ``variables``."""
    return {key: COMPOSE_VARIABLE.sub(lambda found: variables[found[1]], value) for key, value in environment.items()}


def test_compose_takes_the_secret_and_keys_from_the_environment_and_prometheus_the_metrics_key() -> None:
    """No secret or key is written in the file (a published one would let anyone forge decision ids), and
    Prometheus sends the metrics key the API accepts, from where the scrape configuration reads it."""
    top = compose()
    environment = top["services"]["api"]["environment"]
    assert COMPOSE_VARIABLE.fullmatch(environment["LATEBANDIT_SECRET"])
    keys = dict(pair.split(":", 1) for pair in environment["LATEBANDIT_API_KEYS"].split(","))
    assert keys.keys() == {"decide", "admin", "metrics"}
    assert all(COMPOSE_VARIABLE.fullmatch(key) for key in keys.values())
    (mount,) = top["services"]["prometheus"]["secrets"]
    assert top["secrets"][mount["source"]] == {"environment": COMPOSE_VARIABLE.fullmatch(keys["metrics"])[1]}
    assert mount["target"] == f"/etc/prometheus/{scrape_config()['authorization']['credentials_file']}"
    assert scrape_config()["authorization"]["type"] == "Bearer"


def test_compose_services_ports_files_and_settings_exist() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "postgres", "migrate", "api", "prometheus", "grafana"}
    for name, service in services.items():
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
        for key in service.get("environment", {}):
            if key.startswith("LATEBANDIT_"):
                assert key in SETTINGS, f"{name} sets {key}, which is no setting"
    api = services["api"]
    command = api["command"]
    assert command[:2] == ["latebandit", "serve"] and int(command[command.index("--workers") + 1]) > 1
    port = command[command.index("--port") + 1]
    assert f"{port}:{port}" in api["ports"]
    assert api["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert services["migrate"]["command"] == ["latebandit", "migrate"]
    assert services["migrate"]["environment"] == api["environment"]
    assert api["environment"]["LATEBANDIT_API_KEYS"]  # a non-loopback bind needs keys
    hosts = {re.search(r"//(?:[^@/]*@)?([^:/]+):(\d+)", api["environment"][key]).groups()
             for key in ("LATEBANDIT_REDIS_URL", "LATEBANDIT_DATABASE_URL")}  # fmt: skip
    assert hosts == {("redis", "6379"), ("postgres", "5432")}
    assert scrape_config()["static_configs"][0]["targets"] == [f"api:{port}"]
    assert any(mount.endswith("/etc/prometheus/alerts.yml:ro") for mount in services["prometheus"]["volumes"])
    spool = api["environment"]["LATEBANDIT_SPOOL_DIR"]  # on a volume that outlives the container
    sources = {mount.split(":")[1]: mount.split(":")[0] for mount in api["volumes"]}
    assert sources[spool] in compose()["volumes"]  # a named volume


def published(entry: str | dict[str, Any]) -> tuple[str, str]:
    """(host address, host port) of a compose ``ports`` entry, short ("[IP:]HOST:CONTAINER") or long form;
    the address is "" when the port is published on every interface."""
    if isinstance(entry, dict):
        return entry.get("host_ip", ""), str(entry.get("published", ""))
    parts = str(entry).rsplit(":", 2)
    return (parts[0] if len(parts) == 3 else ""), (parts[-2] if len(parts) > 1 else "")


def test_only_the_api_listens_beyond_loopback_and_it_restarts() -> None:
    """Redis and PostgreSQL (password in this file), Prometheus and Grafana (admin/admin) trust whoever reaches
    them: published on 127.0.0.1 only. The API checks keys on every interface, and comes back after a crash."""
    overlay = yaml.safe_load((ROOT / "docker-compose.audit-writer.yml").read_text())["services"]
    for services in (compose()["services"], overlay):
        for name, service in services.items():
            for entry in service.get("ports", []):
                address, _ = published(entry)
                assert name == "api" or address == "127.0.0.1", f"{name} publishes {entry} beyond loopback"
    assert compose()["services"]["api"]["restart"] in {"always", "unless-stopped", "on-failure"}


def test_the_published_port_parser() -> None:
    assert published("6379:6379") == ("", "6379")
    assert published("127.0.0.1:6379:6379") == ("127.0.0.1", "6379")
    assert published({"target": 80, "published": 8080, "host_ip": "127.0.0.1"}) == ("127.0.0.1", "8080")


# Dockerfile -------------------------------------------------------------------------------------------


def docker_ignored(path: str, patterns: list[str]) -> bool:
    """Whether the build context leaves ``path`` out: the last .dockerignore pattern matching it or one of
    its parent folders decides ("!" keeps); ``*`` stays within a path segment, ``**`` crosses them."""
    ignored = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        body = pattern.removeprefix("!").strip("/")
        expression = "".join(
            ".*" if token == "**" else "[^/]*" if token == "*" else "[^/]" if token == "?" else re.escape(token)
            for token in re.split(r"(\*\*|\*|\?)", body)
            if token
        )
        expression = expression.replace(".*/", "(?:.*/)?")  # "**/x" also matches x at the top
        segments = path.split("/")
        if any(re.fullmatch(expression, "/".join(segments[:end])) for end in range(1, len(segments) + 1)):
            ignored = not keep
    return ignored


def test_the_build_context_holds_what_the_dockerfile_copies_and_nothing_local() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    copied = [source for instruction, argument in dockerfile_instructions() if instruction == "COPY"
              and not argument.startswith("--from") for source in argument.split()[:-1]]  # fmt: skip
    assert copied and "service" in copied
    for source in copied:
        assert not docker_ignored(source, patterns), source
    assert not docker_ignored("service/latebandit/store/lua/choose.lua", patterns)
    local = [".venv/lib/python3.11/site-packages/numpy/__init__.py", ".git/HEAD", "latebandit.db",
             "latebandit.db.secret", "latebandit.db-wal", ".env", "latebandit-spool/lb/0.jsonl",
             ".pytest_cache/v/cache/lastfailed", ".mypy_cache/3.11/cache.db", "benchmarks/results/x.json",
             "service/latebandit/__pycache__/cli.cpython-311.pyc", "service/latebandit.egg-info/PKG-INFO",
             "some-new-dump.sql"]  # fmt: skip
    for path in local:
        assert docker_ignored(path, patterns), path


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def dockerfile_command(kind: str) -> list[str]:
    """The exec form (JSON array) of the CMD, or of the HEALTHCHECK's CMD."""
    argument = next(argument for instruction, argument in dockerfile_instructions() if instruction == kind)
    return json.loads(argument[argument.index("CMD") + 3 :] if kind == "HEALTHCHECK" else argument)


def test_dockerfile_is_multi_stage_non_root_with_a_healthcheck() -> None:
    instructions = dockerfile_instructions()
    stages = [argument for instruction, argument in instructions if instruction == "FROM"]
    assert len(stages) >= 2
    assert any(instruction == "COPY" and argument.startswith("--from=build") for instruction, argument in instructions)
    user = [argument for instruction, argument in instructions if instruction == "USER"][-1]
    assert user.split(":")[0] not in {"0", "root"}
    assert dockerfile_command("CMD")[:2] == ["latebandit", "serve"]
    assert "/healthz" in " ".join(dockerfile_command("HEALTHCHECK"))


# Kubernetes -------------------------------------------------------------------------------------------


def manifests() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    return [yaml.safe_load((KUBERNETES / name).read_text()) for name in kustomization["resources"]]


def as_model(data: Any, type_name: str, where: str) -> Any:
    """Build the official Kubernetes client's model of ``data``: a missing required field raises (the
    client validates on construction), an unknown field or a wrong type fails here."""
    from kubernetes.client import models

    if type_name.startswith("List["):
        assert isinstance(data, list), where
        return [as_model(item, type_name[5:-1], f"{where}[{i}]") for i, item in enumerate(data)]
    if type_name.startswith("Dict["):
        assert isinstance(data, dict), where
        value_type = type_name[5:-1].split(", ", 1)[1]
        return {key: as_model(value, value_type, f"{where}.{key}") for key, value in data.items()}
    scalar = {"str": str, "int": int, "bool": bool, "float": (int, float), "bytes": str}.get(type_name)
    if scalar is not None:
        assert isinstance(data, scalar) and not (scalar is int and isinstance(data, bool)), f"{where}: {data!r}"
        return data
    if type_name in {"object", "datetime"}:
        return data
    model = getattr(models, type_name)
    assert isinstance(data, dict), f"{where} must be a mapping"
    fields = {json_name: name for name, json_name in model.attribute_map.items()}
    unknown = data.keys() - fields.keys()
    assert not unknown, f"{where}: unknown fields {sorted(unknown)} for {type_name}"
    values = {
        fields[key]: as_model(value, model.openapi_types[fields[key]], f"{where}.{key}") for key, value in data.items()
    }
    return model(**values)


def model_name(manifest: dict[str, Any]) -> str:
    version = manifest["apiVersion"].split("/")[-1]
    return version[0].upper() + version[1:] + manifest["kind"]


def kubernetes_client() -> None:
    """The Kubernetes client (the test extra), which validates the manifests: missing, the check fails under CI."""
    if importlib.util.find_spec("kubernetes") is None:
        missing("the Kubernetes client is not installed (pip install -e '.[test]')")


def test_manifests_are_valid_kubernetes_objects() -> None:
    kubernetes_client()
    objects = manifests()
    assert {item["kind"] for item in objects} >= {"Deployment", "Service", "ConfigMap", "Secret",
                                                   "HorizontalPodAutoscaler", "Job"}  # fmt: skip
    for item in objects:
        assert item["metadata"]["name"]
        as_model(item, model_name(item), f"{item['kind']}/{item['metadata']['name']}")


def test_the_model_check_can_fail() -> None:
    kubernetes_client()
    with pytest.raises(ValueError, match="containers"):  # a required field missing
        as_model({"apiVersion": "v1", "kind": "Pod", "spec": {}}, "V1Pod", "pod")
    with pytest.raises(AssertionError, match="unknown fields"):
        as_model({"apiVersion": "v1", "kind": "Service", "spce": {}}, "V1Service", "service")


def test_manifests_fit_together() -> None:
    objects = {item["kind"]: item for item in manifests()}
    deployment, service, hpa, job = (
        objects[kind] for kind in ("Deployment", "Service", "HorizontalPodAutoscaler", "Job")
    )
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert {"livenessProbe", "readinessProbe"} <= container.keys()
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"  # not /readyz: see deployment.yaml
    assert {"cpu", "memory"} <= container["resources"]["limits"].keys()
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()  # the HPA's utilisation base
    port = container["command"][container["command"].index("--port") + 1]
    assert [p["containerPort"] for p in container["ports"]] == [int(port)]
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}  # fmt: skip
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["latebandit", "migrate"]
    for workload in (pod, job["spec"]["template"]):
        sources = workload["spec"]["containers"][0]["envFrom"]
        assert {source.get("configMapRef", source.get("secretRef"))["name"] for source in sources} == {
            objects["ConfigMap"]["metadata"]["name"], objects["Secret"]["metadata"]["name"]}  # fmt: skip
    settings = {**objects["ConfigMap"]["data"], **objects["Secret"]["stringData"]}
    assert settings.keys() <= SETTINGS
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    spool = volumes[mounts[settings["LATEBANDIT_SPOOL_DIR"]]]  # writable under the read-only root file system
    assert "emptyDir" in spool or "persistentVolumeClaim" in spool
    assert {"LATEBANDIT_API_KEYS", "LATEBANDIT_SECRET", "LATEBANDIT_DATABASE_URL"} <= objects["Secret"][
        "stringData"
    ].keys()


def test_the_manifests_placeholder_secret_is_refused_at_start() -> None:
    """Applied unedited, the Secret's placeholder would sign decision ids: the service refuses to start."""
    placeholder = next(item for item in manifests() if item["kind"] == "Secret")["stringData"]["LATEBANDIT_SECRET"]
    with pytest.raises(UnsafeSettings, match="LATEBANDIT_SECRET is a placeholder"):
        Settings(_env_file=None, secret=placeholder).check()


def test_the_manifests_placeholder_keys_are_refused_at_start() -> None:
    """Applied unedited, the Secret's placeholder keys would open the API to whoever read the manifest."""
    placeholders = next(item for item in manifests() if item["kind"] == "Secret")["stringData"]["LATEBANDIT_API_KEYS"]
    with pytest.raises(UnsafeSettings, match=r"^API key 1 of LATEBANDIT_API_KEYS \(decide\) is a placeholder"):
        Settings(_env_file=None, api_keys=placeholders).check()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_builds_the_manifests() -> None:
    result = subprocess.run(["kubectl", "kustomize", str(KUBERNETES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    built = list(yaml.safe_load_all(result.stdout))
    assert len(built) == len(manifests())
    assert {item["metadata"].get("namespace") for item in built if item["kind"] != "Namespace"} == {"latebandit"}


def test_the_audit_writer_overlays_fit_the_base() -> None:
    """docker-compose.audit-writer.yml and deploy/kubernetes/audit-writer run `latebandit audit-writer` with
    the base's settings and switch the API to LATEBANDIT_AUDIT_WRITER=external."""
    overlay = yaml.safe_load((ROOT / "docker-compose.audit-writer.yml").read_text())["services"]
    base = compose()["services"]
    writer = overlay["audit-writer"]
    assert writer["command"][:2] == ["latebandit", "audit-writer"]
    assert overlay["api"]["environment"] == {"LATEBANDIT_AUDIT_WRITER": "external"}
    for key in ("LATEBANDIT_REDIS_URL", "LATEBANDIT_DATABASE_URL"):
        assert writer["environment"][key] == base["api"]["environment"][key]
    assert set(writer["environment"]) <= SETTINGS and set(writer["depends_on"]) <= set(base)
    port = writer["command"][writer["command"].index("--metrics-port") + 1]
    assert port in writer["expose"] and "ports" not in writer  # its /metrics has no key: never published
    folder = KUBERNETES / "audit-writer"
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["..", "deployment.yaml"]
    (patch,) = kustomization["patches"]
    assert yaml.safe_load(patch["patch"]) == [
        {"op": "add", "path": "/data/LATEBANDIT_AUDIT_WRITER", "value": "external"}]  # fmt: skip
    deployment = yaml.safe_load((folder / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["latebandit", "audit-writer"]
    assert container["ports"][0]["containerPort"] == int(container["command"][-1])
    sources = {source.get("configMapRef", source.get("secretRef"))["name"] for source in container["envFrom"]}
    assert sources == {"latebandit-config", "latebandit-secrets"}
    if importlib.util.find_spec("kubernetes") is not None:
        as_model(deployment, model_name(deployment), "Deployment/latebandit-audit-writer")
