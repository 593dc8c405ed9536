"""Build the Triton + FasterTransformer backend image from the backend repository's Dockerfile.

``docker/Dockerfile`` of fastertransformer_backend takes the build args ``TRITON_VERSION`` and
``BASE_IMAGE`` and runs CMake without ``-D SM``, so FasterTransformer is compiled only for
sm 70/75/80/86 (Hopper then JIT-compiles PTX at first load, or fails with "invalid device
function"). ftx adds ``-D SM=<list>`` to that CMake line, defaulting to the local GPUs' compute
capability, builds with the Docker SDK while showing the build log with a progress display, and
records the image id (and its provenance as labels and in ``<FTX_HOME>/images/``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ftx_triton.errors import ConfigError, ToolError
from ftx_triton.io.atomic_file import write_json_atomic
from ftx_triton.paths import ftx_home
from ftx_triton.runtime.fastertransformer.docker import (
    DEFAULT_BACKEND_REF,
    DEFAULT_BACKEND_REPO,
    DEFAULT_IMAGE_REPOSITORY,
    DEFAULT_TRITON_VERSION,
    FT_COMMIT,
    LABEL_PREFIX,
)
from ftx_triton.runtime.fastertransformer.docker.client import docker_errors, explain

log = structlog.get_logger(__name__)

DOCKERFILE = "docker/Dockerfile"
KIND_LABEL = f"{LABEL_PREFIX}.kind"
_CMAKE_LINE = re.compile(r"^RUN\b.*\bcmake\s*\\\s*$")
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")


def base_image_for(triton_version: str) -> str:
    return f"nvcr.io/nvidia/tritonserver:{triton_version}-py3"


def image_tag_for(triton_version: str) -> str:
    return f"{DEFAULT_IMAGE_REPOSITORY}:{triton_version}"


@dataclass(frozen=True)
class ImageBuild:
    """What ``ftx image build`` builds."""

    tag: str
    triton_version: str = DEFAULT_TRITON_VERSION
    base_image: str | None = None
    sm: tuple[int, ...] = ()
    """Architectures for ``-D SM``; empty = upstream's default (no native Hopper code)."""
    backend_repo: str = DEFAULT_BACKEND_REPO
    backend_ref: str | None = DEFAULT_BACKEND_REF
    dockerfile: str = DOCKERFILE
    no_cache: bool = False

    @property
    def base(self) -> str:
        return self.base_image or base_image_for(self.triton_version)

    @property
    def sm_text(self) -> str:
        return ",".join(map(str, self.sm))

    def build_args(self) -> dict[str, str]:
        return {"TRITON_VERSION": self.triton_version, "BASE_IMAGE": self.base}


_ADD_BACKEND = re.compile(r"^ADD\s+\.\s+(?P<dir>/\S+)\s*$")
FT_PIN_SED = f"/FasterTransformer.git/{{n;s/GIT_TAG main/GIT_TAG {FT_COMMIT}/;n;s/GIT_SHALLOW ON/GIT_SHALLOW OFF/}}"
"""Pins the FasterTransformer the backend's CMakeLists fetches (``GIT_TAG main``) to :data:`FT_COMMIT`; a
commit cannot be fetched shallow by CMake."""


def pin_fasttransformer(text: str) -> str:
    """Insert, right after the Dockerfile's ``ADD . <backend dir>``, the edit of the backend's CMakeLists that
    makes CMake fetch FasterTransformer at the pinned commit instead of ``main`` (unchanged without that line)."""
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines):
        if m := _ADD_BACKEND.match(line.rstrip("\r\n")):
            edit = f"RUN sed -i -e {shlex.quote(FT_PIN_SED)} {m.group('dir')}/CMakeLists.txt\n"
            lines.insert(number + 1, edit)
            return "".join(lines)
    return text


