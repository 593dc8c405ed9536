"""``describe_run``: the steps and commands of a fastertransformer run, for ``--dry-run``.

The lines follow the order a person follows in the backend's GPT-J guide — build the image,
convert, tune, configure, serve — and each command is the one ftx would run (the container lines
come from the same ``ContainerSpec`` objects the runtime creates), so nothing is left to edit by
hand. Nothing here starts a container or writes a file.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

from ftx_triton.conversion.family import Family, ModelSpec
from ftx_triton.errors import ConfigError
from ftx_triton.plan.artifacts import GemmConfig
from ftx_triton.plan.settings import RunSettings
from ftx_triton.repository.model_config import FT_MODEL_NAME, FtModelOptions, build_ft_model_config
from ftx_triton.runtime.fastertransformer.docker import (
    DEFAULT_BACKEND_REF,
    DEFAULT_BACKEND_REPO,
    DEFAULT_IMAGE_REPOSITORY,
    DEFAULT_TRITON_VERSION,
    FT_COMMIT,
)
from ftx_triton.runtime.fastertransformer.docker.image import (
    DOCKERFILE,
    ImageBuild,
    clone_commands,
    pin_fasttransformer,
)
from ftx_triton.runtime.fastertransformer.docker.options import DEFAULT_PORTS, DockerOptions
from ftx_triton.runtime.fastertransformer.docker.serve import plan_serve
from ftx_triton.runtime.fastertransformer.docker.tune import gemm_tool_path, tune_spec
from ftx_triton.runtime.fastertransformer.gpus import UPSTREAM_DEFAULT_SM, default_sm, local_gpus
from ftx_triton.runtime.fastertransformer.hosts import HOSTFILE_NAME
from ftx_triton.runtime.fastertransformer.tune import GEMM_FILE, gemm_arguments
from ftx_triton.server.ports import ServerPorts

INDENT = "     "


def _triton_version(image: str) -> str:
    repo, _, tag = image.rpartition(":")
    return tag if repo == DEFAULT_IMAGE_REPOSITORY and tag else DEFAULT_TRITON_VERSION


def _source(settings: RunSettings, family: Family) -> str:
    fetch = settings.fetch
    if fetch.source:
        return fetch.source + (f"@{fetch.revision}" if fetch.revision else "")
    preset = family.presets.get(settings.model)
    if preset is not None:
        revision = fetch.revision or preset.revision
        return preset.source + (f"@{revision}" if revision else "")
    return settings.model


def _flag(name: str, value: object, default: object) -> list[str]:
    return [name, str(value)] if value != default else []


_UPSTREAM_ADD = "ADD . /workspace/build/fastertransformer_backend\n"
"""The line of the backend's Dockerfile that puts the checkout in the image."""


