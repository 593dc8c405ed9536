"""FasterTransformer's silent failures, found in the server log and turned into errors.

FasterTransformer often only *warns* and keeps serving: a weight file that "cannot be opened"
leaves uninitialised memory in place and the server answers with garbage; a missing
``gemm_config.in`` silently falls back to default GEMM algorithms. Each rule below matches one
such line (texts as printed by FasterTransformer, its Triton backend and the CUDA runtime) and says
what it means and how to fix it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    """One log line that matters."""

    kind: str
    severity: str  # "error" stops the run, "warning" is reported
    message: str
    hint: str
    line: str


@dataclass(frozen=True)
class Rule:
    kind: str
    pattern: re.Pattern[str]
    describe: Callable[[re.Match[str], ScanContext], tuple[str, str, str] | None]
    """match -> (severity, message, hint), or None to ignore the line."""


@dataclass
class ScanContext:
    """What the scanner knows about the run."""

    tp: int = 1
    pp: int = 1
    expect_gemm: bool = False
    gpu_sm: tuple[int, ...] = ()
    image: str = ""
    work_dir: str = ""
    """The server's working directory when it runs on the host (the native launcher); empty in Docker."""
    rebuild: str = ""
    """The command that rebuilds the backend for other GPUs (default: the Docker image's)."""


def _weight_missing(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "error",
        f"FasterTransformer could not open the weight file {m.group('file')}; it would serve garbage from "
        "uninitialised weights",
        "the converted checkpoint at config.pbtxt's model_checkpoint_path is incomplete, not mounted in the "
        "container, or converted for another --tp; convert again (`ftx run MODEL --force convert`) and keep "
        "--tp the same for convert and serve",
    )


def _weight_short(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "error",
        f"FasterTransformer found the weight file {m.group('file')} too small ({m.group('has')} values, "
        f"needs {m.group('want')})",
        "config.ini's weight_data_type does not match the dtype the files were written in, or the files are for "
        "another --tp; convert again with the --weight-dtype and --tp you serve with",
    )


def _config_ini(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "error",
        f"FasterTransformer cannot read {m.group('file')}",
        "model_checkpoint_path in config.pbtxt must be the <tp>-gpu directory holding config.ini, mounted into "
        "the container at the same path",
    )


