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
from functools import cached_property


@dataclass(frozen=True)
class Finding:
    """One log line that matters."""

    kind: str
    severity: str  # "error" stops the run, "warning" is reported
    message: str
    hint: str
    line: str


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


@dataclass(frozen=True)
class Rule:
    """One kind of log line: its pattern, and what it means as text templates.

    The templates are :meth:`str.format` strings over the match's named groups, ``line`` (the matched text),
    ``c`` (the :class:`ScanContext`) and the derived fields of :func:`_fields`.
    """

    kind: str
    pattern: str
    message: str
    hint: str
    severity: str = "error"
    when: Callable[[ScanContext], bool] = lambda c: True
    """Whether the rule applies to this run (a matching line it does not apply to is passed on)."""

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)

    def describe(self, m: re.Match[str], c: ScanContext) -> tuple[str, str]:
        """(message, hint) for a matching line."""
        fields = {**m.groupdict(), **_fields(m, c)}
        return self.message.format(**fields), self.hint.format(**fields)


def _fields(m: re.Match[str], c: ScanContext) -> dict[str, object]:
    """What the templates may name beside the match's groups."""
    return {
        "c": c,
        "line": m.group(0).strip(),
        "gpus": c.tp * c.pp,
        "sm": ",".join(map(str, c.gpu_sm)) or "<your GPU's SM, e.g. 90 for H100>",
        "gemm_dir": f"ftx starts it in {c.work_dir}" if c.work_dir else "ftx mounts it and sets -w",
    }


_WRONG_SM = r"invalid device function|no kernel image is available for execution on the device"

