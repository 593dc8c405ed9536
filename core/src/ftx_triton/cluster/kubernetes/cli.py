"""`ftx export k8s`: a deployment's Kubernetes manifests and a Helm chart of the same objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ftx_triton.cli.common import FtxCommand, say

REFUSED_RUN_OPTIONS = {
    "detach": "the Deployment (or LeaderWorkerSet) keeps serving; `kubectl delete -f` ends it",
    "prompt": "ask the Service once it is ready",
    "dry_run": "the export writes files and runs nothing",
    "name": "give --name to `ftx export k8s` itself",
    "hosts": "the LeaderWorkerSet's leader writes the hosts file of its group",
    "until": "the Job prepares, the server serves",
    "lock_file": "give MODEL",
}


@click.command(
    "k8s", cls=FtxCommand, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.option(
    "-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True, help="Directory to write."
)
@click.option("--image", required=True, help="The ftx image the pods run (see the README's Dockerfile).")
@click.option("--nodes", type=click.IntRange(1, 512), default=1, show_default=True, help="Pods of the group (= pp).")
@click.option(
    "--gpus-per-node", type=click.IntRange(0, 64), default=1, show_default=True, help="GPUs of each pod (= tp)."
)
@click.option("--namespace", default="default", show_default=True, help="The namespace of the manifests.")
@click.option("--storage", default="100Gi", show_default=True, help="Size of FTX_HOME's volume.")
@click.option("--storage-class", help="Its StorageClass (ReadWriteMany for several pods).")
@click.option("--name", help="The objects' name (default: from MODEL).")
@click.argument("model")
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED)
def k8s_command(model: str, run_args: tuple[str, ...], output: Path, **opts: Any) -> None:
    """Write Kubernetes manifests and a Helm chart that deploy MODEL with ftx.

    One pod: a Deployment; several (--nodes): a LeaderWorkerSet whose leader launches the ranks over its
    group. With a PersistentVolumeClaim for FTX_HOME filled by a one-shot Job, a Service on the leader
    (Triton HTTP 8000, gRPC 8001, metrics 8002, OpenAI 9000), probes, GPUs, /dev/shm and a PodMonitor.
    Options after MODEL are `ftx run`'s, checked here.
    """
    from ftx_triton import __version__
    from ftx_triton.cluster.kubernetes.chart import chart_files, manifests_yaml
    from ftx_triton.cluster.kubernetes.manifests import K8sRequest
    from ftx_triton.cluster.output import write_text
    from ftx_triton.cluster.runargs import check_run_args
    from ftx_triton.server.smoke import server_name

    check_run_args(model, run_args, REFUSED_RUN_OPTIONS)
    name = opts["name"] or server_name(model).lower().replace("_", "-").replace(".", "-")
    if not _dns_label(name):
        raise click.BadParameter(
            f"{name!r} is not a Kubernetes name (lowercase letters, digits, '-')", param_hint="--name"
        )
    request = K8sRequest(
        name=name,
        model=model,
        run_args=run_args,
        image=opts["image"],
        namespace=opts["namespace"],
        nodes=opts["nodes"],
        gpus_per_node=opts["gpus_per_node"],
        storage=opts["storage"],
        storage_class=opts["storage_class"],
    )
    write_text(output / f"{name}.yaml", manifests_yaml(request))
    for path, text in chart_files(request, __version__).items():
        write_text(output / "chart" / path, text)
    say(f"wrote {output}/{name}.yaml and the Helm chart {output}/chart")
    click.echo(f"kubectl apply -f {output}/{name}.yaml      # or: helm install {name} {output}/chart")


def _dns_label(name: str) -> bool:
    import re

    return re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", name) is not None
