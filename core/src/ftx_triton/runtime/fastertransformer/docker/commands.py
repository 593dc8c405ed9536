"""``ftx image build|ls``, ``ftx tune`` and ``ftx package``: the Docker launcher's commands, registered through
``ftx_register_commands`` like any plugin's (``ftx tune`` and ``ftx package`` run the pipeline through the kit
core hands the hook)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from ftx_triton import hookimpl
from ftx_triton.commandkit import FtxCommand, FtxGroup, options_of, say
from ftx_triton.runtime.fastertransformer.docker.options import DockerSection
from ftx_triton.runtime.fastertransformer.options import FtLaunchSection

if TYPE_CHECKING:
    from ftx_triton.commandkit import CommandKit
    from ftx_triton.plan.settings import RunSettings

SM_HELP = (
    "GPU architectures to compile FasterTransformer for, e.g. 80,90 (default: this machine's GPUs; "
    "'none' = upstream's 70,75,80,86, which has no native Hopper code)."
)


@click.group("image", cls=FtxGroup)
def image() -> None:
    """Build and list the Triton + FasterTransformer images."""


@image.command("build")
@click.option("--triton-version", default=None, help="Triton (NGC) release to build on [default: 23.05].")
@click.option("--base-image", help="Base image (default: nvcr.io/nvidia/tritonserver:<version>-py3).")
@click.option("--sm", "sm_text", default="auto", show_default=True, help=SM_HELP)
@click.option(
    "--backend-repo", help="fastertransformer_backend checkout (path) or git URL [default: upstream on GitHub]."
)
@click.option("--backend-ref", help="Branch or tag to clone when --backend-repo is a URL [default: main].")
@click.option("--tag", help="Image tag (default: ftx/triton-fastertransformer:<version>).")
@click.option("--no-cache", is_flag=True, help="Rebuild every step.")
@click.option("--docker-host", help="Docker daemon URL (default: DOCKER_HOST or the local socket).")
def image_build(
    triton_version: str | None,
    base_image: str | None,
    sm_text: str,
    backend_repo: str | None,
    backend_ref: str | None,
    tag: str | None,
    no_cache: bool,
    docker_host: str | None,
) -> None:
    """Build the image from the backend repository's docker/Dockerfile and record its id."""
    from ftx_triton.runtime.fastertransformer.docker import (
        DEFAULT_BACKEND_REF,
        DEFAULT_BACKEND_REPO,
        DEFAULT_TRITON_VERSION,
    )
    from ftx_triton.runtime.fastertransformer.docker.client import connect
    from ftx_triton.runtime.fastertransformer.docker.image import ImageBuild, build_image, image_tag_for
    from ftx_triton.runtime.fastertransformer.gpus import UPSTREAM_DEFAULT_SM, default_sm, parse_sm_list

    version = triton_version or DEFAULT_TRITON_VERSION
    if sm_text == "auto":
        sm = default_sm()
        if not sm:
            say(
                "warning: no local GPU found, so the image gets upstream's architectures "
                f"({','.join(map(str, UPSTREAM_DEFAULT_SM))}, no native Hopper code); pass --sm 90 for H100/H200"
            )
    elif sm_text.lower() == "none":
        sm = ()
    else:
        sm = parse_sm_list(sm_text)
    build = ImageBuild(
        tag=tag or image_tag_for(version),
        triton_version=version,
        base_image=base_image,
        sm=sm,
        backend_repo=backend_repo or DEFAULT_BACKEND_REPO,
        backend_ref=backend_ref if backend_ref is not None else (None if backend_repo else DEFAULT_BACKEND_REF),
        no_cache=no_cache,
    )
    built = build_image(connect(docker_host), build, say=say)
    click.echo(built.id)


def _size(n: int) -> str:
    return f"{n / 1e9:.1f}GB" if n >= 1e9 else (f"{n / 1e6:.0f}MB" if n else "-")


