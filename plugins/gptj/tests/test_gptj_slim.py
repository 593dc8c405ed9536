"""GPT-J mesh-transformer-jax "slim" checkpoints: the reader, parity with upstream, config, bad input.

Golden: ``tests/golden/gptj_slim-fp16`` (28 layers, 8 shards, d_model 16, vocab 64, fp16),
converted by upstream's ``gptj_ckpt_convert.py`` at tp1 and tp2. Other checkpoints here are
written by :func:`write_slim`, a small re-implementation of mesh-transformer-jax's layout
(``shard_<s>/<piece>.npz``, leaves in ``jax.tree_flatten`` order, cut into 16 pieces).
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import weakref
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zstandard
from ftx_gptj import slim
from ftx_gptj.family import GPTJ, GPTJ_6B_CONFIG
from ftx_gptj.slim import SlimCheckpointReader, read_slim_config
from ftx_triton.conversion.convert import convert_checkpoint
from ftx_triton.errors import CheckpointError, ConfigError
from ftx_triton.formats.ftformat import read_ini
from ftx_triton.testing.golden import GoldenRun, load_runs, mismatches
from repo_paths import GOLDEN_DIR

GOLDEN = GOLDEN_DIR / "gptj_slim-fp16"
pytestmark = pytest.mark.skipif(not GOLDEN.is_dir(), reason=f"golden data not found at {GOLDEN}")

# What the golden checkpoint really is (make_tiny_models.py SLIM); heads are not in the files.
REAL = {"layers": 28, "shards": 8, "hidden": 16, "heads": 8, "vocab": 64, "inner": 64}


def golden_run(tp: int) -> GoldenRun:
    return next(run for run in load_runs(GOLDEN) if run.tp == tp)


def golden_with_config(tmp_path: Path, config: dict | None) -> Path:
    """The golden slim checkpoint (linked, not copied) with an optional config.json beside the shards."""
    src = tmp_path / "slim"
    src.mkdir()
    for shard in (GOLDEN / "slim").iterdir():
        (src / shard.name).symlink_to(shard, target_is_directory=True)
    if config is not None:
        (src / "config.json").write_text(json.dumps(config))
    return src


def golden_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "slim"
    shutil.copytree(GOLDEN / "slim", dst)
    return dst


def convert(src: Path, out: Path, tp: int, weight_dtype: str = "fp32") -> Path:
    fam = GPTJ()
    hf_config = fam.read_hf_config(src)
    spec = fam.spec(hf_config)
    reader = fam.open_weights(src)
    try:
        result = convert_checkpoint(fam, reader, hf_config, spec, out, tp=tp, weight_dtype=weight_dtype)
    finally:
        reader.close()
    return result.directory


def assert_bins_match_golden(out_dir: Path, tp: int) -> None:
    run = golden_run(tp)
    assert mismatches(out_dir.parent, run) == []
    assert {p.name for p in out_dir.glob("*.bin")} == {k.split("/", 1)[1] for k in run.files if k.endswith(".bin")}


def loader_bytes(ini: dict, tp: int) -> dict[str, int]:
    """Bytes FasterTransformer's GPT-J loader reads per file for this config.ini."""
    s = ini["gptj"]
    H = int(s["head_num"]) * int(s["size_per_head"])
    I, V, L = int(s["inter_size"]), int(s["vocab_size"]), int(s["num_layer"])  # noqa: E741 - the tables' names
    item = {"fp32": 4, "fp16": 2, "bf16": 2}[s["weight_data_type"]]
    sizes = {
        "model.wte.bin": V * H,
        "model.final_layernorm.weight.bin": H,
        "model.final_layernorm.bias.bin": H,
        "model.lm_head.weight.bin": V * H,
        "model.lm_head.bias.bin": V,
    }
    for layer in range(L):
        p = f"model.layers.{layer}."
        sizes[p + "input_layernorm.weight.bin"] = H
        sizes[p + "input_layernorm.bias.bin"] = H
        sizes[p + "mlp.dense_4h_to_h.bias.bin"] = H
        for r in range(tp):
            sizes[p + f"attention.query_key_value.weight.{r}.bin"] = H * 3 * H // tp
            sizes[p + f"attention.dense.weight.{r}.bin"] = H // tp * H
            sizes[p + f"mlp.dense_h_to_4h.weight.{r}.bin"] = H * I // tp
            sizes[p + f"mlp.dense_h_to_4h.bias.{r}.bin"] = I // tp
            sizes[p + f"mlp.dense_4h_to_h.weight.{r}.bin"] = I // tp * H
    return {name: n * item for name, n in sizes.items()}


