"""The Kubernetes objects of one deployment (`ftx export k8s`).

One node: a Deployment. Several: a LeaderWorkerSet (LWS ``LWS_VERSION``; size = nodes,
``RecreateGroupOnPodRestart``: a pod that restarts takes its whole group with it, since FasterTransformer's
ranks cannot rejoin) whose leader runs ftx's rank launcher over the group's pods
(``python -m ftx_triton.cluster.kubernetes.entry leader``). Around it: a PersistentVolumeClaim for
FTX_HOME filled by a one-shot Job (fetch, convert, tune, configure on the GPU kind that serves), a Service
on the leader only (Triton HTTP/gRPC/metrics, the OpenAI port), a ServiceAccount without an API token (the
launcher finds its workers by DNS and needs no Kubernetes API), GPUs, ``/dev/shm`` in memory, a PodMonitor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LWS_VERSION = "v0.7.0"
"""The LeaderWorkerSet release these manifests target (API leaderworkerset.x-k8s.io/v1)."""
LWS_API = "leaderworkerset.x-k8s.io/v1"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
HOME = "/ftx-home"
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
SSH_PORT = 2222
"""The workers' sshd, which the leader's mpirun reaches them by (the rank launcher then becomes tritonserver)."""


@dataclass(frozen=True)
class K8sRequest:
    """A deployment for Kubernetes: the model and its ``ftx run`` options, the image, the group's shape."""

    name: str
    model: str
    run_args: tuple[str, ...]
    image: str
    namespace: str = "default"
    nodes: int = 1
    gpus_per_node: int = 1
    storage: str = "100Gi"
    storage_class: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": "ftx", "app.kubernetes.io/instance": self.name}


def _meta(request: K8sRequest, suffix: str = "") -> dict[str, Any]:
    return {
        "name": request.name + suffix,
        "namespace": request.namespace,
        "labels": {**request.selector, "app.kubernetes.io/managed-by": "ftx", **request.labels},
    }


def _serve_args(request: K8sRequest) -> list[str]:
    """``ftx run``'s serving options: every address of the pod, the fixed ports the Service names."""
    return [
        "--host",
        "0.0.0.0",
        "--http-port",
        str(PORTS["http"]),
        "--grpc-port",
        str(PORTS["grpc"]),
        "--metrics-port",
        str(PORTS["metrics"]),
        "--openai-host",
        "0.0.0.0",
        "--openai-port",
        str(PORTS["openai"]),
        "--name",
        request.name,
    ]


def _resources(request: K8sRequest) -> dict[str, Any]:
    if not request.gpus_per_node:
        return {}
    gpus = str(request.gpus_per_node)
    return {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}


