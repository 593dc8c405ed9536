"""T5 family: round trip HF -> FT -> HF, tensor-parallel invariant, config.ini, presets and bad input,
on tiny offline checkpoints of several shapes (relu/gated, tied/untied, unequal stacks, N*D != H)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from ftx_t5.family import T5
from ftx_triton.conversion.convert import convert_checkpoint, ft_layout, invert_checkpoint
from ftx_triton.errors import ConfigError, MappingError
from ftx_triton.formats.checkpoint import open_checkpoint
from ftx_triton.formats.ftformat import read_ini, read_tensor
from safetensors.numpy import load_file, save_file

VARIANTS = {
    # name: tiny_t5 arguments
    "relu-tied": dict(),
    "gated-untied-3enc-1dec": dict(
        d_model=48,
        d_kv=8,
        num_heads=4,
        d_ff=96,
        num_layers=3,
        num_decoder_layers=1,
        gated=True,
        tie_word_embeddings=False,
        seed=1,
    ),
    "relu-tied-1enc-3dec": dict(d_model=32, d_kv=12, num_heads=2, d_ff=64, num_layers=1, num_decoder_layers=3, seed=2),
    "gated-tied": dict(gated=True, seed=3),
    "relu-untied": dict(tie_word_embeddings=False, seed=4),
}
ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from ftx_t5.tiny import tiny_t5

    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = tiny_t5(tmp_path_factory.mktemp(name), **VARIANTS[name])
        return built[name]

    return get


def convert(src: Path, out: Path, tp: int, weight_dtype: str = "fp32"):
    family = T5()
    hf_config = family.read_hf_config(src)
    spec = family.spec(hf_config)
    convert_checkpoint(family, open_checkpoint(src), hf_config, spec, out, tp=tp, weight_dtype=weight_dtype)
    return family, spec, out / f"{tp}-gpu"


# -- round trip ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_t5_round_trip_returns_every_tensor_exactly(tiny, tmp_path: Path, variant: str, tp: int) -> None:
    src = tiny(variant)
    family, spec, ft_dir = convert(src, tmp_path, tp)
    rebuilt = dict(invert_checkpoint(family, ft_dir))  # spec from config.ini, as the python runtime does
    reader = open_checkpoint(src)
    original = {n: reader.read(n) for n in reader.names()}
    tied = VARIANTS[variant].get("tie_word_embeddings", True)
    for alias in ALIASES:  # tied copies of shared.weight, if the checkpoint stores them
        if alias in original:
            np.testing.assert_array_equal(original.pop(alias), original["shared.weight"])
    expected_names = set(original) | ({"lm_head.weight"} if tied else set())
    assert set(rebuilt) == expected_names
    for name, tensor in original.items():
        assert rebuilt[name].dtype == np.float32
        np.testing.assert_array_equal(rebuilt[name], tensor, err_msg=name)
    if tied:
        np.testing.assert_array_equal(rebuilt["lm_head.weight"], original["shared.weight"])


@pytest.mark.parametrize("variant", ["relu-tied", "gated-untied-3enc-1dec", "relu-tied-1enc-3dec"])
def test_t5_rebuilt_model_generates_like_the_original(tiny, tmp_path: Path, variant: str) -> None:
    """What the python runtime does: config from config.ini + inverted tensors -> same logits and tokens."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    src = tiny(variant)
    family, _spec, ft_dir = convert(src, tmp_path, 2)
    from ftx_triton.runtime.python.hf_model import load_model

    data = family.hf_config_from_ini(read_ini(ft_dir / "config.ini"))
    data.pop("model_type")
    config = T5Config(**data)
    loaded = load_model(family, ft_dir, device="cpu", data_type="fp32")  # every weight from the FT files
    rebuilt = loaded.model
    original = T5ForConditionalGeneration.from_pretrained(src).eval()
    tied = VARIANTS[variant].get("tie_word_embeddings", True)
    assert data["tie_word_embeddings"] is tied  # transformers 5's T5Config reports True either way
    assert (rebuilt.lm_head.weight.data_ptr() == rebuilt.shared.weight.data_ptr()) is tied
    torch.testing.assert_close(rebuilt.lm_head.weight, original.lm_head.weight, rtol=0, atol=0)
    assert config.feed_forward_proj == original.config.feed_forward_proj
    assert config.num_decoder_layers == original.config.num_decoder_layers
    ids = torch.tensor([[5, 17, 42, 99, 1], [7, 7, 3, 1, 0]])
    mask = (ids != 0) | (torch.arange(5) < 4)
    with torch.no_grad():
        a = original(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :3]).logits
        b = rebuilt(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :3]).logits
        torch.testing.assert_close(b, a, rtol=0, atol=0)
        # transformers sizes the decoder's KV cache by num_layers (the encoder's): more decoder blocks
        # than encoder blocks fail with the cache on, in the original model too
        cache = config.num_decoder_layers <= config.num_layers
        gen_a = original.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, use_cache=cache)
        gen_b = rebuilt.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, use_cache=cache)
    assert torch.equal(gen_a, gen_b)


