"""`ftx export k8s`: the manifests and the Helm chart, checked offline against the real schemas — the
Kubernetes API's JSON schemas (kubernetes-validate, strict: unknown fields refused) and the
LeaderWorkerSet CRD of the pinned release (kept in tests/data/k8s, unchanged from the lws repository's tag).
Helm does not install from a package index here, so the chart is rendered by ``_render`` below (the
template language subset the chart uses: ``{{ .Values.X | quote }}``, ``{{ .Release.Namespace | quote }}``)."""

from __future__ import annotations

import functools
import gzip
import json
import re
import socket
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ftx_triton.cluster.kubernetes.entry import group_hosts, hosts_text, leader, wait_for_workers
from ftx_triton.cluster.kubernetes.manifests import LWS_VERSION, WORKER_INDEX_LABEL

kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S_VERSION = "1.30"
CRD = Path(__file__).parents[2] / "data" / "k8s" / f"leaderworkerset.x-k8s.io_leaderworkersets-{LWS_VERSION}.yaml.gz"
PODMONITOR_CRD = CRD.with_name("monitoring.coreos.com_podmonitors-v0.80.0.yaml.gz")
RUN = ("gptj", "--runtime", "fastertransformer-native", "--tp", "8", "--pp", "2")


def _export(ftx_cli: Any, out: Path, *extra: str, run: tuple[str, ...] = RUN) -> list[dict[str, Any]]:
    result = ftx_cli("export", "k8s", "-o", str(out), "--image", "registry.example/ftx:1", *extra, *run)
    assert result.exit_code == 0, result.stderr
    return list(yaml.safe_load_all((out / "gptj.yaml").read_text()))


