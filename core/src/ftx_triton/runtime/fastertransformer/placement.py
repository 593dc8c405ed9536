"""How a FasterTransformer model is laid out over the GPUs ftx sees: the smallest tp x pp that fits.

A pure function of the model's footprint (weight bytes in the compute type, layers, attention width,
the sizes tp must divide) and the GPU inventory (bytes of memory per GPU): for each world size from 1
up, the widest tp first (tensor parallelism over NVLink costs less latency than a pipeline), the
first layout whose share of the weights, plus its share of the KV cache for the configured batch and
sequence length, plus a fixed workspace fits the smallest GPU is chosen; the GPUs left over hold more
model instances. A model that fits no layout is a :class:`~ftx_triton.errors.ConfigError` raised before
anything is downloaded. The figures go into ``--dry-run``'s explanation.

Hand-written arithmetic: no library plans FasterTransformer's layouts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ftx_triton.errors import ConfigError
from ftx_triton.repository.model_config import context_size
from ftx_triton.runtime.api import Layout
from ftx_triton.runtime.fastertransformer import gpus as inventory
from ftx_triton.runtime.fastertransformer.options import FtLaunchSection, parse_gpus

if TYPE_CHECKING:
    from ftx_triton.conversion.family import Family, ModelSpec
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.runtime.api import Runtime
    from ftx_triton.runtime.fastertransformer.gpus import Gpu

GiB = 1 << 30
WORKSPACE_BYTES = 2 * GiB + GiB // 2
"""Per GPU beyond weights and KV cache: the CUDA context, cuBLAS workspace, NCCL buffers, activations.
Two H100s serving a GPT-J-6B shape at tp=2 (fp16, batch 8) held 8.2 and 7.6 GiB for 5.6 GiB of weights."""
USABLE_FRACTION = 0.95
"""Of a GPU's memory, what a layout may plan to use (the driver and fragmentation keep the rest)."""
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class Footprint:
    """What decides a model's memory on GPUs."""

    weight_bytes: int
    layers: int
    kv_width: int
    """Keys (= values) per token and layer: heads x head size."""
    kv_dtype_bytes: int = 2
    tp_divides: tuple[int, ...] = ()
    """Sizes every tp must divide (heads, the feed-forward width)."""

    def kv_bytes(self, batch: int, seq_len: int) -> int:
        """Keys and values of every layer for ``batch`` sequences of ``seq_len`` tokens."""
        return 2 * self.layers * batch * seq_len * self.kv_width * self.kv_dtype_bytes


@dataclass(frozen=True)
class Placement:
    tp: int
    pp: int
    instances: int
    need_per_gpu: int
    gpu_bytes: int
    gpus: int
    reason: str

    @property
    def world(self) -> int:
        return self.tp * self.pp


