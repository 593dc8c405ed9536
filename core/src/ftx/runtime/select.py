"""``--runtime auto``: the fastertransformer runtime when Docker, an NVIDIA runtime and the image exist."""

from __future__ import annotations

from ftx.errors import ConfigError


def fastertransformer_available() -> tuple[bool, str]:
    """Whether the FasterTransformer image can run here, and why not."""
    try:
        import docker
    except ImportError:
        return False, "the docker SDK is not installed"
    try:
        client = docker.from_env(timeout=3)
        info = client.info()
    except Exception:
        return False, "no Docker daemon is reachable"
    runtimes = info.get("Runtimes") or {}
    if "nvidia" not in runtimes:
        return False, "Docker has no NVIDIA runtime (no GPU support)"
    try:
        from ftx.docker_runtime import DEFAULT_IMAGE_TAG
    except ImportError:
        return False, "the fastertransformer runtime is not available in this ftx build"
    try:
        client.images.get(DEFAULT_IMAGE_TAG)
    except Exception:
        return False, f"the image {DEFAULT_IMAGE_TAG} is not built (run `ftx image build`)"
    return True, "Docker, the NVIDIA runtime and the FasterTransformer image are present"


def choose_runtime(requested: str) -> tuple[str, str]:
    """Resolve ``auto`` and say why."""
    if requested == "python":
        return "python", "requested with --runtime python"
    if requested == "fastertransformer":
        return "fastertransformer", "requested with --runtime fastertransformer"
    if requested != "auto":
        raise ConfigError(f"unknown runtime {requested!r}", hint="use auto, python or fastertransformer")
    ok, why = fastertransformer_available()
    return ("fastertransformer", why) if ok else ("python", f"{why}; serving with the embedded python runtime")