def patch_dockerfile(text: str, sm: tuple[int, ...]) -> str:
    """FasterTransformer pinned (:func:`pin_fasttransformer`) and ``-D SM=<list>`` added to the Dockerfile's CMake
    invocation (no ``-D SM`` when ``sm`` is empty)."""
    text = pin_fasttransformer(text)
    if not sm:
        return text
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines):
        if _CMAKE_LINE.match(line.rstrip("\r\n")):
            lines.insert(number + 1, f"      -D SM={','.join(map(str, sm))} \\\n")
            return "".join(lines)
    raise ToolError(
        "cannot find the `RUN … cmake \\` line in the backend's Dockerfile to add -D SM",
        hint="build with --sm none (upstream's architectures), or use a backend revision whose "
        "docker/Dockerfile runs cmake in a multi-line RUN",
    )


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    id: str
    record: Path
    log_path: Path
    labels: Mapping[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- the build context


def backend_checkout(build: ImageBuild, home: Path, say: Callable[[str], None]) -> tuple[Path, str | None]:
    """The backend repository on disk (a local directory as is, a URL cloned into the cache) and its commit."""
    local = Path(build.backend_repo).expanduser()
    if local.is_dir():
        return local.resolve(), _git_commit(local)
    key = hashlib.sha256(f"{build.backend_repo}@{build.backend_ref}".encode()).hexdigest()[:16]
    dest = home / "images" / "src" / f"fastertransformer_backend-{key}"
    if not (dest / DOCKERFILE).is_file():
        from ftx_triton.io.atomic import publish_dir

        say(f"image     cloning {build.backend_repo}" + (f" ({build.backend_ref})" if build.backend_ref else ""))
        with publish_dir(dest, replace=True) as tmp:
            for argv in clone_commands(build.backend_repo, build.backend_ref, str(tmp)):
                _git(argv, build)
    return dest, _git_commit(dest)


def clone_commands(repo: str, ref: str | None, dest: str) -> list[list[str]]:
    """The git commands that check out ``ref`` (a commit, tag or branch; None: the default branch) of ``repo``
    into ``dest``, fetching that one revision only (``git clone --branch`` takes no commit)."""
    return [
        ["git", "init", "-q", dest],
        ["git", "-C", dest, "fetch", "-q", "--depth", "1", repo, *([ref] if ref else [])],
        ["git", "-C", dest, "checkout", "-q", "--detach", "FETCH_HEAD"],
    ]


def _git(argv: list[str], build: ImageBuild) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    except FileNotFoundError:
        raise ToolError(
            "git is not installed, so the backend repository cannot be fetched",
            hint="install git, or pass --backend-repo PATH to a checkout",
        ) from None
    if done.returncode != 0:
        raise ToolError(
            f"fetching {build.backend_repo} at {build.backend_ref or 'its default branch'} failed: "
            f"{done.stderr.strip().splitlines()[-1:] or ''}",
            hint="check the URL and --backend-ref, or pass --backend-repo PATH to a local checkout",
        )


def _git_commit(path: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


# --------------------------------------------------------------------------- build


def image_labels(build: ImageBuild, commit: str | None, dockerfile_sha: str) -> dict[str, str]:
    from ftx_triton.runtime.fastertransformer.docker.serve import _ftx_version

    return {
        KIND_LABEL: "triton-fastertransformer",
        f"{LABEL_PREFIX}.triton-version": build.triton_version,
        f"{LABEL_PREFIX}.base-image": build.base,
        f"{LABEL_PREFIX}.sm": build.sm_text or "upstream-default",
        f"{LABEL_PREFIX}.backend-repo": build.backend_repo,
        f"{LABEL_PREFIX}.backend-ref": build.backend_ref or "",
        f"{LABEL_PREFIX}.backend-commit": commit or "unknown",
        f"{LABEL_PREFIX}.fastertransformer-commit": FT_COMMIT,
        f"{LABEL_PREFIX}.dockerfile-sha256": dockerfile_sha,
        f"{LABEL_PREFIX}.version": _ftx_version(),
        "org.opencontainers.image.created": _now(),
    }


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class BuildDisplay:
    """Shows the build: a rich progress bar over Dockerfile steps on a terminal, step lines otherwise."""

    def __init__(self, say: Callable[[str], None], progress: bool | None = None) -> None:
        self.say = say
        self.progress_enabled = sys.stderr.isatty() if progress is None else progress
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> BuildDisplay:
        if self.progress_enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]image build"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("", total=None)
        return self

    def step(self, number: int, total: int, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=number - 1, total=total, description=text[:70])
        else:
            self.say(f"image     step {number}/{total}: {text}")

    def line(self, text: str) -> None:
        if self._progress is None and text.strip():
            self.say(f"[build] {text}")

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            if exc[0] is None and self._task is not None:
                task = self._progress.tasks[0]
                self._progress.update(self._task, completed=task.total or 0)
            self._progress.__exit__(*exc)


def stream_build(
    chunks: Iterator[Mapping[str, Any]], display: BuildDisplay, log_file: Any
) -> tuple[str | None, list[str]]:
    """Consume the daemon's build stream; return (image id, last lines). Raises on a build error."""
    image_id: str | None = None
    tail: list[str] = []
    current = ""
    for chunk in chunks:
        if "error" in chunk:
            detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
            log_file.write(f"ERROR: {detail}\n")
            raise ToolError(
                f"the image build failed at {current or 'the start'}: {str(detail).strip()}",
                hint="last build lines:\n"
                + "\n".join(f"  {t}" for t in tail[-12:])
                + f"\nfull log: {getattr(log_file, 'name', '')}",
            )
        if "aux" in chunk and isinstance(chunk["aux"], Mapping) and chunk["aux"].get("ID"):
            image_id = str(chunk["aux"]["ID"])
        text = chunk.get("stream") or chunk.get("status") or ""
        for line in str(text).splitlines():
            log_file.write(line + "\n")
            if not line.strip():
                continue
            tail.append(line)
            del tail[:-40]
            m = _STEP.match(line)
            if m:
                current = f"step {m.group(1)}/{m.group(2)} ({m.group(3)[:60]})"
                display.step(int(m.group(1)), int(m.group(2)), m.group(3))
            else:
                display.line(line)
            m = re.match(r"Successfully built ([0-9a-f]+)", line)
            if m and image_id is None:
                image_id = m.group(1)
    return image_id, tail


def build_image(
    client: Any,
    build: ImageBuild,
    *,
    home: Path | None = None,
    say: Callable[[str], None] | None = None,
    progress: bool | None = None,
) -> BuiltImage:
    """Build (or rebuild) the image and record its id; streams the log with a progress display."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    home = home or ftx_home()
    context, commit = backend_checkout(build, home, say)
    dockerfile = context / build.dockerfile
    if not dockerfile.is_file():
        raise ConfigError(
            f"{context} has no {build.dockerfile}",
            hint="--backend-repo must be a fastertransformer_backend checkout (or its git URL)",
        )
    patched = patch_dockerfile(dockerfile.read_text(), build.sm)
    images_dir = home / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", build.tag)
    patched_path = images_dir / f"{safe}.Dockerfile"
    patched_path.write_text(patched)
    log_path = images_dir / f"{safe}-{stamp}.build.log"
    labels = image_labels(build, commit, hashlib.sha256(patched.encode()).hexdigest())
    say(
        f"image     building {build.tag} from {build.base} (SM {build.sm_text or 'upstream default 70,75,80,86'}); "
        f"log: {log_path}"
    )
    with log_path.open("w") as log_file, BuildDisplay(say, progress) as display:
        try:
            chunks = client.api.build(
                path=str(context),
                dockerfile=str(patched_path),
                tag=build.tag,
                buildargs=build.build_args(),
                labels=labels,
                rm=True,
                forcerm=True,
                decode=True,
                nocache=build.no_cache,
            )
            image_id, _ = stream_build(chunks, display, log_file)
        except docker_errors() as exc:
            raise explain(exc, f"building {build.tag}") from None
    try:
        image = client.images.get(build.tag)
    except docker_errors() as exc:
        raise explain(exc, f"reading back {build.tag}") from None
    if image_id and not image.id.endswith(image_id.removeprefix("sha256:")):
        log.warning("image.id_mismatch", streamed=image_id, tagged=image.id)
    record = record_image(home, build.tag, image.id, labels, log_path)
    say(f"image     built {build.tag} = {image.id}")
    log.info("image.built", tag=build.tag, id=image.id, record=str(record))
    return BuiltImage(build.tag, image.id, record, log_path, labels)


# --------------------------------------------------------------------------- records and listing


def record_image(home: Path, tag: str, image_id: str, labels: Mapping[str, str], log_path: Path | None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", tag)
    path = home / "images" / f"{safe}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "tag": tag,
        "id": image_id,
        "labels": dict(labels),
        "log": str(log_path) if log_path else None,
        "recorded_at": _now(),
    }
    write_json_atomic(path, data, indent=2, sort_keys=True)
    return path


def image_records(home: Path | None = None) -> list[dict[str, Any]]:
    directory = (home or ftx_home()) / "images"
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return out


@dataclass(frozen=True)
class ImageInfo:
    tag: str
    id: str
    kind: str
    created: str
    size: int
    labels: Mapping[str, str]
    present: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"labels": dict(self.labels)}


def list_images(client: Any | None, home: Path | None = None) -> list[ImageInfo]:
    """ftx's images on the daemon (by label), plus recorded builds whose image is gone."""
    infos: list[ImageInfo] = []
    seen: set[str] = set()
    if client is not None:
        try:
            images = client.images.list(filters={"label": KIND_LABEL})
        except docker_errors() as exc:
            raise explain(exc, "listing images") from None
        for image in images:
            labels = image.labels or {}
            for tag in image.tags or ["<none>"]:
                infos.append(
                    ImageInfo(
                        tag,
                        image.id,
                        labels.get(KIND_LABEL, "?"),
                        str(image.attrs.get("Created", ""))[:19],
                        int(image.attrs.get("Size") or 0),
                        labels,
                    )
                )
                seen.add(tag)
    for record in image_records(home):
        if record.get("tag") not in seen:
            labels = record.get("labels") or {}
            infos.append(
                ImageInfo(
                    record["tag"],
                    record.get("id", ""),
                    labels.get(KIND_LABEL, "?"),
                    str(record.get("recorded_at", ""))[:19],
                    0,
                    labels,
                    present=False,
                )
            )
    return infos


def resolve_image(client: Any, tag: str) -> str:
    """The id of image ``tag`` on the daemon, or an error that says how to get it."""
    import docker

    try:
        return str(client.images.get(tag).id)
    except docker.errors.ImageNotFound:
        hint = (
            "build it with `ftx image build`"
            if tag.startswith(DEFAULT_IMAGE_REPOSITORY)
            else "build or load it, or pass --image with an image that exists (`ftx image ls`)"
        )
        raise ToolError(f"the FasterTransformer image {tag} is not on this Docker host", hint=hint) from None
    except docker_errors() as exc:
        raise explain(exc, f"looking up image {tag}") from None
