"""``ftx package``: one image holding the model repository, the checkpoint and ``gemm_config.in``.

The image is ``FROM`` the FasterTransformer image; the repository goes to ``/opt/ftx/models`` with
each model's ``model_checkpoint_path`` rewritten to the copy inside the image, ``gemm_config.in``
goes to the server's working directory ``/opt/ftx/work``, and the entrypoint starts
``mpirun -n 1 --allow-run-as-root tritonserver`` — so one ``docker run`` serves it. Labels record
the provenance (model, family, tp/pp, dtypes, source, artifact keys, base image, ftx version).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from google.protobuf import text_format

from ftx_triton.errors import ConfigError, ToolError
from ftx_triton.repository.model_config import parse_config
from ftx_triton.runtime.fastertransformer.docker import LABEL_PREFIX, TRITONSERVER
from ftx_triton.runtime.fastertransformer.docker.client import docker_errors, explain
from ftx_triton.runtime.fastertransformer.docker.exposure import (
    ADMIN_APIS,
    ADMIN_KEY_HEADER,
    METRICS_ADDRESS_SINCE,
    RESTRICTED_API_SINCE,
    triton_version_of,
)
from ftx_triton.runtime.fastertransformer.docker.image import KIND_LABEL, BuildDisplay, _now, stream_build
from ftx_triton.runtime.fastertransformer.docker.options import MEMLOCK, STACK
from ftx_triton.runtime.fastertransformer.docker.spec import ContainerSpec
from ftx_triton.terminal.redact import redact_data

log = structlog.get_logger(__name__)

IMAGE_ROOT = "/opt/ftx"
MODELS_DIR = f"{IMAGE_ROOT}/models"
WORK_DIR = f"{IMAGE_ROOT}/work"
ENTRYPOINT = f"{IMAGE_ROOT}/serve.sh"

SERVE_SH = """#!/bin/sh
# Entrypoint of an ftx-packaged FasterTransformer image: serve {models_dir}.
#   docker run --rm --gpus '"device={devices}"' --shm-size 1g --ulimit memlock=-1 --ulimit stack=67108864 \\
#     --ipc host --network host IMAGE
# Environment: FTX_HTTP_PORT / FTX_GRPC_PORT / FTX_METRICS_PORT (8000/8001/8002), FTX_HTTP_ADDRESS (127.0.0.1;
# another address also needs FTX_ADMIN_KEY where this tritonserver can restrict its admin APIs to requests
# carrying the header {admin_header}), CUDA_VISIBLE_DEVICES (default: the first {gpus} GPU(s), = tp x pp).
# Extra arguments go to tritonserver.
set -e
: "${{CUDA_VISIBLE_DEVICES:={devices}}}"
export CUDA_VISIBLE_DEVICES
address="${{FTX_HTTP_ADDRESS:-127.0.0.1}}"
restrict=""
case "$address" in
  127.*|localhost|::1) ;;
  *) if [ -n "{restricted_api}" ]; then
       : "${{FTX_ADMIN_KEY:?set FTX_ADMIN_KEY to serve on $address: the {admin_apis} APIs then need it}}"
       restrict="--http-restricted-api={admin_apis}:{admin_header}=$FTX_ADMIN_KEY"
       restrict="$restrict --grpc-restricted-protocol={admin_apis}:{admin_header}=$FTX_ADMIN_KEY"
     else
       echo "warning: this tritonserver cannot restrict its {admin_apis} APIs on $address" >&2
     fi ;;
esac
cd {work_dir}
# shellcheck disable=SC2086
exec mpirun -n 1 --allow-run-as-root {tritonserver} --model-repository={models_dir} \\
  --http-port="${{FTX_HTTP_PORT:-8000}}" --grpc-port="${{FTX_GRPC_PORT:-8001}}" \\
  --metrics-port="${{FTX_METRICS_PORT:-8002}}" \\
  --http-address="$address" --grpc-address="$address" {metrics_address}$restrict "$@"