def ini_from_text(text: str, tmp_path: Path) -> dict:
    path = tmp_path / "golden-config.ini"
    path.write_text(text)
    return read_ini(path)


# -- a small mesh-transformer-jax slim writer ---------------------------------------------------

ROOT = "causal_transformer_shard/~/"


def write_slim(
    out: Path,
    *,
    shards: int = 4,
    layers: int = 12,
    d_model: int = 16,
    n_vocab: int = 32,
    dtype: str = "bf16",
    seed: int = 0,
    pieces: int = 16,
    per_shard: dict | None = None,
) -> dict:
    """Write a slim checkpoint; return the full (merged, jax-layout) float32 values it stores.

    ``per_shard`` maps "module/param" to a list of per-shard arrays to store instead of the
    default split of a random tensor (replicated norms default to trained shard 0 + init copies).
    """
    rng = np.random.default_rng(seed)
    S, D, V, F = shards, d_model, n_vocab, 4 * d_model
    per_shard = per_shard or {}
    params: dict[str, dict[str, list[np.ndarray]]] = {}

    def rand(*shape: int, scale: float = 0.05, offset: float = 0.0) -> np.ndarray:
        return (offset + scale * rng.standard_normal(shape)).astype(np.float32)

    def col(full: np.ndarray) -> list[np.ndarray]:
        return np.split(full, S, axis=-1)

    def row(full: np.ndarray) -> list[np.ndarray]:
        return np.split(full, S, axis=0)

    def same(full: np.ndarray) -> list[np.ndarray]:
        return [full.copy() for _ in range(S)]

    def norm() -> dict[str, list[np.ndarray]]:
        return {
            "offset": [rand(D, scale=0.1)] + [np.zeros(D, np.float32)] * (S - 1),
            "scale": [rand(D, scale=0.1, offset=1.0)] + [np.ones(D, np.float32)] * (S - 1),
        }

    params[ROOT + "embedding_shard/~/linear"] = {"w": row(rand(V, D)), "b": same(rand(D, scale=0.1))}
    for i in range(layers):
        lp = ROOT + f"layer_{i}/~/"
        for mod, split in (("linear", col), ("linear_1", col), ("linear_2", col), ("linear_3", row)):
            params[lp + mod] = {"w": split(rand(D, D))}
        params[lp + "linear_4"] = {"w": col(rand(D, F)), "b": col(rand(F, scale=0.1))}
        params[lp + "linear_5"] = {"w": row(rand(F, D)), "b": same(rand(D, scale=0.1))}
        params[lp + "replicated_layer_norm"] = norm()
    params[ROOT + "projection_shard/~/linear"] = {"w": col(rand(D, V)), "b": col(rand(V, scale=0.1))}
    params[ROOT + "projection_shard/~/replicated_layer_norm"] = norm()
    for key, arrays in per_shard.items():
        module, param = key.rsplit("/", 1)
        params[ROOT + module][param] = [np.asarray(a, np.float32) for a in arrays]

    def store(a: np.ndarray) -> np.ndarray:
        if dtype == "bf16":  # what np.savez makes of a jax bfloat16 array: opaque V2
            return a.astype(ml_dtypes.bfloat16).view(np.uint16).view(np.dtype("V2"))
        return a.astype(np.float16 if dtype == "fp16" else np.float32)

    leaves = [[store(a) for a in params[m][p]] for m in sorted(params) for p in sorted(params[m])]
    leaves.append([np.array(1000, np.int32)] * S)  # "step"
    k, r = divmod(len(leaves), pieces)
    bounds = [(i * k + min(i, r), (i + 1) * k + min(i + 1, r)) for i in range(pieces)]
    for s in range(S):
        (out / f"shard_{s}").mkdir(parents=True, exist_ok=True)
        for piece, (a, b) in enumerate(bounds):
            np.savez(out / f"shard_{s}" / f"{piece}.npz", *[leaf[s] for leaf in leaves[a:b]])

    def stored(a: np.ndarray) -> np.ndarray:
        x = store(a)
        return (x.view(ml_dtypes.bfloat16) if dtype == "bf16" else x).astype(np.float32)

    return {m + "/" + p: [stored(a) for a in arrays] for m, ps in params.items() for p, arrays in ps.items()}