@image.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the images as JSON.")
@click.option("--docker-host", help="Docker daemon URL (default: DOCKER_HOST or the local socket).")
def image_ls(as_json: bool, docker_host: str | None) -> None:
    """List ftx's images (built and packaged) with their provenance labels."""
    from ftx_triton.errors import ToolError
    from ftx_triton.runtime.fastertransformer.docker import LABEL_PREFIX
    from ftx_triton.runtime.fastertransformer.docker.client import connect
    from ftx_triton.runtime.fastertransformer.docker.image import list_images

    try:
        client = connect(docker_host)
    except ToolError as exc:
        say(f"warning: {exc.message}; showing recorded builds only")
        client = None
    infos = list_images(client)
    if as_json:
        click.echo(json.dumps([i.as_dict() for i in infos], indent=2))
        return
    if not infos:
        click.echo("no ftx images (build one with `ftx image build`)")
        return
    rows = [["TAG", "ID", "KIND", "TRITON", "SM", "MODELS", "CREATED", "SIZE"]]
    for i in infos:
        label = i.labels.get
        rows.append(
            [
                i.tag,
                i.id.removeprefix("sha256:")[:12] + ("" if i.present else " (gone)"),
                i.kind,
                label(f"{LABEL_PREFIX}.triton-version", "-"),
                label(f"{LABEL_PREFIX}.sm", "-"),
                label(f"{LABEL_PREFIX}.models", "-"),
                i.created,
                _size(i.size),
            ]
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _settings(kit: CommandKit, model: str, until: str, opts: dict[str, Any]) -> RunSettings:
    return kit.settings(
        model,
        until=until,
        runtime="fastertransformer",
        runtime_origin=f"ftx {until if until == 'tune' else 'package'}'s default",
        **opts,
    )


def _docker_options(func: Any) -> Any:
    """--image, --docker-host and --gpus: where the launcher's image runs."""
    return options_of(DockerSection, only=("image", "docker_host"))(options_of(FtLaunchSection, only=("gpus",))(func))


def tune_command(kit: CommandKit) -> click.Command:
    """``ftx tune``: the pipeline until the tune stage on the fastertransformer runtime."""

    @click.command("tune", cls=FtxCommand)
    @click.argument("model")
    @kit.options["source"]
    @kit.options["conversion"]
    @click.option(
        "--data-type",
        type=click.Choice(["fp32", "fp16", "bf16"]),
        help="Compute type to tune for (default: the weight dtype).",
    )
    @kit.options["tune"]
    @_docker_options
    @kit.options["safety"]
    @click.option(
        "--force",
        "force",
        multiple=True,
        type=click.Choice(["fetch", "convert", "tune"]),
        help="Redo this stage even if cached (repeatable).",
    )
    def tune(model: str, **opts: Any) -> None:
        """Run the family's GEMM tool (gpt_gemm, t5_gemm) in the image; print gemm_config.in's path."""
        result = kit.run(_settings(kit, model, "tune", opts))
        if result.gemm is None or result.gemm.path is None:
            say(f"not tuned: {result.gemm.reason if result.gemm else 'no tune stage ran'}")
            return
        say(f"tuned: {result.gemm.reason}")
        click.echo(str(result.gemm.path))

    return tune


def package_command(kit: CommandKit) -> click.Command:
    """``ftx package``: the pipeline until configure, then an image holding what it built."""

    @click.command("package", cls=FtxCommand)
    @click.argument("model")
    @click.option("--tag", required=True, help="Tag of the new image, e.g. registry.example/team/gptj:1.")
    @click.option("--base-image", help="Image to build on (default: --image, i.e. the FasterTransformer image).")
    @kit.options["source"]
    @kit.options["conversion"]
    @kit.options["repository"]
    @click.option("--tune/--no-tune", default=True, show_default=True, help="Put a tuned gemm_config.in in the image.")
    @kit.options["tune"]
    @_docker_options
    @kit.options["safety"]
    @click.option("--dry-run", is_flag=True, help="Print the stages and the image that would be built; build nothing.")
    def package(model: str, tag: str, base_image: str | None, dry_run: bool, **opts: Any) -> None:
        """Build an image holding MODEL's repository, checkpoint and gemm_config.in, runnable with one docker run."""
        settings = _settings(kit, model, "configure", {**opts, "dry_run": dry_run})
        result = kit.run(settings)
        if dry_run:
            package_plan(settings, tag, base_image)
            return
        package_built(settings, result, tag, base_image)

    return package


def package_plan(settings: RunSettings, tag: str, base_image: str | None) -> None:
    """What ``ftx package --dry-run`` prints after the stages: the image it would build and how it runs."""
    from ftx_triton.runtime.fastertransformer.docker.options import DockerOptions
    from ftx_triton.runtime.fastertransformer.docker.package import run_spec

    base = base_image or DockerOptions.from_settings(settings).image
    tuned = "a tuned gemm_config.in" if settings.tune.tune else "no gemm_config.in (--no-tune)"
    click.echo(f"package: would build {tag} FROM {base} with the model repository, its checkpoint and {tuned}")
    gpus = settings.convert.planned_tp * settings.configure.pp
    click.echo(f"run it with: {run_spec(tag, gpus).docker_run_line()}")


def package_built(settings: RunSettings, result: Any, tag: str, base_image: str | None) -> None:
    """Package what the pipeline built for ``settings`` into the image ``tag``; print its id."""
    from ftx_triton.runtime.fastertransformer.docker.client import connect
    from ftx_triton.runtime.fastertransformer.docker.options import DockerOptions
    from ftx_triton.runtime.fastertransformer.docker.package import PackageInputs, package_image

    assert result.repository is not None
    options = DockerOptions.from_settings(settings)
    keys = {o.stage: o.key for o in result.outcomes}
    provenance = {
        "model": settings.model,
        "family": result.family.name if result.family else "",
        "convert-key": keys.get("convert", ""),
        "configure-key": keys.get("configure", ""),
        "tune-key": keys.get("tune", ""),
    }
    if result.source is not None:
        provenance.update({"source": result.source.ref.display, "revision": result.source.revision})
    gemm = result.gemm.path if result.gemm is not None and result.gemm.tuned else None
    inputs = PackageInputs(
        repository=result.repository.path,
        tag=tag,
        base_image=base_image or options.image,
        gemm=gemm,
        tp=settings.convert.planned_tp,
        pp=settings.configure.pp,
        provenance=provenance,
    )
    built = package_image(connect(options.docker_host), inputs, say=say)
    click.echo(built.id)


@hookimpl
def ftx_register_commands(cli: click.Group, kit: CommandKit) -> None:
    """The Docker launcher's tools: ``ftx image`` (build, list), ``ftx tune`` and ``ftx package``."""
    for command in (image, tune_command(kit), package_command(kit)):
        cli.add_command(command)