RULES: tuple[Rule, ...] = (
    Rule(
        "weight-missing",
        r"file\s*(?P<file>\S+?)\s*cannot be opened, loading model fails",
        "FasterTransformer could not open the weight file {file}; it would serve garbage from uninitialised weights",
        "the converted checkpoint at config.pbtxt's model_checkpoint_path is incomplete, not mounted in the "
        "container, or converted for another --tp; convert again (`ftx run MODEL --force convert`) and keep "
        "--tp the same for convert and serve",
    ),
    Rule(
        "weight-size",
        r"file (?P<file>\S+) only has (?P<has>\d+), but request (?P<want>\d+), loading model fails",
        "FasterTransformer found the weight file {file} too small ({has} values, needs {want})",
        "config.ini's weight_data_type does not match the dtype the files were written in, or the files are for "
        "another --tp; convert again with the --weight-dtype and --tp you serve with",
    ),
    Rule(
        "config-ini",
        r"Can't load '(?P<file>[^']*config\.ini)'",
        "FasterTransformer cannot read {file}",
        "model_checkpoint_path in config.pbtxt must be the <tp>-gpu directory holding config.ini, mounted into "
        "the container at the same path",
    ),
    Rule(
        "world-size",
        r"world_size \((?P<world>\d+)\) should equal to tensor_para_size_? \* "
        r"(?:pipeline|layer)_para_size_? \((?P<tp>\d+) \* (?P<pp>\d+)",
        "FasterTransformer sees {world} GPU(s) but the model is configured for tensor_para_size {tp} x "
        "pipeline_para_size {pp}",
        "the container must see exactly tp x pp GPUs (ftx passes --tp {c.tp} --pp {c.pp} as "
        "{gpus} GPU(s) and CUDA_VISIBLE_DEVICES); make config.pbtxt and the converted <tp>-gpu "
        "directory agree with --tp/--pp (`ftx run MODEL --tp N --force configure`)",
    ),
    Rule(
        "world-size",
        r"Number of visible GPUs must be evenly divisi?ble by TP \* PP",
        "the FasterTransformer backend refused the GPU layout: the visible GPUs must be a multiple of TP x PP "
        "and at most instance count x TP x PP",
        "serve with exactly tp x pp = {gpus} GPU(s) per instance (--gpus), and --instances 1 for multi-node",
    ),
    Rule(
        "wrong-sm",
        _WRONG_SM,
        "the FasterTransformer build has no GPU code for this GPU ({line})",
        "rebuild it for this GPU: `{c.rebuild} --sm {sm}`",
        when=lambda c: bool(c.rebuild),
    ),
    Rule(
        "wrong-sm",
        _WRONG_SM,
        "the FasterTransformer image has no GPU code for this GPU ({line}): it was compiled "
        "for other compute capabilities",
        "rebuild the image for this GPU: `ftx image build --sm {sm}` (upstream's Dockerfile builds only "
        "sm 70/75/80/86)",
    ),
    Rule(
        "gemm-missing",
        r"gemm_config\.in is not found; using default GEMM algo",
        "gemm_config.in was tuned for this run but FasterTransformer did not find it in its working "
        "directory; it is using default GEMM algorithms",
        "the server must start in the directory holding gemm_config.in ({gemm_dir}); re-run with --force tune, "
        "or --no-tune to serve untuned on purpose",
        when=lambda c: c.expect_gemm,
    ),
    Rule(
        "custom-all-reduce",
        r"custom all-reduce is off: (?P<why>.*?); using NCCL",
        "FasterTransformer's custom all-reduce is off ({why}); the GPUs reduce through NCCL",
        "it needs 2, 4 or 8 GPUs that reach each other's memory (NVLink or PCIe peer access: "
        "`nvidia-smi topo -m`); --no-custom-all-reduce chooses NCCL on purpose",
        severity="warning",
    ),
    Rule(
        "weight-loader",
        r"ftx: cannot pin (?P<bytes>\d+) bytes to load weights through \((?P<why>[^)]*)\)",
        "ftx's weight loader could not pin its staging buffers ({why}): the weights loaded through upstream "
        "FasterTransformer's slower path",
        "the server runs as it should, only its start is slower; the host may be short of free memory",
        severity="warning",
    ),
    Rule(
        "driver",
        r"(?:CUDA runtime error: )?(?:CUDA driver version is insufficient for CUDA runtime "
        r"version|API call is not supported in the installed CUDA driver|"
        r"CUDA runtime error: operation not supported)",
        "the NVIDIA driver cannot run this image's CUDA ({line})",
        "upgrade the host driver to one that supports the image's CUDA version, or build the image on an "
        "older Triton release (`ftx image build --triton-version …`)",
    ),
    Rule(
        "oom",
        r"CUDA runtime error: out of memory|CUDA out of memory|CUBLAS_STATUS_ALLOC_FAILED",
        "the GPUs ran out of memory while loading or running the model",
        "spread the model over more GPUs (--tp), lower --max-batch-size, or use fp16/bf16 weights",
    ),
    Rule(
        "kind-cpu",
        r"only KIND_CPU supports",
        "the fastertransformer model must use instance_group kind KIND_CPU",
        "let ftx write config.pbtxt (`ftx run MODEL --force configure`)",
    ),
    Rule(
        "cuda-error",
        r"\[FT\]\[ERROR\] CUDA runtime error: \s*(?P<what>.*?)\s*$",
        "FasterTransformer hit a CUDA error: {what}",
        "check the GPU (nvidia-smi), the driver version and the lines above",
    ),
    Rule(
        "load-failed",
        r"failed to load '(?P<model>[^']+)' version \d+: \s*(?P<reason>.*?)\s*$",
        "Triton failed to load model {model!r}: {reason}",
        "the lines above say why; `Unsupported` means a GPU-count or instance_group rule was broken "
        "(tp x pp GPUs per instance, KIND_CPU, one instance for multi-node)",
    ),
    Rule(
        "crash",
        r"Signal \((?:6|11)\) received|Segmentation fault|core dumped",
        "the server crashed ({line})",
        "a crash while loading usually means a backend/Triton build mismatch or too little memory; rebuild "
        "the image with `ftx image build` and check the lines above",
    ),
)


@dataclass
class LogScanner:
    """Feed it log lines; it keeps the findings (first error first)."""

    context: ScanContext = field(default_factory=ScanContext)
    findings: list[Finding] = field(default_factory=list)
    gemm_not_found: bool = False

    def scan(self, line: str) -> Finding | None:
        for rule in RULES:
            m = rule.regex.search(line)
            if not m:
                continue
            if rule.kind == "gemm-missing":
                self.gemm_not_found = True
            if not rule.when(self.context):
                continue
            message, hint = rule.describe(m, self.context)
            finding = Finding(rule.kind, rule.severity, message, hint, line.strip())
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
