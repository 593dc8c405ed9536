"""GPT-NeoX: byte parity with FasterTransformer's converter, exact round trip, and the residual biases.

The sequential-residual test simulates FasterTransformer's tensor-parallel math with numpy (each
rank's partial matmuls, the all-reduce sum, the biases FT adds) on the converted files, and compares
with the Hugging Face model: that is what shows upstream's ``/ tp`` of two biases to be wrong.
"""

from __future__ import annotations

import hashlib
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from ftx_gptneox.family import GPTNeoX
from ftx_triton.conversion.convert import convert_directory, invert_checkpoint
from ftx_triton.conversion.dtypes import numpy_dtype
from ftx_triton.errors import ConfigError
from ftx_triton.formats.checkpoint import open_checkpoint
from ftx_triton.formats.ftformat import read_ini, read_tensor
from ftx_triton.testing.golden import GoldenRun, ini_mismatches, load_runs, mismatches
from repo_paths import GOLDEN_DIR

CASE = "gptneox-parallel"
SEPARATE_BIASES = ("attention.dense.bias", "mlp.dense_4h_to_h.bias")


def _runs() -> list[GoldenRun]:
    return list(load_runs(GOLDEN_DIR / CASE))


def _convert(src: Path, out: Path, *, tp: int, weight_dtype: str = "fp32", family: GPTNeoX | None = None) -> Path:
    family = family or GPTNeoX()
    return convert_directory(family, src, out, tp=tp, weight_dtype=weight_dtype).directory


def _assert_parity(out_root: Path, run: GoldenRun) -> None:
    """Every file FT's loader reads is byte-identical; config.ini keys FT reads are equal.

    With the parallel residual FT never reads the separate ``attention.dense.bias`` and
    ``mlp.dense_4h_to_h.bias`` files (golden README rule 2). Ours hold the full values; upstream's
    the values divided by tp — checked here by dividing ours like upstream does and hashing.
    """
    unread = {f"{run.tp}-gpu/model.layers.{i}.{name}.bin" for i in range(2) for name in SEPARATE_BIASES}
    problems = mismatches(out_root, run)
    assert [p for p in problems if p.split(" ", 1)[1] not in unread] == []
    dtype = numpy_dtype(run.dtype)
    for rel in sorted(unread):
        ours = np.fromfile(out_root / rel, dtype=dtype)
        as_upstream = ours / np.asarray(run.tp, dtype=dtype) if run.tp > 1 else ours
        assert hashlib.sha256(as_upstream.tobytes()).hexdigest() == run.files[rel]["sha256"], rel
    assert ini_mismatches(out_root, run) == []


@pytest.mark.parametrize("run", _runs(), ids=lambda r: r.id)
def test_gptneox_matches_upstream_bytes(golden: Path, tmp_path: Path, run: GoldenRun) -> None:
    _convert(golden / CASE / "hf", tmp_path, tp=run.tp, weight_dtype=run.dtype)
    _assert_parity(tmp_path, run)