def _world_size(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    world, tp, pp = m.group("world"), m.group("tp"), m.group("pp")
    return (
        "error",
        f"FasterTransformer sees {world} GPU(s) but the model is configured for tensor_para_size {tp} x "
        f"pipeline_para_size {pp}",
        f"the container must see exactly tp x pp GPUs (ftx passes --tp {c.tp} --pp {c.pp} as "
        f"{c.tp * c.pp} GPU(s) and CUDA_VISIBLE_DEVICES); make config.pbtxt and the converted <tp>-gpu "
        "directory agree with --tp/--pp (`ftx run MODEL --tp N --force configure`)",
    )


def _visible_gpus(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "error",
        "the FasterTransformer backend refused the GPU layout: the visible GPUs must be a multiple of TP x PP "
        "and at most instance count x TP x PP",
        f"serve with exactly tp x pp = {c.tp * c.pp} GPU(s) per instance (--gpus), and --instances 1 for multi-node",
    )


def _wrong_sm(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    sm = ",".join(map(str, c.gpu_sm)) or "<your GPU's SM, e.g. 90 for H100>"
    if c.rebuild:
        return (
            "error",
            f"the FasterTransformer build has no GPU code for this GPU ({m.group(0).strip()})",
            f"rebuild it for this GPU: `{c.rebuild} --sm {sm}`",
        )
    return (
        "error",
        f"the FasterTransformer image has no GPU code for this GPU ({m.group(0).strip()}): it was compiled "
        "for other compute capabilities",
        f"rebuild the image for this GPU: `ftx image build --sm {sm}` (upstream's Dockerfile builds only "
        "sm 70/75/80/86)",
    )


def _gemm_missing(m: re.Match[str], c: ScanContext) -> tuple[str, str, str] | None:
    if not c.expect_gemm:
        return None
    return (
        "error",
        "gemm_config.in was tuned for this run but FasterTransformer did not find it in its working "
        "directory; it is using default GEMM algorithms",
        "the server must start in the directory holding gemm_config.in ("
        + (f"ftx starts it in {c.work_dir}" if c.work_dir else "ftx mounts it and sets -w")
        + "); re-run with --force tune, or --no-tune to serve untuned on purpose",
    )


def _custom_all_reduce_off(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "warning",
        f"FasterTransformer's custom all-reduce is off ({m.group('why')}); the GPUs reduce through NCCL",
        "it needs 2, 4 or 8 GPUs that reach each other's memory (NVLink or PCIe peer access: "
        "`nvidia-smi topo -m`); --no-custom-all-reduce chooses NCCL on purpose",
    )


def _driver(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "error",
        f"the NVIDIA driver cannot run this image's CUDA ({m.group(0).strip()})",
        "upgrade the host driver to one that supports the image's CUDA version, or build the image on an "
        "older Triton release (`ftx image build --triton-version …`)",
    )


def _oom(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "error",
        "the GPUs ran out of memory while loading or running the model",
        "spread the model over more GPUs (--tp), lower --max-batch-size, or use fp16/bf16 weights",
    )


def _load_failed(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "error",
        f"Triton failed to load model {m.group('model')!r}: {m.group('reason').strip()}",
        "the lines above say why; `Unsupported` means a GPU-count or instance_group rule was broken "
        "(tp x pp GPUs per instance, KIND_CPU, one instance for multi-node)",
    )


def _kind_cpu(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "error",
        "the fastertransformer model must use instance_group kind KIND_CPU",
        "let ftx write config.pbtxt (`ftx run MODEL --force configure`)",
    )


def _crash(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "error",
        f"the server crashed ({m.group(0).strip()})",
        "a crash while loading usually means a backend/Triton build mismatch or too little memory; rebuild "
        "the image with `ftx image build` and check the lines above",
    )


def _cuda_error(m: re.Match[str], c: ScanContext) -> tuple[str, str, str]:
    return (
        "error",
        f"FasterTransformer hit a CUDA error: {m.group('what').strip()}",
        "check the GPU (nvidia-smi), the driver version and the lines above",
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "weight-missing", re.compile(r"file\s*(?P<file>\S+?)\s*cannot be opened, loading model fails"), _weight_missing
    ),
    Rule(
        "weight-size",
        re.compile(
            r"file (?P<file>\S+) only has (?P<has>\d+), but request (?P<want>\d+), "
            r"loading model fails"
        ),
        _weight_short,
    ),
    Rule("config-ini", re.compile(r"Can't load '(?P<file>[^']*config\.ini)'"), _config_ini),
    Rule(
        "world-size",
        re.compile(
            r"world_size \((?P<world>\d+)\) should equal to tensor_para_size_? \* "
            r"(?:pipeline|layer)_para_size_? \((?P<tp>\d+) \* (?P<pp>\d+)"
        ),
        _world_size,
    ),
    Rule("world-size", re.compile(r"Number of visible GPUs must be evenly divisi?ble by TP \* PP"), _visible_gpus),
    Rule(
        "wrong-sm",
        re.compile(r"invalid device function|no kernel image is available for execution on the device"),
        _wrong_sm,
    ),
    Rule("gemm-missing", re.compile(r"gemm_config\.in is not found; using default GEMM algo"), _gemm_missing),
    Rule(
        "custom-all-reduce", re.compile(r"custom all-reduce is off: (?P<why>.*?); using NCCL"), _custom_all_reduce_off
    ),
    Rule(
        "driver",
        re.compile(
            r"(?:CUDA runtime error: )?(?:CUDA driver version is insufficient for CUDA runtime "
            r"version|API call is not supported in the installed CUDA driver|"
            r"CUDA runtime error: operation not supported)"
        ),
        _driver,
    ),
    Rule("oom", re.compile(r"CUDA runtime error: out of memory|CUDA out of memory|CUBLAS_STATUS_ALLOC_FAILED"), _oom),
    Rule("kind-cpu", re.compile(r"only KIND_CPU supports"), _kind_cpu),
    Rule("cuda-error", re.compile(r"\[FT\]\[ERROR\] CUDA runtime error: (?P<what>.*)"), _cuda_error),
    Rule("load-failed", re.compile(r"failed to load '(?P<model>[^']+)' version \d+: (?P<reason>.*)"), _load_failed),
    Rule("crash", re.compile(r"Signal \((?:6|11)\) received|Segmentation fault|core dumped"), _crash),
)


@dataclass
class LogScanner:
    """Feed it log lines; it keeps the findings (first error first)."""

    context: ScanContext = field(default_factory=ScanContext)
    findings: list[Finding] = field(default_factory=list)
    gemm_not_found: bool = False

    def scan(self, line: str) -> Finding | None:
        for rule in RULES:
            m = rule.pattern.search(line)
            if not m:
                continue
            if rule.kind == "gemm-missing":
                self.gemm_not_found = True
            described = rule.describe(m, self.context)
            if described is None:
                return None
            severity, message, hint = described
            finding = Finding(rule.kind, severity, message, hint, line.strip())
            self.findings.append(finding)
            return finding
        return None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def first_error(self) -> Finding | None:
        """The most telling error: specific causes before Triton's generic "failed to load"/crash lines."""
        errors = self.errors
        if not errors:
            return None
        generic = ("load-failed", "crash", "cuda-error")
        specific = [f for f in errors if f.kind not in generic]
        return (specific or errors)[0]

    def summary(self, finding: Finding) -> str:
        """The finding's message, with how many lines of the same kind were seen."""
        same = [f for f in self.findings if f.kind == finding.kind]
        more = f" ({len(same)} such lines, e.g. {finding.line!r})" if len(same) > 1 else f" (log: {finding.line!r})"
        return finding.message + more