"""

DOCKERFILE = """FROM {base}
COPY models {models_dir}
COPY work {work_dir}
COPY serve.sh {entrypoint}
WORKDIR {work_dir}
ENTRYPOINT ["/bin/sh", "{entrypoint}"]
"""


@dataclass(frozen=True)
class PackagedImage:
    tag: str
    id: str
    labels: Mapping[str, str]
    run_command: str


@dataclass(frozen=True)
class PackageInputs:
    """What goes into the image."""

    repository: Path
    tag: str
    base_image: str
    gemm: Path | None = None
    tp: int = 1
    pp: int = 1
    provenance: Mapping[str, str] = field(default_factory=dict)


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _copy_tree(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> None:
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part in skip for part in rel.parts):
            continue
        if path.is_dir():
            (dst / rel).mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            _link_or_copy(path, dst / rel)


def assemble_context(inputs: PackageInputs, context: Path) -> dict[str, str]:
    """Write the build context; return {model: in-image checkpoint path}."""
    repo = inputs.repository
    models = context / "models"
    rewritten: dict[str, str] = {}
    configs = sorted(repo.glob("*/config.pbtxt"))
    if not configs:
        raise ConfigError(
            f"{repo} holds no model (no */config.pbtxt)", hint="run `ftx run MODEL --until configure` first"
        )
    _copy_tree(repo, models, skip=("ftx-artifact.json",))
    for config_path in configs:
        model = config_path.parent.name
        config = parse_config(config_path)
        params = config.parameters
        if "model_checkpoint_path" not in params:
            continue
        source = Path(params["model_checkpoint_path"].string_value)
        if not (source / "config.ini").is_file():
            raise ConfigError(
                f"{config_path} points at {source}, which holds no config.ini",
                hint="convert the model first (`ftx run MODEL --until configure`)",
            )
        inside = f"{MODELS_DIR}/{model}/1/{source.name}"
        target = models / model / "1" / source.name
        if target.exists():
            shutil.rmtree(target)
        _copy_tree(source, target)
        params["model_checkpoint_path"].string_value = inside
        (models / model / "config.pbtxt").unlink()
        (models / model / "config.pbtxt").write_text(text_format.MessageToString(config))
        rewritten[model] = inside
    work = context / "work"
    work.mkdir()
    if inputs.gemm is not None:
        _link_or_copy(inputs.gemm, work / "gemm_config.in")
    devices = ",".join(str(i) for i in range(inputs.tp * inputs.pp))
    version = triton_version_of(inputs.base_image)
    metrics_address = '--metrics-address="$address" ' if version and version >= METRICS_ADDRESS_SINCE else ""
    restricted_api = "yes" if version and version >= RESTRICTED_API_SINCE else ""
    (context / "serve.sh").write_text(
        SERVE_SH.format(
            models_dir=MODELS_DIR,
            work_dir=WORK_DIR,
            tritonserver=TRITONSERVER,
            devices=devices,
            gpus=inputs.tp * inputs.pp,
            metrics_address=metrics_address,
            restricted_api=restricted_api,
            admin_apis=ADMIN_APIS,
            admin_header=ADMIN_KEY_HEADER,
        )
    )
    (context / "Dockerfile").write_text(
        DOCKERFILE.format(base=inputs.base_image, models_dir=MODELS_DIR, work_dir=WORK_DIR, entrypoint=ENTRYPOINT)
    )
    return rewritten


def run_spec(tag: str, gpus: int) -> ContainerSpec:
    """How to run a packaged image (the one ``docker run``)."""
    return ContainerSpec(
        image=tag,
        command=(),
        gpus=tuple(str(i) for i in range(gpus)),
        shm_size="1g",
        ulimits={"memlock": MEMLOCK, "stack": STACK},
        ipc_mode="host",
        network_mode="host",
        init=True,
    )


def package_labels(inputs: PackageInputs, base_id: str, rewritten: Mapping[str, str]) -> dict[str, str]:
    from ftx_triton.io.hashing import sha256_file
    from ftx_triton.runtime.fastertransformer.docker.serve import _ftx_version

    labels: dict[str, str] = {}
    deployment = inputs.repository / "ftx-deployment.json"
    if deployment.is_file():  # what configure recorded (model, family, tp, dtypes, checkpoint …)
        for key, value in json.loads(deployment.read_text()).items():
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            labels[f"{LABEL_PREFIX}.deployment.{key.replace('_', '-')}"] = text
    for key, value in inputs.provenance.items():
        labels[f"{LABEL_PREFIX}.{key}"] = str(value)
    labels.update(
        {
            KIND_LABEL: "package",
            f"{LABEL_PREFIX}.base-image": inputs.base_image,
            f"{LABEL_PREFIX}.base-image-id": base_id,
            f"{LABEL_PREFIX}.tp": str(inputs.tp),
            f"{LABEL_PREFIX}.pp": str(inputs.pp),
            f"{LABEL_PREFIX}.models": ",".join(sorted(p.parent.name for p in inputs.repository.glob("*/config.pbtxt"))),
            f"{LABEL_PREFIX}.repository": str(inputs.repository),
            f"{LABEL_PREFIX}.checkpoints": json.dumps(dict(rewritten), sort_keys=True),
            f"{LABEL_PREFIX}.gemm": sha256_file(inputs.gemm) if inputs.gemm else "untuned",
            f"{LABEL_PREFIX}.version": _ftx_version(),
            "org.opencontainers.image.created": _now(),
            "org.opencontainers.image.base.name": inputs.base_image,
            "org.opencontainers.image.title": inputs.tag,
        }
    )
    labels[f"{LABEL_PREFIX}.run"] = run_spec(inputs.tag, inputs.tp * inputs.pp).docker_run_line()
    return redact_data(labels)


def package_image(
    client: Any, inputs: PackageInputs, *, say: Callable[[str], None] | None = None, progress: bool | None = None
) -> PackagedImage:
    """Build the packaged image; the repository's checkpoint and gemm_config.in are copied in."""
    from ftx_triton.runtime.fastertransformer.docker.image import resolve_image

    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    base_id = resolve_image(client, inputs.base_image)
    with tempfile.TemporaryDirectory(prefix="ftx-package-") as tmp:
        context = Path(tmp)
        rewritten = assemble_context(inputs, context)
        labels = package_labels(inputs, base_id, rewritten)
        say(f"package   building {inputs.tag} from {inputs.base_image} ({', '.join(rewritten) or 'no checkpoint'})")
        with (context.parent / f"{context.name}.log").open("w") as log_file, BuildDisplay(say, progress) as display:
            try:
                chunks = client.api.build(
                    path=str(context), tag=inputs.tag, labels=labels, rm=True, forcerm=True, decode=True, pull=False
                )
                stream_build(chunks, display, log_file)
            except docker_errors() as exc:
                raise explain(exc, f"building {inputs.tag}") from None
        (context.parent / f"{context.name}.log").unlink(missing_ok=True)
    try:
        image = client.images.get(inputs.tag)
    except docker_errors() as exc:
        raise explain(exc, f"reading back {inputs.tag}") from None
    if image.labels.get(KIND_LABEL) != "package":
        raise ToolError(f"{inputs.tag} was built but does not carry ftx's labels")
    command = labels[f"{LABEL_PREFIX}.run"]
    say(f"package   built {inputs.tag} = {image.id}\n          run it with: {command}")
    log.info("package.built", tag=inputs.tag, id=image.id)
    return PackagedImage(inputs.tag, image.id, labels, command)