def f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def expected_hf(stored: dict, shards: int, layers: int) -> dict[str, np.ndarray]:
    """Upstream's result, written out plainly from the stored per-shard values."""

    def cat(key: str, axis: int) -> np.ndarray:
        return np.concatenate(stored[key], axis=axis)

    emb = ROOT + "embedding_shard/~/linear"
    wte = f16(f16(cat(emb + "/w", 0)) + f16(stored[emb + "/b"][0] * shards))
    out = {"transformer.wte.weight": wte}
    for i in range(layers):
        lp, h = ROOT + f"layer_{i}/~/", f"transformer.h.{i}."
        out[h + "attn.q_proj.weight"] = f16(cat(lp + "linear/w", 1).T)
        out[h + "attn.v_proj.weight"] = f16(cat(lp + "linear_1/w", 1).T)
        out[h + "attn.k_proj.weight"] = f16(cat(lp + "linear_2/w", 1).T)
        out[h + "attn.out_proj.weight"] = f16(cat(lp + "linear_3/w", 0).T)
        out[h + "mlp.fc_in.weight"] = f16(cat(lp + "linear_4/w", 1).T)
        out[h + "mlp.fc_in.bias"] = f16(cat(lp + "linear_4/b", 0))
        out[h + "mlp.fc_out.weight"] = f16(cat(lp + "linear_5/w", 0).T)
        out[h + "mlp.fc_out.bias"] = f16(stored[lp + "linear_5/b"][0] * shards)
        out[h + "ln_1.weight"] = f16(stored[lp + "replicated_layer_norm/scale"][0])
        out[h + "ln_1.bias"] = f16(stored[lp + "replicated_layer_norm/offset"][0])
    proj = ROOT + "projection_shard/~/"
    out["lm_head.weight"] = f16(cat(proj + "linear/w", 1).T)
    out["lm_head.bias"] = f16(cat(proj + "linear/b", 0))
    out["transformer.ln_f.weight"] = f16(stored[proj + "replicated_layer_norm/scale"][0])
    out["transformer.ln_f.bias"] = f16(stored[proj + "replicated_layer_norm/offset"][0])
    return out


# -- parity -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2])
def test_golden_weights_are_byte_identical(tmp_path: Path, tp: int) -> None:
    # heads are not in the files: at tp2 the head count must be even, so give the real one
    src = golden_with_config(tmp_path, {"n_head": REAL["heads"]} if tp == 2 else None)
    out = convert(src, tmp_path / "out", tp)
    assert_bins_match_golden(out, tp)