def test_gptneox_cli_convert_matches_upstream(golden: Path, tmp_path: Path, ftx_cli) -> None:
    run = next(r for r in _runs() if r.tp == 2 and r.dtype == "fp16")
    out = tmp_path / "out"
    result = ftx_cli(
        "convert",
        str(golden / CASE / "hf"),
        "--family",
        "gptneox",
        "--tp",
        "2",
        "--weight-dtype",
        "fp16",
        "-o",
        str(out),
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(out / "2-gpu")
    _assert_parity(out, run)


def test_gptneox_is_detected_from_config_json(golden: Path, plugin_host) -> None:
    family, _ = plugin_host.family_for_source(golden / CASE / "hf")
    assert family.name == "gptneox"


def test_old_pytorch_checkpoints_with_buffers_convert_the_same(models_root: Path, tmp_path: Path) -> None:
    """Pythia / GPT-NeoX-20B era ``pytorch_model.bin`` files also hold the causal-mask and rotary
    buffers; they are skipped, and the output equals the safetensors conversion."""
    import shutil

    import torch
    from safetensors.torch import load_file

    src = _tiny(models_root, True, 0.25, 4)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shutil.copy(src / "config.json", legacy / "config.json")
    state = load_file(src / "model.safetensors")
    for i in range(2):
        state[f"gpt_neox.layers.{i}.attention.bias"] = torch.tril(torch.ones(1, 1, 128, 128, dtype=torch.bool))
        state[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
        state[f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"] = torch.ones(2)
    torch.save(state, legacy / "pytorch_model.bin")
    a, b = _convert(src, tmp_path / "a", tp=2), _convert(legacy, tmp_path / "b", tp=2)
    for path in a.glob("*.bin"):
        assert path.read_bytes() == (b / path.name).read_bytes(), path.name


def test_tied_checkpoint_without_embed_out_uses_the_input_embedding(models_root: Path, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    src = _tiny(models_root, True, 0.25, 4)
    tied = tmp_path / "tied"
    tied.mkdir()
    shutil.copy(src / "config.json", tied / "config.json")
    state = load_file(src / "model.safetensors")
    del state["embed_out.weight"]
    save_file(state, tied / "model.safetensors", metadata={"format": "pt"})
    ft_dir = _convert(tied, tmp_path / "ft", tp=1)
    assert (ft_dir / "model.lm_head.weight.bin").read_bytes() == (ft_dir / "model.wte.bin").read_bytes()


# -- round trip ------------------------------------------------------------------------------------


@cache
def _tiny(root: Path, parallel: bool, rotary_pct: float, heads: int) -> Path:
    from ftx_gptneox.tiny import tiny_gptneox

    dest = root / f"neox-{'par' if parallel else 'seq'}-{rotary_pct}-{heads}h"
    if not (dest / "config.json").exists():
        tiny_gptneox(
            dest,
            use_parallel_residual=parallel,
            rotary_pct=rotary_pct,
            num_attention_heads=heads,
            tokenizer=False,
            random_init=True,
            seed=heads,
        )
    return dest


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("neox-models")


@pytest.mark.parametrize("heads", [4, 8])
@pytest.mark.parametrize("rotary_pct", [0.25, 1.0])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
def test_gptneox_round_trip_is_exact(
    models_root: Path, tmp_path: Path, parallel: bool, tp: int, rotary_pct: float, heads: int
) -> None:
    src = _tiny(models_root, parallel, rotary_pct, heads)
    ft_dir = _convert(src, tmp_path, tp=tp)
    ini = read_ini(ft_dir / "config.ini")["gptneox"]
    assert ini["use_gptj_residual"] == str(int(parallel))
    assert ini["rotary_embedding"] == str(int(64 // heads * rotary_pct))
    assert (ft_dir / "model.layers.0.mlp.attention.bias.sum.bin").exists() == parallel
    reader = open_checkpoint(src)
    original = {n: reader.read(n) for n in reader.names()}
    rebuilt = dict(invert_checkpoint(GPTNeoX(), ft_dir))
    assert set(rebuilt) == set(original)
    for name, tensor in original.items():
        assert rebuilt[name].dtype == np.float32
        np.testing.assert_array_equal(rebuilt[name], tensor, err_msg=name)


def test_gptneox_inverse_rebuilds_the_same_transformers_model(models_root: Path, tmp_path: Path) -> None:
    """What the python runtime does: config from config.ini, tensors from the FT files -> same logits."""
    import torch
    from ftx_triton.runtime.python.hf_model import load_model
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    src = _tiny(models_root, False, 0.25, 4)
    ft_dir = _convert(src, tmp_path, tp=2)
    config = GPTNeoX().hf_config_from_ini(read_ini(ft_dir / "config.ini"))
    read_back, source = GPTNeoXConfig(**config), GPTNeoXConfig.from_pretrained(src)  # same shape, either spelling
    shape = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "use_parallel_residual")
    assert [getattr(read_back, k) for k in shape] == [getattr(source, k) for k in shape]
    # every tensor of the model from the FT files (transformers 5's renamed parameters included), none left over
    rebuilt = load_model(GPTNeoX(), ft_dir, device="cpu", data_type="fp32").model
    original = GPTNeoXForCausalLM.from_pretrained(src).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert torch.equal(rebuilt(ids).logits, original(ids).logits)


# -- FasterTransformer's tensor-parallel math, simulated ---------------------------------------------


def _layernorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


_erf = np.vectorize(math.erf)


def _gelu(x: np.ndarray) -> np.ndarray:
    # The checkpoint's exact GELU (FT's kernel is the tanh form; the activation is not what is tested).
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _rotary(x: np.ndarray, rot: int) -> np.ndarray:
    """NeoX "rotate half" rotary on the first ``rot`` dims of every head; x: [T, heads, D], base 10000."""
    if rot == 0:
        return x
    positions = np.arange(x.shape[0], dtype=np.float64)
    inv_freq = 1.0 / (10000 ** (np.arange(0, rot, 2, dtype=np.float64) / rot))
    angles = np.concatenate([np.outer(positions, inv_freq)] * 2, axis=-1)[:, None, :]  # [T, 1, rot]
    part, rest = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = np.concatenate([-part[..., half:], part[..., :half]], axis=-1)
    return np.concatenate([part * np.cos(angles) + rotated * np.sin(angles), rest], axis=-1)


def ft_neox_logits(ft_dir: Path, tokens: list[int]) -> np.ndarray:
    """Logits of a converted ``<tp>-gpu`` directory computed the way FasterTransformer splits the work.

    Every rank holds its heads' QKV columns, its rows of ``attention.dense``, its FFN slice; it
    produces a partial output that the all-reduce sums. Parallel residual (``use_gptj_residual=1``):
    each rank adds ``mlp.attention.bias.sum`` to its partial before the single all-reduce.
    Sequential residual: ``attention.dense.bias`` and ``mlp.dense_4h_to_h.bias`` are added once,
    after each sub-layer's all-reduce.
    """
    ini = read_ini(ft_dir / "config.ini")["gptneox"]
    n, d, inner = int(ini["head_num"]), int(ini["size_per_head"]), int(ini["inter_size"])
    h, vocab, rot = n * d, int(ini["vocab_size"]), int(ini["rotary_embedding"])
    tp, parallel = int(ft_dir.name.split("-")[0]), ini["use_gptj_residual"] == "1"
    dtype = numpy_dtype(ini["weight_data_type"])

    def load(name: str, *shape: int) -> np.ndarray:
        return read_tensor(ft_dir / f"{name}.bin", dtype, shape).astype(np.float64)

    steps = len(tokens)
    causal = np.triu(np.full((steps, steps), -np.inf), k=1)
    x = load("model.wte", vocab, h)[tokens]
    for layer in range(int(ini["num_layer"])):
        p = f"model.layers.{layer}"
        ln1 = _layernorm(x, load(f"{p}.input_layernorm.weight", h), load(f"{p}.input_layernorm.bias", h))
        ln2_weights = load(f"{p}.post_attention_layernorm.weight", h), load(f"{p}.post_attention_layernorm.bias", h)

        def attention(rank: int, inp: np.ndarray, p: str = p) -> np.ndarray:
            w = load(f"{p}.attention.query_key_value.weight.{rank}", h, 3, h // tp)
            b = load(f"{p}.attention.query_key_value.bias.{rank}", 3, h // tp)
            qkv = np.einsum("th,hcj->tcj", inp, w) + b
            q, k, v = (qkv[:, c].reshape(steps, n // tp, d) for c in range(3))
            q, k = _rotary(q, rot), _rotary(k, rot)
            scores = np.einsum("tnd,snd->nts", q, k) / math.sqrt(d) + causal
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            context = np.einsum("nts,snd->tnd", probs, v).reshape(steps, h // tp)
            return context @ load(f"{p}.attention.dense.weight.{rank}", h // tp, h)

        def mlp(rank: int, inp: np.ndarray, p: str = p) -> np.ndarray:
            up = inp @ load(f"{p}.mlp.dense_h_to_4h.weight.{rank}", h, inner // tp)
            up = _gelu(up + load(f"{p}.mlp.dense_h_to_4h.bias.{rank}", inner // tp))
            return up @ load(f"{p}.mlp.dense_4h_to_h.weight.{rank}", inner // tp, h)

        if parallel:
            ln2 = _layernorm(x, *ln2_weights)
            bias_sum = load(f"{p}.mlp.attention.bias.sum", h)
            x = x + sum(attention(r, ln1) + mlp(r, ln2) + bias_sum for r in range(tp))  # one all-reduce
        else:
            x = x + sum(attention(r, ln1) for r in range(tp)) + load(f"{p}.attention.dense.bias", h)
            ln2 = _layernorm(x, *ln2_weights)
            x = x + sum(mlp(r, ln2) for r in range(tp)) + load(f"{p}.mlp.dense_4h_to_h.bias", h)
    x = _layernorm(x, load("model.final_layernorm.weight", h), load("model.final_layernorm.bias", h))
    return x @ load("model.lm_head.weight", vocab, h).T


TOKENS = [3, 14, 15, 92, 65, 35, 89, 79]


def _hf_logits(src: Path) -> np.ndarray:
    import torch
    from transformers import GPTNeoXForCausalLM

    model = GPTNeoXForCausalLM.from_pretrained(src, attn_implementation="eager").double().eval()
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0].numpy()


def _upstream_style_copy(ft_dir: Path, dest: Path) -> Path:
    """The same files with the two output biases divided by tp, as upstream's converter writes them."""
    import shutil

    shutil.copytree(ft_dir, dest)
    tp = int(ft_dir.name.split("-")[0])
    for path in dest.glob("model.layers.*.bin"):
        if path.name.endswith(tuple(f".{name}.bin" for name in SEPARATE_BIASES)):
            (np.fromfile(path, dtype=np.float32) / tp).astype(np.float32).tofile(path)
    return dest


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sequential_residual_biases_are_full_values(models_root: Path, tmp_path: Path, tp: int) -> None:
    """FT with ``use_gptj_residual=0`` all-reduces each sub-layer's partial outputs and then adds
    ``attention.dense.bias`` / ``mlp.dense_4h_to_h.bias`` once. Our full-valued files reproduce the
    Hugging Face model at every tp; upstream's files (biases / tp) only at tp=1 — at tp>1 the
    model would run with each output bias shrunk to 1/tp of its trained value."""
    src = _tiny(models_root, False, 0.25, 4)
    ft_dir = _convert(src, tmp_path / "ours", tp=tp)
    expected = _hf_logits(src)
    np.testing.assert_allclose(ft_neox_logits(ft_dir, TOKENS), expected, rtol=1e-5, atol=1e-5)

    upstream = ft_neox_logits(_upstream_style_copy(ft_dir, tmp_path / "upstream" / ft_dir.name), TOKENS)
    if tp == 1:
        np.testing.assert_allclose(upstream, expected, rtol=1e-5, atol=1e-5)
    else:
        assert np.abs(upstream - expected).max() > 1e-2  # ours: ~1e-7


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_parallel_residual_bias_sum_reproduces_the_model(models_root: Path, tmp_path: Path, tp: int) -> None:
    """With the parallel residual every rank adds ``mlp.attention.bias.sum`` before the one all-reduce,
    so the file holds (attention bias + FFN bias) / tp; summed over tp ranks it is the full bias."""
    src = _tiny(models_root, True, 0.25, 4)
    ft_dir = _convert(src, tmp_path, tp=tp)
    np.testing.assert_allclose(ft_neox_logits(ft_dir, TOKENS), _hf_logits(src), rtol=1e-5, atol=1e-5)


# -- config, dtypes, presets, bad input -----------------------------------------------------------------


def test_config_ini_round_trips_to_the_same_spec(models_root: Path, tmp_path: Path) -> None:
    family = GPTNeoX()
    for parallel, pct in ((True, 0.25), (False, 1.0)):
        src = _tiny(models_root, parallel, pct, 8)
        ft_dir = _convert(src, tmp_path / f"{parallel}", tp=1)
        spec = family.spec(family.read_hf_config(src))
        again = family.spec_from_ini(read_ini(ft_dir / "config.ini"))
        assert again.as_dict() == spec.as_dict()
    assert spec.extra["rotary_embedding"] == spec.dims["D"] == 8


@pytest.mark.parametrize(
    ("preset", "values"),
    [
        (
            "gptneox",
            {
                "head_num": 32,
                "size_per_head": 128,
                "inter_size": 16384,
                "num_layer": 32,
                "rotary_embedding": 32,
                "vocab_size": 50432,
                "use_gptj_residual": 1,
            },
        ),
        (
            "gpt-neox-20b",
            {
                "head_num": 64,
                "size_per_head": 96,
                "inter_size": 24576,
                "num_layer": 44,
                "rotary_embedding": 24,
                "vocab_size": 50432,
                "use_gptj_residual": 1,
            },
        ),
    ],
)
def test_presets_plan_offline(preset: str, values: dict) -> None:
    family = GPTNeoX()
    hf_config = family.presets[preset].hf_config
    assert hf_config is not None
    spec = family.spec(hf_config)
    section = family.config_ini(spec, hf_config, "fp16")["gptneox"]
    assert {k: section[k] for k in values} == values
    spec.check_parallel(8, 1)


def test_weight_dtypes_and_compute_types(models_root: Path, tmp_path: Path) -> None:
    """bf16 *files* are read by FT's NeoX loader (BF16 case of loadWeightFromBin, converted into fp32
    or fp16 buffers); bf16 *compute* does not exist for GPT-NeoX."""
    import ml_dtypes

    family = GPTNeoX()
    assert family.data_types == ("fp32", "fp16")
    assert "bf16" in family.weight_dtypes
    src = _tiny(models_root, True, 0.25, 4)
    ft_dir = _convert(src, tmp_path, tp=2, weight_dtype="bf16")
    assert read_ini(ft_dir / "config.ini")["gptneox"]["weight_data_type"] == "bf16"
    assert (ft_dir / "model.wte.bin").stat().st_size == 256 * 64 * 2
    reader = open_checkpoint(src)
    for name, tensor in invert_checkpoint(family, ft_dir):
        want = reader.read(name).astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(tensor, want, err_msg=name)


@pytest.mark.parametrize("tp", [3, 8])
def test_tp_not_dividing_heads_is_refused_before_writing(models_root: Path, tmp_path: Path, tp: int) -> None:
    src = _tiny(models_root, True, 0.25, 4)
    with pytest.raises(ConfigError, match="head count = 4 is not divisible by --tp"):
        _convert(src, tmp_path / "out", tp=tp)
    assert not (tmp_path / "out").exists()


def test_tp_not_dividing_heads_cli(golden: Path, tmp_path: Path, ftx_cli) -> None:
    result = ftx_cli("convert", str(golden / CASE / "hf"), "--tp", "3", "-o", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert "not divisible by --tp 3" in result.stderr and "hint:" in result.stderr
    assert not (tmp_path / "out" / "3-gpu").exists()


@pytest.mark.parametrize(
    "change",
    [
        {"rotary_emb_base": 20000, "rope_theta": 20000},
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"attention_bias": False},
    ],
)
def test_configs_ft_would_run_differently_are_refused(golden: Path, change: dict) -> None:
    family = GPTNeoX()
    hf_config = {**family.read_hf_config(golden / CASE / "hf"), **change}
    with pytest.raises(ConfigError, match="FasterTransformer"):
        family.spec(hf_config)