def describe_run(
    settings: RunSettings,
    family: Family,
    spec: ModelSpec,
    checkpoint_dir: Path,
    repository_dir: Path,
    home: Path | None = None,
) -> list[str]:
    """Human-readable steps (with exact commands) of a fastertransformer run; runs nothing."""
    options = DockerOptions.from_settings(settings)
    gpus_here = local_gpus()
    sm = default_sm(gpus_here)
    s = settings
    tp, pp, repo, tune_s, serve_s = s.convert.planned_tp, s.configure.pp, s.configure, s.tune, s.serve
    data_type = s.data_type
    ports = ServerPorts(
        serve_s.http_port or DEFAULT_PORTS[0],
        serve_s.grpc_port or DEFAULT_PORTS[1],
        serve_s.metrics_port or DEFAULT_PORTS[2],
    )
    warnings: list[str] = []
    gemm_placeholder = GemmConfig(Path(GEMM_FILE), True, "") if tune_s.tune else GemmConfig(None, False, "")
    try:
        plan = plan_serve(
            repository=repository_dir,
            checkpoints=[checkpoint_dir],
            settings=s,
            family=family.name,
            options=options,
            gemm=gemm_placeholder,
            ports=ports,
            home=home,
        )
    except ConfigError as exc:
        if "GPU" not in exc.message:
            raise
        warnings.append(f"! {exc.message} ({exc.hint})" if exc.hint else f"! {exc.message}")
        plan = plan_serve(
            repository=repository_dir,
            checkpoints=[checkpoint_dir],
            settings=s,
            family=family.name,
            options=replace(options, gpus=tuple(range(tp * pp))),
            gemm=gemm_placeholder,
            ports=ports,
            home=home,
        )
    layout = plan.layout
    work = plan.work_dir
    title = family.title or family.name
    lines = [
        f"fastertransformer runtime: {title} — tp {tp} x pp {pp} = {tp * pp} GPU(s) on "
        f"{layout.nodes} node(s), image {options.image}",
        *warnings,
    ]

    # 1. image ---------------------------------------------------------------------------
    version = _triton_version(options.image)
    build = ImageBuild(tag=options.image, triton_version=version, sm=sm)
    sm_note = (
        f"-D SM={build.sm_text} for this machine's GPUs ({', '.join(sorted({g.name for g in gpus_here}))})"
        if sm
        else f"no local GPU found: upstream's default SM {','.join(map(str, UPSTREAM_DEFAULT_SM))}; "
        "pass --sm 90 for H100/H200"
    )
    build_cli = ["ftx", "image", "build", "--tag", options.image, "--triton-version", version]
    if sm:
        build_cli += ["--sm", build.sm_text]
    checkout = "fastertransformer_backend"
    lines += [
        f"1. image      build the Triton {version} + FasterTransformer backend image once ({sm_note}); "
        "skipped when `ftx image ls` lists it",
        f"{INDENT}$ {shlex.join(build_cli)}",
        f"{INDENT}  equivalent to (ftx does these through git and the Docker API):",
        *(
            f"{INDENT}  {shlex.join(argv)}"
            for argv in clone_commands(DEFAULT_BACKEND_REPO, DEFAULT_BACKEND_REF, checkout)
        ),
        f"{INDENT}  after its `ADD .` line the Dockerfile gets (FasterTransformer at {FT_COMMIT}, not main):",
        f"{INDENT}  {pin_fasttransformer(_UPSTREAM_ADD).splitlines()[1]}",
    ]
    if sm:
        sed = f"/^RUN\\b.*\\bcmake\\s*\\\\\\s*$/a\\      -D SM={build.sm_text} \\\\"
        lines.append(f"{INDENT}  sed -i -E {shlex.quote(sed)} {checkout}/{DOCKERFILE}")
    build_line = ["docker", "build", "--rm"]
    for key, value in build.build_args().items():
        build_line += ["--build-arg", f"{key}={value}"]
    build_line += ["-t", options.image, "-f", f"{checkout}/{DOCKERFILE}", checkout]
    lines.append(f"{INDENT}  {shlex.join(build_line)}")

    # 2. convert -------------------------------------------------------------------------
    source = _source(s, family)
    weight_dtype = s.convert.weight_dtype
    convert_cli = [
        "ftx",
        "convert",
        source,
        "--family",
        family.name,
        "--tp",
        str(tp),
        *_flag("--pp", pp, 1),
        "--weight-dtype",
        weight_dtype,
        "-o",
        str(checkpoint_dir.parent),
    ]
    lines += [
        f"2. convert    {source} -> {checkpoint_dir} (config.ini + one .bin per tensor and rank, "
        f"{weight_dtype} weights, tp {tp}); in-process, no container",
        f"{INDENT}$ {shlex.join(convert_cli)}",
    ]

    # 3. tune ----------------------------------------------------------------------------
    if tune_s.tune:
        args = gemm_arguments(family, spec, s)
        tune = tune_spec(image=options.image, command=[gemm_tool_path(family), *args], work_dir=work, gpu=plan.gpus[0])
        lines += [
            f"3. tune       {family.gemm_tool} for batch {tune_s.tune_batch}, beam {tune_s.tune_beam}, max input "
            f"{tune_s.tune_max_input_len}, {data_type}, tp {tp} on GPU {plan.gpus[0]} -> {work / GEMM_FILE}",
            f"{INDENT}$ mkdir -p {shlex.quote(str(work))}",
            f"{INDENT}$ {tune.docker_run_line()}",
        ]
    else:
        from ftx_triton.plan.settings import NO_TUNE_COST

        lines.append(f"3. tune       skipped — {NO_TUNE_COST}")

    # 4. configure -----------------------------------------------------------------------
    config = build_ft_model_config(
        FtModelOptions.for_family(
            family,
            checkpoint_dir,
            tp,
            pp=pp,
            data_type=data_type,
            max_batch_size=repo.max_batch_size,
            instances=repo.instances,
            streaming=repo.streaming,
            stream_interval=repo.stream_interval,
            dynamic_batching=repo.dynamic_batching,
        )
    )
    order = ("model_type", "tensor_para_size", "pipeline_para_size", "data_type", "model_checkpoint_path")
    keys = sorted(config.parameters, key=lambda k: (order.index(k) if k in order else len(order), k))
    params = ", ".join(f"{k} {config.parameters[k].string_value}" for k in keys)
    group = config.instance_group[0]
    lines += [
        f"4. configure  {repository_dir / FT_MODEL_NAME / 'config.pbtxt'} (built as a protobuf message, parsed back):",
        f"{INDENT}backend {config.backend}, max_batch_size {config.max_batch_size}, instance_group count "
        f"{group.count} KIND_CPU, decoupled {config.model_transaction_policy.decoupled}, "
        f"dynamic_batching {'on' if config.HasField('dynamic_batching') else 'off'}",
        f"{INDENT}parameters: {params}",
    ]

    # 5. serve ---------------------------------------------------------------------------
    host = "127.0.0.1" if serve_s.host in ("", "0.0.0.0") else serve_s.host
    lines.append(
        f"5. serve      {layout.gpus_per_node} GPU(s) per node (host GPUs {','.join(map(str, plan.gpus))}), "
        f"HTTP {host}:{ports.http}, gRPC {host}:{ports.grpc}, metrics {ports.metrics} "
        "(ftx takes free ports when these are busy)"
    )
    if plan.exposure and plan.exposure.caveat:
        lines.append(f"{INDENT}! {plan.exposure.caveat}")
    if layout.multi_node:
        lines += [
            f"{INDENT}hostfile {work / HOSTFILE_NAME}: " + "; ".join(layout.hostfile_text().splitlines()),
            f"{INDENT}the model store ({checkpoint_dir.parent}, {repository_dir}) must be on storage every node "
            "mounts at the same path",
            f"{INDENT}on each other node ({', '.join(layout.hosts[1:])}), first:",
            f"{INDENT}$ {plan.worker_spec.docker_run_line(detach=True) if plan.worker_spec else ''}",
            f"{INDENT}then on {layout.hosts[0]} (MPI rank 0, which receives the requests):",
        ]
    elif not tune_s.tune:
        lines.append(f"{INDENT}$ mkdir -p {shlex.quote(str(work))}")
    lines += [
        f"{INDENT}$ {plan.spec.docker_run_line()}",
        f"{INDENT}ready when {plan.ready_url} answers 200; the log is scanned for FasterTransformer's silent "
        "failures; Ctrl-C stops and removes the container",
    ]
    return lines
