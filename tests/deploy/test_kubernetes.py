"""deploy/kubernetes: every resource validates against the Kubernetes JSON schemas bundled in kubernetes-validate
(offline, strict: unknown fields fail) and the prometheus-operator resources against crd_schemas.py; the base and the
example overlay are rendered with `kubectl kustomize` when kubectl is installed (else the resource files are checked
one by one and the kustomizations' references resolved), and the rendered objects are checked for what the gateway
needs: probes, drain timing, security context, the config's hash suffix, selectors, autoscaling."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs installed (types-jsonschema is not a test tool)
import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information
import pytest
import yaml

from gateway.app import load_config

from .crd_schemas import SCHEMAS
from .deploy_testlib import (
    DEPLOY,
    KUBERNETES,
    KUSTOMIZATIONS,
    ROOT,
    RULES,
    file_level_resources,
    find,
    kubectl,
    kustomization,
    kustomize_build,
    load_yaml_documents,
    one,
)

# What the pods' environment takes from Secrets, as the tests read the configs.
SECRET_ENV = {"GATEWAY_LEDGER_URL": "postgresql://gateway:from-the-secret@postgres.db.svc:5432/gateway",
              "GATEWAY_ADMIN_TOKEN": "stand-in-admin-token-0123456789abcdef"}

# The oldest Kubernetes release the manifests are meant for, and the newest whose schemas kubernetes-validate has.
KUBERNETES_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
NO_KUBECTL = "kubectl (with its built-in kustomize) is not installed: patches and hash suffixes are not rendered"


def validate(doc: dict[str, Any]) -> None:
    schema = SCHEMAS.get((str(doc.get("apiVersion")), str(doc.get("kind"))))
    if schema is not None:
        jsonschema.Draft202012Validator(schema).validate(doc)
        return
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']} ({version}): {where}: {err.message}") from None


def resource_files(directory: Path) -> list[Path]:
    out: list[Path] = []
    for entry in kustomization(directory).get("resources", []):
        path = (directory / entry).resolve()
        out.extend(resource_files(path) if path.is_dir() else [path])
    return out


ALL_RESOURCE_FILES = sorted({p for d in KUSTOMIZATIONS for p in resource_files(d)})


# --- Files and references, with or without kustomize --------------------------------------------------------------


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(KUBERNETES)))
def test_kustomization_references_resolve(directory: Path) -> None:
    k = kustomization(directory)
    for entry in k.get("resources", []):
        path = directory / entry
        assert path.is_file() or (path / "kustomization.yaml").is_file(), f"resources: {entry} does not resolve"
    for generator in k.get("configMapGenerator", []):
        for item in generator.get("files", []):
            assert (directory / item.rpartition("=")[2]).is_file(), f"configMapGenerator: {item} missing"
    resources = file_level_resources(directory)
    known = {(d["kind"], d["metadata"]["name"]) for d in resources}
    for patch in k.get("patches", []):
        if "path" in patch:
            assert (directory / patch["path"]).is_file(), f"patches: {patch['path']} missing"
            for doc in load_yaml_documents(directory / patch["path"]):
                assert (doc["kind"], doc["metadata"]["name"]) in known, f"patch {patch['path']} targets nothing"
        else:
            target = patch["target"]
            group, version = target.get("group", ""), target.get("version")
            matched = [
                d for d in resources
                if (d["apiVersion"].rpartition("/")[0] == group)
                and (version is None or d["apiVersion"].rpartition("/")[2] == version)
                and target.get("kind", d["kind"]) == d["kind"]
                and target.get("name", d["metadata"]["name"]) == d["metadata"]["name"]
            ]
            assert matched, f"patch target {target} matches no resource"


@pytest.mark.parametrize("path", ALL_RESOURCE_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_each_resource_file_validates(path: Path) -> None:
    docs = load_yaml_documents(path)
    assert docs
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(KUBERNETES)))
def test_gateway_config_of_each_kustomization_is_valid(directory: Path) -> None:
    for generator in kustomization(directory).get("configMapGenerator", []):
        for item in generator.get("files", []):
            # raises ConfigError with every problem (the Secrets' values stand in for the pod's environment)
            load_config(directory / item.rpartition("=")[2], environ={**os.environ, **SECRET_ENV})


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(KUBERNETES)))
def test_pod_configs_carry_the_default_route_table(directory: Path) -> None:
    """The pods' configs repeat config/gateway.yaml's routes and chains (kustomize cannot read files outside its
    directory). If this fails, copy the routes part of config/gateway.yaml into the file named."""
    default = yaml.safe_load((ROOT / "config/gateway.yaml").read_text())
    for generator in kustomization(directory).get("configMapGenerator", []):
        for item in generator.get("files", []):
            path = directory / item.rpartition("=")[2]
            pod = yaml.safe_load(path.read_text())
            for key in ("global_chain", "routes", "catch_all"):
                assert pod.get(key) == default.get(key), f"{path.relative_to(ROOT)}: {key} differs from config/gateway.yaml"


# --- Rendered ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(KUBERNETES)))
def rendered(request: pytest.FixtureRequest) -> tuple[list[dict[str, Any]], bool]:
    """(resources, rendered by kustomize?)"""
    directory: Path = request.param
    if kubectl() is not None:
        return kustomize_build(directory), True
    return file_level_resources(directory), False


def test_rendered_resources_validate(rendered: tuple[list[dict[str, Any]], bool]) -> None:
    docs, _ = rendered
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "ServiceMonitor", "PrometheusRule"} <= kinds
    for doc in docs:
        validate(doc)


def _pod(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    deployment = one(docs, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "gateway")
    return deployment, spec, container


def _pod_config(docs: list[dict[str, Any]], spec: dict[str, Any], tmp_path: Path) -> Any:
    """The config the pod serves, its ``${NAME}`` references from the container's environment only (a value taken
    from a Secret stands in for itself)."""
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    path = tmp_path / "gateway.yaml"
    path.write_text(config_map["data"]["gateway.yaml"])
    container = next(c for c in spec["containers"] if c["name"] == "gateway")
    environ = {e["name"]: e.get("value", SECRET_ENV.get(e["name"], "from-a-secret")) for e in container.get("env", [])}
    return load_config(path, environ=environ).model


# What the pod's environment gets from the admin Secret (created per installation, never committed).
ADMIN_SECRET = ("deprecation-gateway-admin", "token")
SECRET_ENVIRON = {"GATEWAY_ADMIN_TOKEN": SECRET_ENV["GATEWAY_ADMIN_TOKEN"]}


def test_the_admin_token_comes_from_a_secret_the_service_monitor_shares(
        rendered: tuple[list[dict[str, Any]], bool], tmp_path: Path) -> None:
    """The pod reads the admin token from a Secret (never from the ConfigMap), Prometheus sends the same one, and
    the probes need none: /livez and /readyz are the admin paths the gateway serves without it."""
    docs, _ = rendered
    _, spec, container = _pod(docs)
    env = {e["name"]: e for e in container.get("env", [])}
    ref = env["GATEWAY_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ADMIN_SECRET and not ref.get("optional"), "no token, no start"
    config = _pod_config(docs, spec, tmp_path)
    assert config.server.admin_token == SECRET_ENVIRON["GATEWAY_ADMIN_TOKEN"]
    assert config.server.admin_open == [], "the scrape is authenticated, not opened"
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    assert "${GATEWAY_ADMIN_TOKEN}" in one(docs, "ConfigMap", volume["configMap"]["name"])["data"]["gateway.yaml"]
    for endpoint in one(docs, "ServiceMonitor")["spec"]["endpoints"]:
        auth = endpoint["authorization"]
        assert auth.get("type", "Bearer") == "Bearer"
        assert (auth["credentials"]["name"], auth["credentials"]["key"]) == ADMIN_SECRET
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] in ("/livez", "/readyz") and "httpHeaders" not in container[probe][
            "httpGet"]


def test_config_map_is_generated_with_a_hash_suffix(rendered: tuple[list[dict[str, Any]], bool],
                                                      tmp_path: Path) -> None:
    docs, by_kustomize = rendered
    if not by_kustomize:
        pytest.skip(NO_KUBECTL)
    _, spec, container = _pod(docs)
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    name = volume["configMap"]["name"]
    assert re.fullmatch(r"deprecation-gateway-config-[a-z0-9]{10}", name), name
    one(docs, "ConfigMap", name)
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/gateway" and mount.get("readOnly") is True and "subPath" not in mount


def test_a_config_change_changes_the_pod_template(tmp_path: Path) -> None:
    """The hash suffix is the checksum: editing gateway.yaml renames the ConfigMap, so the pod template changes and
    the Deployment rolls its pods."""
    if kubectl() is None:
        pytest.skip(NO_KUBECTL)
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY / "kubernetes", copy / "kubernetes")
    shutil.copytree(DEPLOY / "prometheus", copy / "prometheus")

    def config_name(docs: list[dict[str, Any]]) -> str:
        _, spec, _ = _pod(docs)
        name: str = next(v for v in spec["volumes"] if v["name"] == "config")["configMap"]["name"]
        return name

    before = config_name(kustomize_build(copy / "kubernetes/base"))
    config = copy / "kubernetes/base/gateway.yaml"
    config.write_text(config.read_text().replace("drain_delay: 5", "drain_delay: 6"))
    after = config_name(kustomize_build(copy / "kubernetes/base"))
    assert before != after


def test_probes_drain_and_grace_period(rendered: tuple[list[dict[str, Any]], bool], tmp_path: Path) -> None:
    docs, _ = rendered
    deployment, spec, container = _pod(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "admin": 9090}, "the image's --listen and GATEWAY_ADMIN_LISTEN"
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "admin"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    config = _pod_config(docs, spec, tmp_path)
    drain, shutdown = config.server.drain_delay, config.server.shutdown_timeout
    assert drain > 0, "server.drain_delay: /readyz must answer 503 for a while before the listener closes"
    readiness = container["readinessProbe"]
    assert readiness["periodSeconds"] * readiness.get("failureThreshold", 3) <= drain, (
        "the readiness probe must see the 503 within the drain delay")
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] in ("/bin/sleep", "sleep")
    pre_stop = float(command[1])
    last_write = config.usage.ledger.flush_timeout  # the usage ledger's last write, after the requests in flight
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain + shutdown + last_write
    assert "replicas" not in deployment["spec"], "the HorizontalPodAutoscaler owns the replica count"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_security_context_and_resources(rendered: tuple[list[dict[str, Any]], bool]) -> None:
    docs, _ = rendered
    _, spec, container = _pod(docs)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["runAsNonRoot"] is True
    assert security["capabilities"]["drop"] == ["ALL"] and "add" not in security["capabilities"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), kind
    # The one writable directory: --workers N > 1 keeps prometheus-client's multiprocess files under /tmp.
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == mount["name"])
    args = container.get("args", [])
    if "--workers" in args:
        assert 1 <= int(args[args.index("--workers") + 1]) <= 64


def test_image_is_pinned(rendered: tuple[list[dict[str, Any]], bool]) -> None:
    docs, _ = rendered
    _, _, container = _pod(docs)
    image = container["image"]
    assert re.fullmatch(r"[\w./-]+:[\w.-]+(@sha256:[0-9a-f]{64})?", image), image
    assert not image.endswith(":latest")


def test_services_and_service_monitor_select_the_pods(rendered: tuple[list[dict[str, Any]], bool]) -> None:
    docs, _ = rendered
    deployment, spec, _ = _pod(docs)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    services = find(docs, "Service")
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items(), service["metadata"]["name"]
    public = [s for s in services if any(p["targetPort"] == "http" for p in s["spec"]["ports"])]
    admin = [s for s in services if any(p["targetPort"] == "admin" for p in s["spec"]["ports"])
             and s["spec"].get("clusterIP") != "None"]
    assert len(public) == 1 and len(admin) == 1 and public != admin, "admin port on its own Service"
    assert all(p["targetPort"] != "http" for s in services if s not in public for p in s["spec"]["ports"]), (
        "the public port only on the public Service")
    monitor = one(docs, "ServiceMonitor")
    selected = [s for s in services if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert selected == admin, "the ServiceMonitor selects the admin Service only"
    ports = {p["name"] for p in admin[0]["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"


def test_the_usage_ledger_url_comes_from_a_secret(rendered: tuple[list[dict[str, Any]], bool],
                                                  tmp_path: Path) -> None:
    """Every pod writes to one PostgreSQL database; its URL, password included, is never in the ConfigMap."""
    docs, _ = rendered
    _, spec, container = _pod(docs)
    env = {e["name"]: e for e in container["env"]}
    assert env["GATEWAY_LEDGER_URL"]["valueFrom"]["secretKeyRef"] == {"name": "deprecation-gateway-ledger",
                                                                       "key": "url"}
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    text = one(docs, "ConfigMap", volume["configMap"]["name"])["data"]["gateway.yaml"]
    assert yaml.safe_load(text)["usage"]["ledger"]["url"] == "${GATEWAY_LEDGER_URL}"
    assert _pod_config(docs, spec, tmp_path).usage.ledger.url == SECRET_ENV["GATEWAY_LEDGER_URL"]
    assert not find(docs, "Secret"), "the Secret is created apart from the manifests (docs/deployment.md)"


def test_autoscaler_and_disruption_budget(rendered: tuple[list[dict[str, Any]], bool]) -> None:
    docs, _ = rendered
    deployment, _, container = _pod(docs)
    hpa = one(docs, "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["maxReplicas"] >= hpa["spec"]["minReplicas"]
    assert any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"])
    assert "cpu" in container["resources"]["requests"], "CPU utilization needs a CPU request"
    pdb = one(docs, "PodDisruptionBudget")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable", 0) < hpa["spec"]["minReplicas"]


def test_prometheus_rule_carries_the_plain_rules(rendered: tuple[list[dict[str, Any]], bool]) -> None:
    docs, _ = rendered
    rule = one(docs, "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_example_overlay_runs_workers(tmp_path: Path) -> None:
    if kubectl() is None:
        pytest.skip(NO_KUBECTL)
    docs = kustomize_build(KUBERNETES / "overlays/example")
    _, spec, container = _pod(docs)
    assert container["args"][:2] == ["--workers", "2"]
    assert one(docs, "Namespace")["metadata"]["name"] == one(docs, "Deployment")["metadata"]["namespace"]
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert one(docs, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert len(_pod_config(docs, spec, tmp_path).tenants) == 2
