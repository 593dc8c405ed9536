"""GPU-host checks of the fastertransformer runtime (``-m gpu``; skipped where there is no nvidia-smi).

They need what the test machine lacks: an NVIDIA driver, and for the container checks Docker with
the NVIDIA runtime. The real FasterTransformer image is not needed: the device request is checked with
the stand-in image (the NVIDIA runtime mounts ``nvidia-smi`` into any container).
"""

from __future__ import annotations

import shutil
from typing import Any

import docker_daemon
import pytest
from ftx_triton.runtime.fastertransformer import gpus as gpus_mod
from ftx_triton.runtime.fastertransformer.docker.spec import ContainerSpec

docker_client = docker_daemon.docker_client  # a session fixture (shared daemon and images; see docker_daemon)
standin_image = docker_daemon.standin_image  # a session fixture (shared daemon and images; see docker_daemon)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (no nvidia-smi)"),
]


def test_local_gpus_and_sm_match_torch() -> None:
    gpus_mod.local_gpus.cache_clear()
    found = gpus_mod.local_gpus()
    assert found, "nvidia-smi is present but listed no GPU"
    assert all(g.sm is not None for g in found)
    assert gpus_mod.default_sm(found) == tuple(sorted({g.sm for g in found if g.sm in gpus_mod.FT_SM_SETS}))
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    assert len(found) == torch.cuda.device_count()
    for gpu in found:
        major, minor = torch.cuda.get_device_capability(gpu.index)
        assert gpu.sm == major * 10 + minor


@pytest.mark.docker
def test_device_request_gives_exactly_the_requested_gpus(docker_client: Any, standin_image: str) -> None:
    if "nvidia" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("Docker has no NVIDIA runtime on this host")
    count = min(2, len(gpus_mod.local_gpus()))
    spec = ContainerSpec(
        image=standin_image,
        command=("nvidia-smi", "-L"),
        gpus=tuple(str(i) for i in range(count)),
        environment={"NVIDIA_DRIVER_CAPABILITIES": "utility"},
        network_mode="none",
    )
    out = docker_client.containers.run(remove=True, **spec.create_kwargs()).decode()
    assert len([line for line in out.splitlines() if line.startswith("GPU ")]) == count