def human(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def need_per_gpu(footprint: Footprint, tp: int, pp: int, batch: int, seq_len: int) -> int:
    world = tp * pp
    return (footprint.weight_bytes + footprint.kv_bytes(batch, seq_len)) // world + WORKSPACE_BYTES


def layouts(footprint: Footprint, gpus: int) -> list[tuple[int, int]]:
    """(tp, pp) FasterTransformer can run on at most ``gpus`` GPUs, smallest world first, widest tp first."""
    out = []
    for world in range(1, gpus + 1):
        for tp in range(world, 0, -1):
            if world % tp:
                continue
            pp = world // tp
            if all(size % tp == 0 for size in footprint.tp_divides) and footprint.layers % pp == 0:
                out.append((tp, pp))
    return out


def plan_placement(
    footprint: Footprint,
    gpu_memory: Sequence[int],
    *,
    batch: int,
    seq_len: int,
    model: str = "the model",
    pp: int | None = None,
    instances: int | None = None,
) -> Placement:
    """The smallest tp x pp that fits the smallest of ``gpu_memory`` (bytes per GPU), instances filling the
    rest; ConfigError when no layout fits (see the module docstring). ``pp`` and ``instances``, when the
    user gave them, are kept: only tp is chosen, among layouts that leave room for every instance."""
    if not gpu_memory:
        raise ConfigError(
            "no GPU found: FasterTransformer needs at least one",
            hint="run on a GPU host (nvidia-smi lists its GPUs), or use --runtime python",
        )
    usable = int(min(gpu_memory) * USABLE_FRACTION)
    kv = footprint.kv_bytes(batch, seq_len)
    copies = instances or 1
    candidates = [(t, p) for t, p in layouts(footprint, len(gpu_memory) // copies) if pp is None or p == pp]
    for tp, stages in candidates:
        need = need_per_gpu(footprint, tp, stages, batch, seq_len)
        if need <= usable:
            world = tp * stages
            smaller = [(t, p) for t, p in candidates if t * p < world]
            why = (
                f"tp {tp} x pp {stages}: {human(need)} per GPU ({human(footprint.weight_bytes / world)} of weights, "
                f"{human(kv / world)} of KV cache for batch {batch} x {seq_len} tokens, {human(WORKSPACE_BYTES)} "
                f"workspace) fits {human(usable)} usable of each GPU"
            )
            if smaller:
                t, p = smaller[-1]
                why += f"; tp {t} x pp {p} would need {human(need_per_gpu(footprint, t, p, batch, seq_len))}"
            if instances is not None:
                why += f"; --instances {instances} as given"
            elif world == 1 and len(gpu_memory) > 1:
                why += f"; {len(gpu_memory)} instances fill the {len(gpu_memory)} GPUs"
            # one instance of a multi-GPU model: instances of one would share its GPUs (check_instances_share_gpus)
            filled = len(gpu_memory) if world == 1 else 1
            return Placement(tp, stages, instances or filled, need, usable, len(gpu_memory), why)
    widest = max(candidates, key=lambda c: (c[0] * c[1], c[0]), default=(1, pp or 1))
    need = need_per_gpu(footprint, *widest, batch, seq_len)
    kept = " ".join(f"--{name} {value}" for name, value in (("pp", pp), ("instances", instances)) if value is not None)
    raise ConfigError(
        f"{model} does not fit the {len(gpu_memory)} GPU(s) here{f' with {kept}' if kept else ''}: "
        f"{human(footprint.weight_bytes)} of weights and {human(kv)} of KV cache for batch {batch} x {seq_len} "
        f"tokens need {human(need)} per GPU even at tp {widest[0]} x pp {widest[1]}, and each GPU has "
        f"{human(usable)} usable",
        hint="use more GPUs (or several machines with --hosts), a smaller --tune-batch (the batch planned for)"
        + (f", fewer than {kept}" if kept else "")
        + ", or a 16-bit --weight-dtype",
    )


def footprint_of(family: Family, spec: ModelSpec, dtype: str) -> Footprint:
    """A family's checkpoint's footprint in compute type ``dtype`` (parameters from its own table)."""
    from ftx_triton.plan.resources import parameter_count

    dims = spec.dims
    width = dims["N"] * dims["D"] if "N" in dims and "D" in dims else dims.get("H", 0)
    return Footprint(
        weight_bytes=parameter_count(family, spec) * DTYPE_BYTES.get(dtype, 2),
        layers=sum(spec.layers.values()) or 1,
        kv_width=width,
        kv_dtype_bytes=DTYPE_BYTES.get(dtype, 2),
        tp_divides=tuple(dims[d] for d in spec.tp_divisible if d in dims),
    )


def auto_layout(
    settings: RunSettings,
    family: Family,
    hf_config: Mapping[str, object],
    runtime: Runtime,
    gpus: Sequence[Gpu] | None = None,
) -> Layout:
    """``--tp auto`` on a FasterTransformer runtime: the layout over this machine's GPUs (``gpus``, default the
    local ones) for the tuning batch (``--tune-batch`` x ``--tune-beam``) of full-context sequences (tp 1 where no
    GPU is seen: such a machine can only plan; ``--gpus`` narrows them)."""
    launch = settings.options(FtLaunchSection)
    if launch.hosts:
        raise ConfigError(
            "--tp auto (the default) plans the GPUs of this machine only; a --hosts layout needs --tp and --pp",
            hint="give --tp (GPUs per machine) and --pp (machines), e.g. --tp 8 --pp 2",
        )
    found = tuple(inventory.local_gpus()) if gpus is None else tuple(gpus)  # read when called: tests set it
    if launch.gpus not in (None, "", ()):  # --gpus 0: plan over the GPUs the run may use
        assert launch.gpus is not None
        chosen = set(parse_gpus(launch.gpus))
        found = tuple(g for g in found if g.index in chosen)
    memory = [g.memory_mib << 20 for g in found if g.memory_mib]
    pp, instances = settings.configure.pp, settings.configure.instances
    if not memory:  # planning (--dry-run, a lock) works anywhere; serving is refused by the runtime's own check
        return Layout(
            1,
            pp,
            instances,
            f"tp 1 (no GPU {'memory is' if found else 'is'} seen here to plan over; the {runtime.name} runtime "
            "serves on a GPU host, which plans its own layout, or give --tp)",
        )
    dtype = settings.configure.data_type or runtime.default_data_type or settings.convert.weight_dtype
    placement = plan_placement(
        footprint_of(family, family.spec(dict(hf_config)), dtype),
        memory,
        batch=settings.tune.tune_batch * settings.tune.tune_beam,
        seq_len=context_size(hf_config) or 2048,
        model=settings.model,
        pp=pp if pp != 1 else None,  # --pp N given: kept
        instances=instances if instances != 1 else None,
    )
    return Layout(placement.tp, placement.pp, placement.instances, placement.reason)


__all__ = ["Footprint", "Placement", "auto_layout", "footprint_of", "layouts", "need_per_gpu", "plan_placement"]