def test_t5_bf16_weights(tiny, tmp_path: Path) -> None:
    """Upstream has no bf16 output; ours writes bf16 files and says so in both sections."""
    src = tiny("gated-untied-3enc-1dec")
    family, spec, ft_dir = convert(src, tmp_path, 2, "bf16")
    ini = read_ini(ft_dir / "config.ini")
    assert ini["encoder"]["weight_data_type"] == ini["decoder"]["weight_data_type"] == "bf16"
    d = spec.dims
    assert (ft_dir / "lm_head.weight.bin").stat().st_size == d["V"] * d["H"] * 2
    reader = open_checkpoint(src)
    rebuilt = dict(invert_checkpoint(family, ft_dir))
    for name in reader.names():
        if name in ALIASES:
            continue
        want = reader.read(name).astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(rebuilt[name], want, err_msg=name)


# -- tensor parallelism -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "tp"),
    [
        ("relu-tied", 2),
        ("relu-tied", 4),
        ("gated-untied-3enc-1dec", 2),
        ("gated-untied-3enc-1dec", 4),
        ("relu-tied-1enc-3dec", 2),
    ],
)
def test_t5_tp_files_join_back_to_tp1(tiny, tmp_path: Path, variant: str, tp: int) -> None:
    src = tiny(variant)
    family, spec, one = convert(src, tmp_path, 1)
    _, _, many = convert(src, tmp_path, tp)
    dtype = np.dtype(np.float32)
    layout = ft_layout(family, spec)
    assert {p.name for p in one.glob("*.bin")} == {
        f"{dst}.bin" if split is None else f"{dst}.0.bin" for dst, (_, split) in layout.items()
    }
    for dst, (shape, split) in layout.items():
        if split is None:
            assert (many / f"{dst}.bin").read_bytes() == (one / f"{dst}.bin").read_bytes(), dst
            continue
        whole = read_tensor(one / f"{dst}.0.bin", dtype, shape)
        part_shape = list(shape)
        part_shape[split] //= tp
        parts = [read_tensor(many / f"{dst}.{r}.bin", dtype, tuple(part_shape)) for r in range(tp)]
        np.testing.assert_array_equal(np.concatenate(parts, axis=split), whole, err_msg=dst)