def _volumes() -> list[dict[str, Any]]:
    return [
        {"name": "ftx-home", "persistentVolumeClaim": {"claimName": "REPLACED"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]


def _container(request: K8sRequest, command: list[str], *, serving: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "ftx",
        "image": request.image,
        "command": command,
        "env": [
            {"name": "FTX_HOME", "value": HOME},
            {"name": "FTX_GPUS_PER_NODE", "value": str(request.gpus_per_node)},
        ],
        "volumeMounts": [{"name": "ftx-home", "mountPath": HOME}, {"name": "dshm", "mountPath": "/dev/shm"}],
        "resources": _resources(request),
    }
    if serving:
        container["ports"] = [{"name": k, "containerPort": v, "protocol": "TCP"} for k, v in PORTS.items()]
        container.update(_probes())
    return container


def _probes() -> dict[str, Any]:
    """startup: until Triton has loaded every model (up to 30 min: large checkpoints); readiness: Triton
    ready, i.e. every model loaded and answering (the Service sends requests only then); liveness: the
    server process answers at all (three misses restart it)."""
    ready = {"path": "/v2/health/ready", "port": "http"}
    return {
        "startupProbe": {"httpGet": ready, "periodSeconds": 10, "failureThreshold": 180, "timeoutSeconds": 5},
        "readinessProbe": {"httpGet": ready, "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", "port": "http"},
            "periodSeconds": 15,
            "failureThreshold": 3,
            "timeoutSeconds": 5,
        },
    }


def _pod_spec(request: K8sRequest, containers: list[dict[str, Any]]) -> dict[str, Any]:
    volumes = _volumes()
    volumes[0]["persistentVolumeClaim"]["claimName"] = request.name + "-home"
    return {
        "serviceAccountName": request.name,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 60,
        "containers": containers,
        "volumes": volumes,
    }


def _with_ssh(request: K8sRequest, spec: dict[str, Any]) -> dict[str, Any]:
    secret = {"secretName": request.name + "-ssh", "defaultMode": 0o400}
    return {**spec, "volumes": [*spec["volumes"], {"name": "ssh", "secret": secret}]}


def _ftx(*args: str) -> list[str]:
    return ["ftx", *args]


def objects(request: K8sRequest) -> list[dict[str, Any]]:
    """Every object of the deployment, in the order `kubectl apply -f` should create them."""
    run = [request.model, *request.run_args]
    labels = {"metadata": {"labels": {**request.selector, "app.kubernetes.io/component": "server"}}}
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(request),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": _meta(request, "-home"),
            "spec": {
                "accessModes": ["ReadWriteMany" if request.nodes > 1 else "ReadWriteOnce"],
                "resources": {"requests": {"storage": request.storage}},
                **({"storageClassName": request.storage_class} if request.storage_class else {}),
            },
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _meta(request, "-prepare"),
            "spec": {
                "backoffLimit": 2,
                "template": {
                    "metadata": {"labels": {**request.selector, "app.kubernetes.io/component": "prepare"}},
                    "spec": {
                        **_pod_spec(
                            request, [_container(request, _ftx("run", *run, "--until", "configure"), serving=False)]
                        ),
                        "restartPolicy": "Never",
                    },
                },
            },
        },
    ]
    if request.nodes == 1:
        serve = _container(request, _ftx("run", *run, *_serve_args(request)), serving=True)
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": _meta(request),
                "spec": {
                    "replicas": 1,
                    "strategy": {"type": "Recreate"},  # one server owns the GPUs (and a ReadWriteOnce volume)
                    "selector": {"matchLabels": {**request.selector, "app.kubernetes.io/component": "server"}},
                    "template": {**labels, "spec": _pod_spec(request, [serve])},
                },
            }
        )
        leader_selector = {**request.selector, "app.kubernetes.io/component": "server"}
    else:
        entry = ["python", "-m", "ftx_triton.cluster.kubernetes.entry"]
        leader = _container(request, [*entry, "leader", "--", *run, *_serve_args(request)], serving=True)
        worker = _container(request, [*entry, "worker"], serving=False)
        worker["ports"] = [{"name": "ssh", "containerPort": SSH_PORT, "protocol": "TCP"}]
        for container in (leader, worker):  # the group's ssh key (a Secret the user creates, see the README)
            container["volumeMounts"].append({"name": "ssh", "mountPath": "/etc/ftx-ssh", "readOnly": True})
        out.append(
            {
                "apiVersion": LWS_API,
                "kind": "LeaderWorkerSet",
                "metadata": _meta(request),
                "spec": {
                    "replicas": 1,
                    "startupPolicy": "LeaderCreated",
                    "leaderWorkerTemplate": {
                        "size": request.nodes,
                        "restartPolicy": "RecreateGroupOnPodRestart",
                        "leaderTemplate": {**labels, "spec": _with_ssh(request, _pod_spec(request, [leader]))},
                        "workerTemplate": {**labels, "spec": _with_ssh(request, _pod_spec(request, [worker]))},
                    },
                },
            }
        )
        leader_selector = {**request.selector, WORKER_INDEX_LABEL: "0"}
    out.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(request),
            "spec": {
                "selector": leader_selector,
                "ports": [{"name": k, "port": v, "targetPort": k, "protocol": "TCP"} for k, v in PORTS.items()],
            },
        }
    )
    out.append(
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": _meta(request),
            "spec": {
                "selector": {"matchLabels": leader_selector},
                "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}],
            },
        }
    )
    return out