@pytest.mark.parametrize("tp", [1, 2])
def test_config_ini_describes_the_checkpoint_read_not_gptj_6b(tmp_path: Path, tp: int) -> None:
    """Upstream writes GPT-J-6B's config.ini whatever it read; FT would then read the wrong sizes."""
    src = golden_with_config(tmp_path, {"n_head": REAL["heads"]} if tp == 2 else None)
    out = convert(src, tmp_path / "out", tp)
    ours = read_ini(out / "config.ini")
    s = ours["gptj"]
    assert int(s["head_num"]) * int(s["size_per_head"]) == REAL["hidden"]
    assert (int(s["num_layer"]), int(s["inter_size"]), int(s["vocab_size"])) == (
        REAL["layers"],
        REAL["inner"],
        REAL["vocab"],
    )
    assert int(s["head_num"]) == (REAL["heads"] if tp == 2 else 1)  # tp1: GPT-J-6B's head size assumed
    assert 0 < int(s["rotary_embedding"]) <= int(s["size_per_head"])
    assert (s["start_id"], s["end_id"], s["weight_data_type"]) == ("50256", "50256", "fp32")
    # every file FT loads holds exactly the bytes our config.ini makes it read ...
    actual = {p.name: p.stat().st_size for p in out.glob("*.bin")}
    assert loader_bytes(ours, tp) == actual
    # ... while upstream's hard-coded config.ini (same weight files, byte-identical) makes it read other sizes
    upstream = ini_from_text(golden_run(tp).config_ini, tmp_path)
    assert upstream["gptj"]["head_num"] == "16" and upstream["gptj"]["vocab_size"] == "50400"
    wrong = loader_bytes(upstream, tp)
    assert wrong["model.wte.bin"] == 50400 * 4096 * 4 != actual["model.wte.bin"] == 64 * 16 * 4
    assert all(wrong[name] != size for name, size in actual.items())


def test_reader_yields_hugging_face_names_in_storage_order() -> None:
    reader = SlimCheckpointReader(GOLDEN / "slim")
    names = reader.names()
    assert names[0] == "transformer.wte.weight"
    layers = [n.split(".")[2] for n in names if n.startswith("transformer.h.") and n.endswith("q_proj.weight")]
    assert layers == sorted(map(str, range(28)))  # 0, 1, 10, 11, … 19, 2, 20, … (haiku's string order)
    assert names[1:4] == [f"transformer.h.0.attn.{p}_proj.weight" for p in "qvk"]
    assert names[-4:] == ["lm_head.bias", "lm_head.weight", "transformer.ln_f.bias", "transformer.ln_f.weight"]
    assert len(names) == 1 + 10 * 28 + 4
    assert reader.shape("transformer.h.5.mlp.fc_in.weight") == (64, 16)
    assert reader.shape("lm_head.weight") == (64, 16)
    assert reader.read("transformer.h.5.mlp.fc_in.weight").dtype == np.float32
    reader.close()


def test_bf16_checkpoint_with_other_shard_and_layer_counts(tmp_path: Path) -> None:
    """bf16 (V2) leaves via ml_dtypes, 4 shards (the x8 becomes x4), 12 layers (string order 10, 11 < 2)."""
    stored = write_slim(tmp_path / "ckpt", shards=4, layers=12, dtype="bf16")
    expected = expected_hf(stored, shards=4, layers=12)
    reader = SlimCheckpointReader(tmp_path / "ckpt")
    assert (reader.dims.shards, reader.dims.layers, reader.dims.hidden, reader.dims.vocab) == (4, 12, 16, 32)
    assert set(reader.names()) == set(expected)
    for name in reader.names():
        got = reader.read(name)
        assert got.shape == reader.shape(name) == expected[name].shape, name
        np.testing.assert_array_equal(got, expected[name], err_msg=name)
    reader.close()
    # and through the table, fp16 output at tp 4 (4 heads, from a config.json beside the shards)
    (tmp_path / "ckpt" / "config.json").write_text('{"n_head": 4}')
    out = convert(tmp_path / "ckpt", tmp_path / "out", 4, "fp16")
    qkv = np.concatenate(
        [
            np.fromfile(out / f"model.layers.11.attention.query_key_value.weight.{r}.bin", np.float16).reshape(16, 3, 4)
            for r in range(4)
        ],
        axis=-1,
    )
    want = np.stack([expected[f"transformer.h.11.attn.{p}_proj.weight"] for p in "qkv"]).transpose(2, 0, 1)
    np.testing.assert_array_equal(qkv.astype(np.float32), want)
    bias = np.fromfile(out / "model.layers.3.mlp.dense_4h_to_h.bias.bin", np.float16)
    np.testing.assert_array_equal(bias.astype(np.float32), expected["transformer.h.3.mlp.fc_out.bias"])


