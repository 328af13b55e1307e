"""contrib/kubernetes: every manifest validates against Kubernetes' schemas, and they agree."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from pgtarn.config.inifile import parse_config

kubernetes_validate = pytest.importorskip("kubernetes_validate")
yaml = pytest.importorskip("yaml")

MANIFESTS = sorted((Path(__file__).resolve().parents[2] / "contrib" / "kubernetes").glob("*.yaml"))
VERSIONS = ("1.27.0", "latest")  # the oldest the manifests claim to fit, and the newest bundled


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def _by_kind() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for path in MANIFESTS for doc in _documents(path)}


def _validate(doc: dict[str, Any], version: str) -> None:
    wanted = kubernetes_validate.latest_version() if version == "latest" else version
    kubernetes_validate.validate(doc, wanted, strict=True)  # strict: unknown fields fail too


def test_the_manifests_are_there() -> None:
    assert set(_by_kind()) == {
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    }


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_manifest_validates(path: Path, version: str) -> None:
    for doc in _documents(path):
        _validate(doc, version)


@pytest.mark.parametrize("breakage", ["port as text", "unknown field", "missing selector"])
def test_a_broken_manifest_fails(breakage: str) -> None:
    broken = copy.deepcopy(_by_kind()["Deployment"])
    container = broken["spec"]["template"]["spec"]["containers"][0]
    if breakage == "port as text":
        container["ports"][0]["containerPort"] = "6432"
    elif breakage == "unknown field":
        container["readinesProbe"] = container.pop("readinessProbe")
    else:
        del broken["spec"]["selector"]
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(broken, "latest")


def test_the_pieces_fit_together() -> None:
    kinds = _by_kind()
    ini_text = kinds["ConfigMap"]["data"]["pgbouncer.ini"]
    config = parse_config(ini_text, "configmap.yaml:pgbouncer.ini")
    assert config.warnings == ()
    pod = kinds["Deployment"]["spec"]["template"]
    spec = pod["spec"]
    container = spec["containers"][0]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    # the image runs /etc/pgtarn/pgbouncer.ini as it is; the userlist is projected beside it
    assert mounts["config"] == "/etc/pgtarn"
    assert config.auth_file == "/etc/pgtarn/userlist.txt"
    assert config.unix_socket_dir == mounts["run"]  # writable: the root is read-only
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["postgres"] == config.listen_port
    assert ports["metrics"] == config.metrics_port
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(config.metrics_port)
    assert config.metrics_listen_addr == "0.0.0.0"  # the default, 127.0.0.1, cannot be scraped
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["LISTEN_PORT"] == str(config.listen_port)  # what the health check connects to
    labels = pod["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget"):
        selector = kinds[kind]["spec"]["selector"]
        wanted = selector.get("matchLabels", selector)
        assert wanted.items() <= labels.items(), kind
