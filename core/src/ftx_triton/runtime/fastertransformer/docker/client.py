"""The Docker connection (Python SDK) and daemon errors a user can act on."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ftx_triton.errors import FtxError, ToolError

if TYPE_CHECKING:
    import docker

NVIDIA_TOOLKIT_HINT = (
    "install the NVIDIA Container Toolkit on the Docker host, run `nvidia-ctk runtime configure --runtime=docker` "
    "and restart dockerd; `docker info` must list an nvidia runtime"
)


def _sdk() -> Any:
    try:
        import docker
    except ImportError:
        raise ToolError(
            "the docker Python SDK is not installed",
            hint="pip install docker (it is a dependency of ftx; reinstall ftx)",
        ) from None
    return docker


def connect(base_url: str | None = None, timeout: int = 120) -> docker.DockerClient:
    """A client for the daemon at ``base_url`` (default: ``DOCKER_HOST`` or the local socket), pinged."""
    docker = _sdk()
    try:
        client = (
            docker.DockerClient(base_url=base_url, timeout=timeout) if base_url else docker.from_env(timeout=timeout)
        )
        client.ping()
    except docker.errors.DockerException as exc:
        raise daemon_unreachable(exc, base_url) from None
    except Exception as exc:  # requests' connection errors can surface unwrapped
        raise daemon_unreachable(exc, base_url) from None
    return client


def daemon_unreachable(exc: BaseException, base_url: str | None = None) -> ToolError:
    """The error for a daemon we cannot talk to, with the likely fix."""
    text = str(exc)
    where = base_url or "DOCKER_HOST or unix:///var/run/docker.sock"
    if "Permission denied" in text or "PermissionError" in text:
        hint = "add your user to the docker group (`sudo usermod -aG docker $USER`, then log in again) or run as root"
    else:
        hint = (
            "start the Docker daemon (`sudo systemctl start docker`), or point DOCKER_HOST at a running one; "
            "the fastertransformer runtime needs Docker with the NVIDIA runtime (`ftx run MODEL --runtime python` serves "
            "without Docker or a GPU)"
        )
    return ToolError(f"cannot reach a Docker daemon at {where}: {_first_line(text)}", hint=hint)


def explain(exc: BaseException, doing: str, error: type[FtxError] = ToolError) -> FtxError:
    """An actionable error for a failed Docker API call made while ``doing`` something."""
    text = _api_text(exc)
    if re.search(r"could not select device driver .* with capabilities: \[\[gpu\]\]", text):
        return error(
            f"{doing}: Docker cannot give GPUs to containers on this host (no NVIDIA container runtime)",
            hint=NVIDIA_TOOLKIT_HINT,
        )
    if "unknown or invalid runtime name: nvidia" in text:
        return error(f"{doing}: the nvidia runtime is not configured in dockerd", hint=NVIDIA_TOOLKIT_HINT)
    if re.search(r"No such image|not found: manifest unknown|ImageNotFound", text):
        return error(
            f"{doing}: the image is not present on this Docker host ({_first_line(text)})",
            hint="build it with `ftx image build` (or pass --image with one that exists)",
        )
    if re.search(r"pull access denied|no such host|dial tcp|TLS handshake timeout|connection refused", text):
        return error(
            f"{doing}: Docker could not reach the image registry ({_first_line(text)})",
            hint="pull or `docker load` the base image on a machine with registry access first",
        )
    if re.search(r"error setting rlimit type 8|setrlimit.*MEMLOCK.*operation not permitted", text):
        return error(
            f"{doing}: the Docker daemon may not raise the memlock limit to unlimited ({_first_line(text)})",
            hint="FasterTransformer's NCCL/pinned memory wants `--ulimit memlock=-1`: run dockerd as root "
            "with CAP_SYS_RESOURCE (not rootless Docker), or give its service LimitMEMLOCK=infinity",
        )
    if "bind source path does not exist" in text:
        return error(
            f"{doing}: a directory to mount does not exist on the Docker host ({_first_line(text)})",
            hint="the Docker daemon must run on this machine (paths are mounted at the same absolute path)",
        )
    if "is already in use by container" in text:
        return error(
            f"{doing}: {_first_line(text)}",
            hint="a server for this model is already running: stop it first (`docker stop <name>`)",
        )
    return error(f"{doing}: {_first_line(text)}")


def _api_text(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    if explanation:
        return explanation.decode() if isinstance(explanation, bytes) else str(explanation)
    return f"{type(exc).__name__}: {exc}"


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else "(no message)"


def docker_errors() -> tuple[type[BaseException], ...]:
    """Exception classes of the SDK and its transport, for ``except`` clauses."""
    docker = _sdk()
    import requests

    return (docker.errors.DockerException, requests.exceptions.RequestException)