def test_fp32_and_single_shard_checkpoints(tmp_path: Path) -> None:
    stored = write_slim(tmp_path / "ckpt", shards=1, layers=2, dtype="fp32")
    expected = expected_hf(stored, shards=1, layers=2)
    reader = SlimCheckpointReader(tmp_path / "ckpt")
    for name in reader.names():
        np.testing.assert_array_equal(reader.read(name), expected[name], err_msg=name)
    reader.close()


# -- memory -----------------------------------------------------------------------------------


class LoadTracker:
    """Counts live arrays loaded from the .npz members (weak references) and their peak."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.peak_count = self.peak_bytes = 0
        self.loads: list[tuple[int, int, str]] = []

    def wrap(self, original):
        def load(reader, shard, member):
            array = original(reader, shard, member)
            self.loads.append((shard, member.piece, member.name))
            key = id(array)
            self.live[key] = array.nbytes
            weakref.finalize(array, self.live.pop, key, None)
            self.peak_count = max(self.peak_count, len(self.live))
            self.peak_bytes = max(self.peak_bytes, sum(self.live.values()))
            return array

        return load


def test_reader_holds_one_shard_slice_at_a_time_and_reads_each_member_once(tmp_path: Path, monkeypatch) -> None:
    tracker = LoadTracker()
    monkeypatch.setattr(SlimCheckpointReader, "_load", tracker.wrap(SlimCheckpointReader._load))
    reader = SlimCheckpointReader(GOLDEN / "slim")
    layer_bytes = sum(leaf.member.nbytes for leaf in reader.leaves if leaf.name.startswith("transformer.h.0.")) * 8
    total_bytes = sum(leaf.member.nbytes for leaf in reader.leaves) * 8
    largest_member = max(leaf.member.nbytes for leaf in reader.leaves)
    reader.close()

    convert(GOLDEN / "slim", tmp_path / "out", 1)

    assert tracker.peak_count == 1  # one shard's slice of one leaf, merged into the output, then dropped
    assert tracker.peak_bytes <= largest_member
    assert tracker.peak_bytes < layer_bytes < total_bytes / 20
    # every parameter member of every shard is read exactly once, in piece order; "step" never
    assert len(tracker.loads) == len(set(tracker.loads)) == (1 + 1 + 10 * 28 + 4) * 8
    pieces = [piece for _shard, piece, _name in tracker.loads]
    assert pieces == sorted(pieces)


def test_reader_keeps_no_tensor_once_returned() -> None:
    """Nothing is cached: a tensor lives only as long as the caller keeps it (the converter streams)."""
    live: set[int] = set()
    peak = 0
    reader = SlimCheckpointReader(GOLDEN / "slim")
    for name in reader.names():
        array = reader.read(name)
        live.add(id(array))
        weakref.finalize(array, live.discard, id(array))
        peak = max(peak, len(live))
        del array
        assert not live, name
    reader.close()
    assert peak == 1


# -- un-sharding rules where upstream's value heuristic is wrong ----------------------------------


def upstream_reshard_2d(stack: np.ndarray, old_len: int) -> np.ndarray:
    """Upstream's rule for a stacked [8, n] leaf (gptj_ckpt_convert.py ``reshard``), for comparison."""
    if (stack[1:] == stack[-1]).all():
        if (stack[1:] == 0).all() or (stack[1:] == 1).all():
            return stack[0]
        return stack[0] * 8
    return stack.reshape(old_len)