@functools.cache
def _crd_schema(path: Path) -> dict[str, Any]:
    """The ``v1`` schema of a CustomResourceDefinition kept in tests/data/k8s."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # 1.2 MB of YAML: libyaml's parser when there is one
    crd = yaml.load(gzip.decompress(path.read_bytes()), Loader=loader)  # noqa: S506 - a safe loader
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


def _lws_schema() -> dict[str, Any]:
    return _crd_schema(CRD)


def _validate_pod_template(template: dict[str, Any]) -> None:
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
        K8S_VERSION,
        strict=True,
    )


def test_one_pod_is_a_deployment_and_every_object_fits_the_kubernetes_schemas(ftx_cli: Any, tmp_path: Path) -> None:
    docs = _export(ftx_cli, tmp_path, "--gpus-per-node", "8", run=("gptj", "--tp", "8"))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ServiceAccount", "PersistentVolumeClaim", "Job", "Deployment", "Service", "PodMonitor"]
    for doc in docs[:-1]:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    jsonschema.validate(docs[-1], _crd_schema(PODMONITOR_CRD))  # prometheus-operator's CRD
    assert docs[-1]["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    deployment = docs[3]["spec"]["template"]["spec"]
    server = deployment["containers"][0]
    assert server["command"][:4] == ["ftx", "run", "gptj", "--tp"] and "--until" not in server["command"]
    assert server["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in deployment["volumes"]
    assert server["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert docs[2]["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--until", "configure"]
    assert docs[1]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert {p["name"]: p["port"] for p in docs[4]["spec"]["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
        "openai": 9000,
    }


def test_several_pods_are_a_leaderworkerset_of_the_pinned_release(ftx_cli: Any, tmp_path: Path) -> None:
    docs = _export(ftx_cli, tmp_path, "--nodes", "2", "--gpus-per-node", "8")
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    jsonschema.validate(lws, _lws_schema())
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    _validate_pod_template(template["leaderTemplate"])
    _validate_pod_template(template["workerTemplate"])
    leader_cmd = template["leaderTemplate"]["spec"]["containers"][0]["command"]
    assert leader_cmd[:5] == ["python", "-m", "ftx_triton.cluster.kubernetes.entry", "leader", "--"]
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"][WORKER_INDEX_LABEL] == "0"  # the leader only
    assert next(d for d in docs if d["kind"] == "PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]
    for doc in docs:
        if doc["kind"] not in ("LeaderWorkerSet", "PodMonitor"):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    jsonschema.validate(monitor, _crd_schema(PODMONITOR_CRD))
    assert monitor["spec"]["selector"]["matchLabels"][WORKER_INDEX_LABEL] == "0"  # the leader's Triton metrics


def test_the_schemas_refuse_what_is_wrong() -> None:
    """The checks above can fail: a restart policy LWS does not know, an unknown field in a Deployment."""
    bad = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "x"}}
    bad["spec"] = {"leaderWorkerTemplate": {"size": 2, "restartPolicy": "Sometimes", "workerTemplate": {}}}
    with pytest.raises(jsonschema.ValidationError, match="Sometimes"):
        jsonschema.validate(bad, _lws_schema())
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def _render(chart: Path, values: dict[str, Any] | None = None, namespace: str = "default") -> list[dict[str, Any]]:
    defaults = yaml.safe_load((chart / "values.yaml").read_text())
    chosen = {**defaults, **(values or {})}
    out = []
    for template in sorted((chart / "templates").glob("*.yaml")):
        text = re.sub(
            r"\{\{ \.Values\.(\w+) \| quote \}\}", lambda m: json.dumps(str(chosen[m.group(1)])), template.read_text()
        )
        text = text.replace("{{ .Release.Namespace | quote }}", json.dumps(namespace))
        assert "{{" not in text, "a template construct this renderer does not know"
        out += list(yaml.safe_load_all(text))
    return out


def test_the_helm_chart_renders_the_same_objects_and_its_values_reach_them(ftx_cli: Any, tmp_path: Path) -> None:
    docs = _export(ftx_cli, tmp_path, "--nodes", "2", "--gpus-per-node", "8")
    chart = tmp_path / "chart"
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["name"] == "ftx-gptj"
    assert _render(chart) == docs
    other = _render(chart, {"image": "mirror/ftx:2", "gpusPerNode": 4, "model": "hf://org/m"}, namespace="ml")
    lws = next(d for d in other if d["kind"] == "LeaderWorkerSet")
    leader_container = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert leader_container["image"] == "mirror/ftx:2" and "hf://org/m" in leader_container["command"]
    assert leader_container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert {d["metadata"]["namespace"] for d in other} == {"ml"}
    jsonschema.validate(lws, _lws_schema())


def test_export_refuses_options_that_mean_nothing_on_kubernetes(ftx_cli: Any, tmp_path: Path) -> None:
    result = ftx_cli("export", "k8s", "-o", str(tmp_path / "o"), "--image", "i", "gptj", "--detach")
    assert result.exit_code == 1 and "`ftx run --detach` has no meaning here" in result.stderr
    assert not (tmp_path / "o").exists()


def test_leader_entry_lists_its_group_and_names_a_worker_that_never_comes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"LWS_LEADER_ADDRESS": "gptj-0.gptj.ml", "LWS_GROUP_SIZE": "3", "FTX_GPUS_PER_NODE": "8"}
    hosts = group_hosts(env)
    assert hosts == ["gptj-0.gptj.ml", "gptj-0-1.gptj.ml", "gptj-0-2.gptj.ml"]
    assert hosts_text(hosts, "8").splitlines()[1] == "gptj-0-1.gptj.ml gpus=8"
    with socket.socket() as listening:  # a worker whose sshd answers, and one that never comes
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert wait_for_workers(["127.0.0.1"], port, 5) is None
    assert wait_for_workers(["127.0.0.1"], port, 0.5) == "127.0.0.1"
    code = leader(["gptj"], {**env, "LWS_GROUP_SIZE": "2", "FTX_WORKER_WAIT_S": "0.5"}, tmp_path)
    assert code == 1
    assert "error: worker pod gptj-0-1.gptj.ml never came" in capsys.readouterr().err
    assert leader(["gptj"], {}, tmp_path) == 1 and "is this pod part of a LeaderWorkerSet" in capsys.readouterr().err