def test_t5_layouts_follow_ft_loader(tiny, tmp_path: Path) -> None:
    """Spot checks of FasterTransformer's T5 layout: fused decoder qkv [H, 3, A/tp]; bias [N/tp, buckets]; N*D != H."""
    src = tiny("gated-untied-3enc-1dec")  # H 48, N 4, D 8 (A 32), I 96
    family, spec, ft_dir = convert(src, tmp_path, 2)
    tensors = load_file(src / "model.safetensors")
    f32 = np.dtype(np.float32)
    qkv = read_tensor(ft_dir / "decoder.block.0.layer.0.SelfAttention.qkv.weight.1.bin", f32, (48, 3, 16))
    for i, part in enumerate("qkv"):
        hf = tensors[f"decoder.block.0.layer.0.SelfAttention.{part}.weight"]  # [A, H]
        np.testing.assert_array_equal(qkv[:, i, :], hf.T[:, 16:])
    bias = read_tensor(
        ft_dir / "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight.1.bin", f32, (2, 32)
    )
    np.testing.assert_array_equal(
        bias, tensors["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].T[2:]
    )
    wi2 = read_tensor(ft_dir / "encoder.block.2.layer.1.DenseReluDense.wi2.weight.0.bin", f32, (48, 48))
    np.testing.assert_array_equal(wi2, tensors["encoder.block.2.layer.1.DenseReluDense.wi_1.weight"].T[:, :48])
    o = read_tensor(ft_dir / "decoder.block.0.layer.1.EncDecAttention.o.weight.0.bin", f32, (16, 48))
    np.testing.assert_array_equal(o, tensors["decoder.block.0.layer.1.EncDecAttention.o.weight"].T[:16])
    assert not (ft_dir / "decoder.block.1.layer.0.layer_norm.weight.bin").exists()  # one decoder block
    assert not list(ft_dir.glob("*.block.[1-9].*relative_attention_bias*"))


# -- config.ini, spec, presets, GEMM -----------------------------------------------------------


def test_t5_config_ini_for_unequal_stacks(tiny, tmp_path: Path) -> None:
    src = tiny("gated-untied-3enc-1dec")
    _, _, ft_dir = convert(src, tmp_path, 1, "fp16")
    text = (ft_dir / "config.ini").read_text()
    assert "#" not in text and " ;" not in text  # FT's INI reader: no '#' comments, ';' after space is one
    ini = read_ini(ft_dir / "config.ini")
    enc, dec, structure = ini["encoder"], ini["decoder"], ini["structure"]
    assert (enc["num_layers"], dec["num_layers"]) == ("3", "1")
    assert enc["num_decoder_layers"] == dec["num_decoder_layers"] == "1"
    for section in (enc, dec):
        assert (section["d_model"], section["d_kv"], section["num_heads"], section["d_ff"]) == ("48", "8", "4", "96")
        assert section["relative_attention_num_buckets_or_max_pos_seq_len"] == "32"
        assert section["feed_forward_proj"] == "gated-gelu"
        assert section["weight_data_type"] == "fp16"
    assert enc["_name_or_path"] == src.name
    assert (dec["decoder_start_token_id"], dec["eos_token_id"], dec["tie_word_embeddings"]) == ("0", "1", "false")
    assert structure == {"t5_with_bias": "false", "use_gated_activation": "true", "position_embedding_type": "relative"}


def test_t5_presets_plan_offline() -> None:
    family = T5()
    t5 = family.spec(family.presets["t5"].hf_config)
    assert t5.dims == {"H": 1024, "N": 32, "D": 128, "A": 4096, "I": 16384, "V": 32128, "B": 32}
    assert t5.layers == {"e": 24, "d": 24}
    assert (t5.start_id, t5.end_id, t5.pad_id) == (0, 1, 0)
    assert t5.extra["gated"] is False and t5.extra["tie_word_embeddings"] is True
    flan = family.spec(family.presets["flan-t5-xl"].hf_config)
    assert flan.dims == {"H": 2048, "N": 32, "D": 64, "A": 2048, "I": 5120, "V": 32128, "B": 32}
    assert flan.extra["gated"] is True and flan.extra["tie_word_embeddings"] is False
    assert family.tensor_map(flan) is not family.tensor_map(t5)


def test_t5_gemm_args_follow_t5_gemm_order() -> None:
    family = T5()
    spec = family.spec(family.presets["t5"].hf_config)
    # t5-3b fp16 tp 1 (without the optional is_append)
    args = family.gemm_args(spec, batch=8, beam=4, max_input_len=32, data_type="fp16", tp=1)
    assert args == "8 4 32 1024 32 128 16384 1024 32 128 16384 32128 1 1".split()
    assert family.gemm_tool == "t5_gemm"


def test_t5_is_a_registered_plugin(plugin_host, golden: Path) -> None:
    family = plugin_host.family("t5")
    assert isinstance(family, T5)
    assert (family.triton_model_type, family.triton_io, family.tokenizer_kind) == (
        "T5",
        "encoder-decoder",
        "sentencepiece",
    )
    assert {"t5", "flan-t5-xl"} <= set(plugin_host.presets())
    found, _config = plugin_host.family_for_source(golden / "t5-v1_0-tied" / "hf")
    assert found.name == "t5"


def test_t5_fingerprint_covers_every_table() -> None:
    from ftx_t5 import family as module

    before = T5().fingerprint()
    original = module.TABLES["gated-separate"]
    try:
        module.TABLES["gated-separate"] = module.TABLES["plain-tied"]
        assert T5().fingerprint() != before
    finally:
        module.TABLES["gated-separate"] = original


# -- bad input ----------------------------------------------------------------------------------


def copy_checkpoint(src: Path, dest: Path, edit=None, config_edit=None) -> Path:
    shutil.copytree(src, dest)
    if edit:
        tensors = load_file(dest / "model.safetensors")
        edit(tensors)
        save_file(tensors, dest / "model.safetensors", metadata={"format": "pt"})
    if config_edit:
        config = json.loads((dest / "config.json").read_text())
        config_edit(config)
        (dest / "config.json").write_text(json.dumps(config))
    return dest


def test_heads_not_divisible_by_tp_fails_before_any_write(tmp_path: Path, ftx_cli) -> None:
    from ftx_t5.tiny import tiny_t5

    src = tiny_t5(tmp_path / "hf", d_model=48, d_kv=16, num_heads=3, d_ff=64)
    with pytest.raises(ConfigError, match=r"head count = 3 is not divisible by --tp 2"):
        convert(src, tmp_path / "out", tp=2)
    assert not (tmp_path / "out").exists()
    result = ftx_cli("convert", str(src), "--tp", "2", "-o", str(tmp_path / "cli"))
    assert result.exit_code == 1 and result.exception is None
    assert "head count = 3 is not divisible by --tp 2" in result.stderr and "hint:" in result.stderr
    assert not (tmp_path / "cli").exists()


def test_inner_size_not_divisible_by_tp_fails(tmp_path: Path) -> None:
    from ftx_t5.tiny import tiny_t5

    src = tiny_t5(tmp_path / "hf", d_ff=66)
    with pytest.raises(ConfigError, match=r"inner \(FFN\) size = 66 is not divisible by --tp 4"):
        convert(src, tmp_path / "out", tp=4)
    assert not (tmp_path / "out").exists()


def test_missing_tensor_is_named(golden: Path, tmp_path: Path, ftx_cli) -> None:
    name = "decoder.block.1.layer.1.EncDecAttention.k.weight"
    src = copy_checkpoint(golden / "t5-v1_0-tied" / "hf", tmp_path / "ckpt", lambda t: t.pop(name))
    with pytest.raises(MappingError, match=name.replace(".", r"\.")):
        convert(src, tmp_path / "out", tp=1)
    assert not (tmp_path / "out").exists()
    result = ftx_cli("convert", str(src), "-o", str(tmp_path / "cli"))
    assert result.exit_code == 1 and result.exception is None
    assert "1 tensor(s) the family needs are missing" in result.stderr and name in result.stderr
    assert not (tmp_path / "cli" / "1-gpu").exists()


def test_untied_checkpoint_without_lm_head_is_refused(tiny, tmp_path: Path) -> None:
    """shared.weight stands in for lm_head.weight only when the embeddings are tied."""
    src = copy_checkpoint(tiny("relu-untied"), tmp_path / "ckpt", lambda t: t.pop("lm_head.weight"))
    with pytest.raises(MappingError, match=r"lm_head\.weight"):
        convert(src, tmp_path / "out", tp=1)


def test_config_saying_relu_for_gated_weights_is_refused(golden: Path, tmp_path: Path) -> None:
    src = copy_checkpoint(
        golden / "t5-v1_1-tied" / "hf",
        tmp_path / "ckpt",
        config_edit=lambda c: c.update(feed_forward_proj="relu", is_gated_act=False),
    )
    with pytest.raises(MappingError) as err:
        convert(src, tmp_path / "out", tp=1)
    assert "DenseReluDense.wi_0.weight" in str(err.value) and "DenseReluDense.wi.weight" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_activation_ft_cannot_run_is_refused() -> None:
    config = dict(T5().presets["t5"].hf_config, feed_forward_proj="gated-gelu_new")
    with pytest.raises(ConfigError, match="gated-gelu_new"):
        T5().spec(config)


def test_legacy_checkpoint_with_tied_copies_and_unused_bias(golden: Path, tmp_path: Path) -> None:
    """Old v1.0 checkpoints (t5-3b's pytorch_model.bin) also store the tied copies and a cross-attention
    bias that no model uses; they convert to the same bytes."""
    import torch

    src = golden / "t5-v1_0-tied" / "hf"
    state = {n: torch.from_numpy(a.copy()) for n, a in load_file(src / "model.safetensors").items()}
    for alias in (*ALIASES, "lm_head.weight"):
        state[alias] = state["shared.weight"].clone()
    state["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = torch.ones(32, 4)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shutil.copy(src / "config.json", legacy / "config.json")
    torch.save(state, legacy / "pytorch_model.bin")
    convert(src, tmp_path / "new", 2)
    convert(legacy, tmp_path / "old", 2)
    new, old = tmp_path / "new" / "2-gpu", tmp_path / "old" / "2-gpu"
    assert sorted(p.name for p in old.glob("*.bin")) == sorted(p.name for p in new.glob("*.bin"))
    for path in new.glob("*.bin"):
        assert (old / path.name).read_bytes() == path.read_bytes(), path.name