def test_row_parallel_bias_of_ones_is_scaled_by_the_shard_count(tmp_path: Path) -> None:
    """Each shard adds its copy before the psum, so the model adds S copies; upstream adds one here."""
    S, D, F = 8, 16, 64
    stored = write_slim(
        tmp_path / "ckpt", shards=S, layers=2, dtype="fp16", per_shard={"layer_1/~/linear_5/b": [np.ones(D)] * S}
    )
    reader = SlimCheckpointReader(tmp_path / "ckpt")
    weight = reader.read("transformer.h.1.mlp.fc_out.weight")  # [out, in] = [D, F]
    bias = reader.read("transformer.h.1.mlp.fc_out.bias")
    reader.close()
    x = np.random.default_rng(1).standard_normal((3, F)).astype(np.float32)
    w_parts, b_parts = stored[ROOT + "layer_1/~/linear_5/w"], stored[ROOT + "layer_1/~/linear_5/b"]
    sharded = sum(x[:, s * F // S : (s + 1) * F // S] @ w_parts[s] + b_parts[s] for s in range(S))  # psum
    np.testing.assert_allclose(x @ weight.T + bias, sharded, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(bias, np.full(D, S, np.float32))
    assert (upstream_reshard_2d(np.stack(b_parts), D) == 1).all()  # upstream: off by a factor S


def test_trained_layernorm_replicas_use_shard_0_like_mesh_transformer_jax(tmp_path: Path) -> None:
    """ReplicatedLayerNorm uses all_gather(p)[0]; upstream multiplies by 8 when the other copies are equal but not 0/1."""
    S, D = 8, 16
    trained = np.linspace(0.5, 1.5, D)
    replicas = [trained] + [np.full(D, 0.9)] * (S - 1)
    write_slim(
        tmp_path / "ckpt",
        shards=S,
        layers=2,
        dtype="fp32",
        per_shard={"layer_0/~/replicated_layer_norm/scale": replicas},
    )
    reader = SlimCheckpointReader(tmp_path / "ckpt")
    np.testing.assert_array_equal(reader.read("transformer.h.0.ln_1.weight"), f16(trained))
    reader.close()
    np.testing.assert_array_equal(
        upstream_reshard_2d(np.stack(replicas).astype(np.float32), D), (trained * 8).astype(np.float32)
    )


def test_fp16_overflow_names_the_tensor(tmp_path: Path) -> None:
    big = np.full((16, 16), 1e5, np.float32)  # fine in bf16, beyond float16's 65504
    write_slim(
        tmp_path / "ckpt",
        shards=2,
        layers=3,
        dtype="bf16",
        per_shard={"layer_2/~/linear_3/w": np.split(big, 2, axis=0)},
    )
    reader = SlimCheckpointReader(tmp_path / "ckpt")
    with pytest.raises(
        CheckpointError,
        match=r"fp16 over/underflow in transformer\.h\.2\.attn\.out_proj\.weight: "
        r"256 value\(s\)",
    ) as info:
        reader.read("transformer.h.2.attn.out_proj.weight")
    assert "largest finite magnitude: 99840" in info.value.message  # 1e5 in bfloat16
    reader.close()


# -- config -----------------------------------------------------------------------------------


def test_config_from_shapes_with_the_head_size_assumption() -> None:
    config = read_slim_config(GOLDEN / "slim")
    assert (config["n_layer"], config["n_embd"], config["n_inner"], config["vocab_size"]) == (28, 16, 64, 64)
    assert (config["n_head"], config["rotary_dim"]) == (1, 16)  # 16 // 256 -> at least 1; min(64, 16)
    assert (config["bos_token_id"], config["eos_token_id"]) == (50256, 50256)
    assert GPTJ().read_hf_config(GOLDEN / "slim") == config


def test_config_json_beside_the_shards_gives_heads_rotary_and_ids(tmp_path: Path) -> None:
    src = golden_with_config(
        tmp_path,
        {"n_heads": 8, "pe_rotary_dims": 2, "layers": 28, "n_vocab": 64, "cores_per_replica": 8, "eos_token_id": 7},
    )
    config = read_slim_config(src)
    assert (config["n_head"], config["rotary_dim"], config["eos_token_id"], config["bos_token_id"]) == (8, 2, 7, 50256)
    spec = GPTJ().spec(config)
    assert (spec.dims["N"], spec.dims["D"], spec.extra["rotary_embedding"]) == (8, 2, 2)


def test_config_json_that_contradicts_the_weights_is_refused(tmp_path: Path) -> None:
    src = golden_with_config(tmp_path, {"n_head": 8, "n_layer": 27})
    with pytest.raises(CheckpointError, match="n_layer = 27 but the slim checkpoint holds 28"):
        read_slim_config(src)
    (src / "config.json").write_text(json.dumps({"n_head": 3}))
    with pytest.raises(ConfigError, match="n_head = 3 does not divide n_embd = 16"):
        read_slim_config(src)


def test_gptj_6b_head_size_assumption_gives_gptj_6b(tmp_path: Path) -> None:
    dims = slim.SlimDims(shards=8, layers=28, hidden=4096, inner=16384, vocab=50400)
    config = read_slim_config(tmp_path, dims)
    spec = GPTJ().spec(config)
    assert dict(spec.dims) == {"H": 4096, "N": 16, "D": 256, "I": 16384, "V": 50400}
    assert spec.extra["rotary_embedding"] == 64
    assert spec == GPTJ().spec(GPTJ_6B_CONFIG)  # what the gptj-slim preset plans with


def test_preset() -> None:
    preset = GPTJ.presets["gptj-slim"]
    assert preset.source == "https://the-eye.eu/public/AI/GPT-J-6B/step_383500_slim.tar.zstd"
    assert preset.sha256 is None  # not known here
    assert preset.license == "apache-2.0"
    assert preset.hf_config == {**GPTJ_6B_CONFIG, "torch_dtype": "bfloat16"}  # the slim shards are bf16


def test_claims_slim_directories(tmp_path: Path) -> None:
    fam = GPTJ()
    assert fam.claims_source(GOLDEN / "slim")
    assert not fam.claims_source(GOLDEN)
    for name, config, claimed in (
        ("a", {"n_head": 8}, True),
        ("b", GPTJ_6B_CONFIG, True),
        ("c", {"model_type": "t5"}, False),
    ):
        (tmp_path / name).mkdir()
        assert fam.claims_source(golden_with_config(tmp_path / name, config)) is claimed
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "gptj"}')
    assert not fam.claims_source(hf)

    from ftx_triton.plugins import load_host

    family, config = load_host().family_for_source(GOLDEN / "slim")
    assert family.name == "gptj" and config["n_layer"] == 28


# -- bad input --------------------------------------------------------------------------------


def test_missing_shard_folder(tmp_path: Path) -> None:
    src = golden_copy(tmp_path)
    shutil.rmtree(src / "shard_3")
    with pytest.raises(CheckpointError, match=r"shard_3/ missing") as info:
        GPTJ().open_weights(src)
    assert "fetch the archive again" in info.value.hint


def test_missing_last_shard_folder(tmp_path: Path) -> None:
    src = golden_copy(tmp_path)
    shutil.rmtree(src / "shard_7")
    with pytest.raises(CheckpointError, match=r"7 shard\(s\) hold 2 of 16 output columns") as info:
        GPTJ().read_hf_config(src)
    assert "shard folders are missing" in info.value.hint


@pytest.mark.parametrize("piece", ["shard_2/7.npz", "shard_0/15.npz", "shard_5/0.npz"])
def test_missing_piece(tmp_path: Path, piece: str) -> None:
    src = golden_copy(tmp_path)
    (src / piece).unlink()
    with pytest.raises(CheckpointError, match=f"{piece} missing"):
        SlimCheckpointReader(src)


def test_last_piece_missing_from_every_shard(tmp_path: Path) -> None:
    src = golden_copy(tmp_path)
    for s in range(8):
        (src / f"shard_{s}" / "15.npz").unlink()
    with pytest.raises(CheckpointError, match=r"shard_0/15\.npz, shard_1/15\.npz"):
        SlimCheckpointReader(src)


def test_corrupt_piece(tmp_path: Path) -> None:
    src = golden_copy(tmp_path)
    path = src / "shard_4" / "9.npz"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"shard_4/9\.npz is not a readable \.npz"):
        SlimCheckpointReader(src)


def test_shards_that_disagree(tmp_path: Path) -> None:
    src = golden_copy(tmp_path)
    shutil.copy(src / "shard_6" / "3.npz", src / "shard_6" / "2.npz")
    with pytest.raises(CheckpointError, match=r"shard_6/2\.npz does not match shard_0/2\.npz"):
        SlimCheckpointReader(src)


def test_not_a_slim_gptj_layout(tmp_path: Path) -> None:
    for s in range(2):
        (tmp_path / f"shard_{s}").mkdir()
        for piece in range(16):
            np.savez(tmp_path / f"shard_{s}" / f"{piece}.npz", np.zeros((3, 3), np.float16), np.zeros(3, np.float16))
    with pytest.raises(CheckpointError, match="holds 32 parameter leaves"):
        SlimCheckpointReader(tmp_path)


# -- the archive the GPT-J guide downloads ----------------------------------------------------


def write_tar_zstd(path: Path, directory: Path, arcname: str) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(directory, arcname=arcname)
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


def test_cli_converts_the_tar_zstd_archive(tmp_path: Path, ftx_cli) -> None:
    """The fetch stage extracts the archive (ftx_triton.fetching.archive.safe_extract); the family sees a directory."""
    archive = write_tar_zstd(tmp_path / "step_1000_slim.tar.zstd", GOLDEN / "slim", "step_1000")
    out = tmp_path / "out"
    result = ftx_cli("convert", str(archive), "--family", "gptj", "--tp", "1", "-o", str(out))
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert_bins_match_golden(out / "1-gpu", 1)
    assert read_ini(out / "1-gpu" / "config.ini")["gptj"]["vocab_size"] == "64"


def test_cli_detects_a_slim_directory_without_family(tmp_path: Path, ftx_cli) -> None:
    out = tmp_path / "out"
    result = ftx_cli("convert", str(GOLDEN / "slim"), "--tp", "1", "-o", str(out))
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert_bins_match_golden(out / "1-gpu", 1)


def test_cli_reports_a_missing_piece(tmp_path: Path, ftx_cli) -> None:
    src = golden_copy(tmp_path)
    (src / "shard_1" / "4.npz").unlink()
    result = ftx_cli("convert", str(src), "--family", "gptj", "-o", str(tmp_path / "out"))
    assert result.exit_code == 1 and result.exception is None
    assert "shard_1/4.npz missing" in result.stderr
    assert "hint:" in result.stderr and "Traceback" not in result.stderr


def test_linked_shard_folders_of_another_checkpoint_are_converted_anew(tmp_path: Path, ftx_cli) -> None:
    """Two slim checkpoints with the same layout and config.json, fp16 and bf16, each kept as shard folders
    linked in from another disk: the second is its own artifact, converted from its own bytes (its key once
    left out everything behind a folder link, and the first one's conversion was served)."""
    outputs = []
    for dtype in ("fp16", "bf16"):
        disk = tmp_path / "disk2" / dtype
        write_slim(disk, shards=2, layers=2, dtype=dtype)
        src = tmp_path / dtype / "step_1"
        src.mkdir(parents=True)
        (src / "config.json").write_text(json.dumps({"n_head": 4}))
        for shard in disk.iterdir():
            (src / shard.name).symlink_to(shard, target_is_directory=True)
        result = ftx_cli("convert", str(src), "--tp", "1", "-o", str(tmp_path / f"out-{dtype}"))
        assert result.exit_code == 0, (result.stderr, result.exception)
        outputs.append(result.stderr)
    assert "convert   done" in outputs[1] and "cached" not in outputs[1]
    wte = [(tmp_path / f"out-{dtype}" / "1-gpu" / "model.wte.bin").read_bytes() for dtype in ("fp16", "bf16")]
    assert wte[0] != wte[1]
