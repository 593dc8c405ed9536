"""The manifests as YAML, and a Helm chart of the same objects whose values are the deployment's options.

The chart's templates are the exported objects with each value's place marked: the objects are built once
with a marker for every value (:data:`VALUES`), dumped, and the markers replaced by ``{{ .Values.… }}``, so
the chart rendered with its default values is exactly the exported manifests.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import yaml

from ftx_triton.cluster.kubernetes.manifests import LWS_VERSION, K8sRequest, objects

VALUES = ("image", "model", "storage", "gpusPerNode")
"""The chart's values (besides the release's namespace): the image, MODEL, the volume's size, GPUs per pod."""
_MARK = "FTXVALUE{}FTX"


def manifests_yaml(request: K8sRequest) -> str:
    """Every object, as one multi-document YAML file for `kubectl apply -f`."""
    return yaml.safe_dump_all(objects(request), sort_keys=False)


def _marked(request: K8sRequest) -> K8sRequest:
    return replace(
        request,
        image=_MARK.format("image"),
        model=_MARK.format("model"),
        storage=_MARK.format("storage"),
        namespace=_MARK.format("namespace"),
    )


def chart_files(request: K8sRequest, version: str) -> dict[str, str]:
    """``Chart.yaml``, ``values.yaml`` and the template, by path inside the chart directory."""
    text = yaml.safe_dump_all(objects(_marked(request)), sort_keys=False)
    gpus = str(request.gpus_per_node)
    text = text.replace(f"nvidia.com/gpu: '{gpus}'", "nvidia.com/gpu: {{ .Values.gpusPerNode | quote }}")
    text = re.sub(rf"(name: FTX_GPUS_PER_NODE\n\s+value: )'{gpus}'", r"\1{{ .Values.gpusPerNode | quote }}", text)
    for key in ("image", "model", "storage"):
        text = text.replace(_MARK.format(key), "{{ .Values." + key + " | quote }}")
    text = text.replace(_MARK.format("namespace"), "{{ .Release.Namespace | quote }}")
    values: dict[str, Any] = {
        "image": request.image,
        "model": request.model,
        "storage": request.storage,
        "gpusPerNode": request.gpus_per_node,
    }
    chart = {
        "apiVersion": "v2",
        "name": f"ftx-{request.name}",
        "description": f"ftx deployment of {request.model} ({request.nodes} pod(s), LeaderWorkerSet {LWS_VERSION})",
        "type": "application",
        "version": "0.1.0",
        "appVersion": version,
    }
    return {
        "Chart.yaml": yaml.safe_dump(chart, sort_keys=False),
        "values.yaml": yaml.safe_dump(values, sort_keys=False),
        f"templates/{request.name}.yaml": text,
    }
