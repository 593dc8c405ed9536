"""mesh-transformer-jax "slim" GPT-J checkpoints (``step_383500/shard_<s>/<piece>.npz``), read lazily.

Layout: one ``shard_<s>/`` folder per model-parallel
shard; in each, ``0.npz … 15.npz`` hold the leaves of the parameter tree in ``jax.tree_flatten``
order (haiku module path, then parameter name, sorted as strings), cut into consecutive runs;
members ``arr_0.npy, arr_1.npy, …`` in order. bfloat16 leaves are stored as the opaque 2-byte
``V2`` dtype. Shard ``s`` holds its slice of each tensor-parallel parameter, or its own copy of a
replicated one.

:class:`SlimCheckpointReader` yields the tensors under today's Hugging Face GPT-J names, so the
GPT-J table converts them unchanged. It reproduces what upstream's
``examples/pytorch/gptj/utils/gptj_ckpt_convert.py`` computes:

* leaf order: ``wte`` (bias, kernel); per layer in *string* order of the layer id
  (``0, 1, 10, 11, …, 2, 20, …``) q, **v**, k (haiku ``linear``, ``linear_1``, ``linear_2``),
  out, ``c_fc`` bias/kernel, ``c_proj`` bias/kernel, ``ln_1`` offset/scale; then the LM head
  (bias, kernel) and ``ln_f`` (offset, scale). Trailing scalar leaves (``step``) are ignored.
* un-sharding: column-parallel kernels are concatenated along their output axis,
  row-parallel kernels (``out_proj``, ``c_proj``, the one-hot ``wte``) along their input axis,
  column-parallel biases (``c_fc``, LM head) concatenated; the replicated layernorms give
  shard 0's copy (mesh-transformer-jax's ``ReplicatedLayerNorm`` uses ``all_gather(p)[0]``; the
  other shards keep their init values 1 / 0); the row-parallel biases (``c_proj``, ``wte``),
  which every shard adds before the ``psum``, give shard 0's copy **times the shard count**.
* kernels are transposed to ``[out, in]``; every value goes bf16/fp16 -> fp32 -> **fp16** (an
  Inf/NaN there is upstream's ``fp16 over/underflow`` abort; here a :class:`CheckpointError`
  naming the tensor) -> fp32, the dtype :meth:`SlimCheckpointReader.read` returns.
* ``transformer.wte.weight = kernel + bias`` computed in fp16 (the jax embedding is a one-hot
  linear layer with a bias, folded into every row), as upstream does in ``torch.half``.

Differences from upstream, on purpose:

* The shard count is the number of ``shard_<s>`` folders, not a hard-coded 8 (upstream reads
  8 folders and multiplies the row-parallel biases by 8 whatever the checkpoint).
* Upstream classifies 2-D stacks by value (rows 1.. equal and all 0 or all 1 -> layernorm, take
  row 0; rows 1.. equal otherwise -> bias x 8; rows different -> concatenate). The leaf list says
  what each leaf is, so here the rule is chosen by name. Both agree on every real checkpoint;
  they differ only where upstream's guess is wrong: a trained layernorm whose replicas are equal
  but not 0/1 (upstream multiplies it by 8), a row-parallel bias of all ones (upstream does not
  scale it), a column-parallel bias with equal or zero slices (upstream scales it or fails).
  If the copies of a row-parallel bias differ (upstream would fail or scale row 0), their sum
  is used: that is what the sharded forward pass adds.
* The fp16 range check also covers the folded embedding (upstream checks before the fold).
* Missing or mismatched shards/pieces are refused with the file named (upstream silently
  zips to the shortest list or fails on a missing file).

Memory: shapes come from the ``.npy`` headers inside the zips; ``read`` loads one member of
one shard at a time into the merged fp32 buffer, so the reader holds one tensor (plus one
shard's slice of it), never a whole piece or layer.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import structlog
from ftx_triton.plugin_api import CheckpointError, ConfigError

if TYPE_CHECKING:  # numpy is imported where a slim checkpoint is read: the plugin loads without it
    import numpy as np

log = structlog.get_logger(__name__)

PIECES = 16
"""Pieces mesh-transformer-jax writes per shard (``checkpoint.write_ckpt``)."""

DEFAULT_HEAD_SIZE = 256
"""GPT-J-6B's head size; the head count cannot be read from the weights (see :func:`read_slim_config`)."""

DEFAULT_TOKEN_ID = 50256
"""GPT-J's ``<|endoftext|>``: bos and eos of the GPT-2 tokenizer the slim checkpoints were trained with."""

_SHARD_RE = re.compile(r"shard_(\d+)\Z")
_PIECE_RE = re.compile(r"(\d+)\.npz\Z")
_STORED_DTYPES = ("V2", "float16", "float32")
"""bfloat16 (opaque ``V2``, as np.savez writes jax's bfloat16), float16, float32 (numpy dtypes compare equal to
their names)."""
_INCOMPLETE_HINT = (
    "the checkpoint is incomplete (an interrupted download or extraction?): fetch the "
    "archive again; every shard_<s>/ folder must hold the same numbered .npz pieces"
)

# un-shard rules, by leaf kind
COL = "col"  # column-parallel kernel [in, out/S]: concatenate along the output axis
ROW = "row"  # row-parallel kernel [in/S, out]: concatenate along the input axis
CAT = "cat"  # column-parallel bias [out/S]: concatenate
SUM = "sum"  # row-parallel bias, a copy per shard, added on every shard before the psum: x S
FIRST = "first"  # replicated layernorm: shard 0's copy


def is_slim_dir(path: Path) -> bool:
    """True for a directory laid out like a slim checkpoint (``shard_0/0.npz``)."""
    return Path(path).is_dir() and (Path(path) / "shard_0" / "0.npz").is_file()


@dataclass(frozen=True)
class Member:
    """One ``.npy`` member of a piece: where it is and what its header says."""

    piece: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        import numpy as np

        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class Leaf:
    """One expected leaf: its upstream (old Hugging Face) name, un-shard rule and per-shard shape."""

    name: str
    kind: str
    shard_shape: tuple[int, ...]
    member: Member


@dataclass(frozen=True)
class SlimDims:
    """Sizes read from the leaf shapes."""

    shards: int
    layers: int
    hidden: int
    inner: int
    vocab: int


# (upstream leaf name suffix, Hugging Face name suffix, kind) for one layer, in storage order
_LAYER_LEAVES: tuple[tuple[str, str, str], ...] = (
    ("attn.attention.q_proj.weight", "attn.q_proj.weight", COL),  # haiku linear
    ("attn.attention.v_proj.weight", "attn.v_proj.weight", COL),  # linear_1
    ("attn.attention.k_proj.weight", "attn.k_proj.weight", COL),  # linear_2
    ("attn.attention.out_proj.weight", "attn.out_proj.weight", ROW),  # linear_3
    ("mlp.c_fc.bias", "mlp.fc_in.bias", CAT),  # linear_4
    ("mlp.c_fc.weight", "mlp.fc_in.weight", COL),
    ("mlp.c_proj.bias", "mlp.fc_out.bias", SUM),  # linear_5
    ("mlp.c_proj.weight", "mlp.fc_out.weight", ROW),
    ("ln_1.bias", "ln_1.bias", FIRST),  # replicated_layer_norm offset
    ("ln_1.weight", "ln_1.weight", FIRST),  # scale
)
_HEAD_LEAVES: tuple[tuple[str, str, str], ...] = (
    ("lm_head.bias", "lm_head.bias", CAT),
    ("lm_head.weight", "lm_head.weight", COL),
    ("transformer.ln_f.bias", "transformer.ln_f.bias", FIRST),
    ("transformer.ln_f.weight", "transformer.ln_f.weight", FIRST),
)
_FIXED_LEAVES = 2 + len(_HEAD_LEAVES)


def layer_order(layers: int) -> list[str]:
    """Layer ids in the order haiku stores ``layer_<i>`` modules: sorted as strings."""
    return sorted(map(str, range(layers)))


def _read_header(fh: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    import numpy as np

    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:  # (3, 0): utf-8 field names, only for structured dtypes
        shape, _fortran, dtype = np.lib.format._read_array_header(fh, version)  # type: ignore[attr-defined]  # numpy's only reader of v3
    return tuple(int(n) for n in shape), np.dtype(dtype)


def _scan_piece(path: Path, piece: int) -> list[Member]:
    """The members of one ``.npz`` in file order (``np.load`` order), from headers only."""
    members = []
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with zf.open(info) as fh:
                    shape, dtype = _read_header(fh)
                members.append(Member(piece, info.filename, shape, dtype))
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise CheckpointError(f"{path} is not a readable .npz file ({exc})", hint=_INCOMPLETE_HINT) from exc
    return members


def _numbered(directory: Path, pattern: re.Pattern[str], want_dir: bool) -> dict[int, Path]:
    found = {}
    for entry in directory.iterdir():
        match = pattern.match(entry.name)
        if match and (entry.is_dir() if want_dir else entry.is_file()):
            found[int(match.group(1))] = entry
    return found


def _missing_names(wanted: range, have: Mapping[int, Any], fmt: str) -> list[str]:
    return [fmt.format(i) for i in wanted if i not in have]


def _listing(names: list[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (f", … ({len(names) - limit} more)" if len(names) > limit else "")


class SlimCheckpointReader:
    """A :class:`ftx_triton.formats.checkpoint.TensorReader` over a slim checkpoint directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._shard_dirs = self._find_shards()
        self.shards = len(self._shard_dirs)
        self._piece_count = self._find_pieces()
        members = self._scan_members()
        self.leaves, self.dims = _plan_leaves(members, self.shards, self.path)
        self._outputs = _outputs(self.leaves, self.dims)
        self._open: dict[tuple[int, int], zipfile.ZipFile] = {}
        log.debug(
            "slim.opened",
            path=str(self.path),
            shards=self.shards,
            layers=self.dims.layers,
            hidden=self.dims.hidden,
            vocab=self.dims.vocab,
        )

    # -- layout checks --------------------------------------------------------------------

    def _find_shards(self) -> list[Path]:
        if not self.path.is_dir():
            raise CheckpointError(
                f"{self.path} is not a directory", hint="point at the folder holding shard_0/ … shard_7/"
            )
        shards = _numbered(self.path, _SHARD_RE, want_dir=True)
        if not shards:
            raise CheckpointError(
                f"{self.path} holds no shard_<n>/ folders: not a mesh-transformer-jax slim checkpoint",
                hint="point at the folder holding shard_0/ … shard_7/ (e.g. step_383500/)",
            )
        count = max(shards) + 1
        missing = _missing_names(range(count), shards, "shard_{}/")
        if missing:
            raise CheckpointError(
                f"slim checkpoint {self.path} is incomplete: {_listing(missing)} missing "
                f"(found {len(shards)} of shard_0/ … shard_{count - 1}/)",
                hint=_INCOMPLETE_HINT,
            )
        return [shards[i] for i in range(count)]

    def _find_pieces(self) -> int:
        per_shard = [_numbered(d, _PIECE_RE, want_dir=False) for d in self._shard_dirs]
        count = max((max(p) + 1 for p in per_shard if p), default=0)
        count = max(count, PIECES) if count else 0
        missing = [
            name
            for s, pieces in enumerate(per_shard)
            for name in _missing_names(range(count), pieces, f"shard_{s}/{{}}.npz")
        ]
        if not count or missing:
            missing = missing or [f"shard_{s}/0.npz" for s in range(self.shards)]
            raise CheckpointError(
                f"slim checkpoint {self.path} is incomplete: {_listing(missing)} missing "
                f"(each shard_<s>/ needs 0.npz … {max(count, PIECES) - 1}.npz)",
                hint=_INCOMPLETE_HINT,
            )
        return count

    def _scan_members(self) -> list[Member]:
        """Shard 0's members in storage order, after checking every shard has the same structure."""
        reference: list[Member] = []
        for piece in range(self._piece_count):
            first = _scan_piece(self._shard_dirs[0] / f"{piece}.npz", piece)
            for s in range(1, self.shards):
                other = _scan_piece(self._shard_dirs[s] / f"{piece}.npz", piece)
                if [(m.name, m.shape, m.dtype) for m in other] != [(m.name, m.shape, m.dtype) for m in first]:
                    raise CheckpointError(
                        f"shard_{s}/{piece}.npz does not match shard_0/{piece}.npz: "
                        f"{_describe(other)} vs {_describe(first)}",
                        hint="every shard must hold the same leaves; " + _INCOMPLETE_HINT,
                    )
            reference.extend(first)
        return reference

    # -- TensorReader ---------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self._outputs)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._output(name).shape

    def nbytes(self, name: str) -> int:
        return sum(leaf.member.nbytes for leaf in self._output(name).leaves) * self.shards

    def read(self, name: str) -> np.ndarray:
        """One tensor, float32 holding fp16-rounded values; kernels are a transposed view ``[out, in]``."""
        out = self._output(name)
        if name == "transformer.wte.weight":
            return self._embedding(out)
        (leaf,) = out.leaves
        merged = self._merge(leaf)
        _round_through_fp16(merged, name)
        return merged.T

    def close(self) -> None:
        for zf in self._open.values():
            zf.close()
        self._open.clear()

    # -- reading --------------------------------------------------------------------------

    def _output(self, name: str) -> _Output:
        try:
            return self._outputs[name]
        except KeyError:
            raise KeyError(f"{name} is not a tensor of slim checkpoint {self.path}") from None

    def _embedding(self, out: _Output) -> np.ndarray:
        """``kernel + bias`` in fp16, as upstream's ``torch.half`` addition: fp32 sum of fp16 values, rounded."""
        kernel_leaf, bias_leaf = out.leaves
        name = "transformer.wte.weight"
        kernel = self._merge(kernel_leaf)  # [V, H], the one-hot input axis is the vocabulary
        _round_through_fp16(kernel, name)
        bias = self._merge(bias_leaf)
        _round_through_fp16(bias, name + " (its folded bias)")
        kernel += bias
        _round_through_fp16(kernel, name + " (after folding in its bias)")
        return kernel

    def _zip(self, shard: int, piece: int) -> zipfile.ZipFile:
        key = (shard, piece)
        zf = self._open.get(key)
        if zf is None:
            for other in [k for k in self._open if k[1] != piece]:  # storage order: done with that piece
                self._open.pop(other).close()
            zf = self._open[key] = zipfile.ZipFile(self._shard_dirs[shard] / f"{piece}.npz")
        return zf

    def _load(self, shard: int, member: Member) -> np.ndarray:
        """One shard's copy of one leaf, as stored (bf16 viewed through ml_dtypes)."""
        import ml_dtypes
        import numpy as np

        where = f"shard_{shard}/{member.piece}.npz:{member.name}"
        try:
            with self._zip(shard, member.piece).open(member.name) as fh:
                array = np.lib.format.read_array(fh, allow_pickle=False)
        except (OSError, zipfile.BadZipFile, ValueError, EOFError) as exc:
            raise CheckpointError(f"{self.path}: cannot read {where} ({exc})", hint=_INCOMPLETE_HINT) from exc
        if array.shape != member.shape or array.dtype != member.dtype:
            raise CheckpointError(f"{self.path}: {where} changed while reading", hint=_INCOMPLETE_HINT)
        if array.dtype == np.dtype("V2"):
            array = array.view(ml_dtypes.bfloat16)
        return array

    def _merge(self, leaf: Leaf) -> np.ndarray:
        """The un-sharded leaf in jax layout (kernels ``[in, out]``), float32."""
        import numpy as np

        shards, shape = self.shards, leaf.shard_shape
        if leaf.kind in (COL, ROW, CAT):
            axis = 0 if leaf.kind == ROW else len(shape) - 1
            full = list(shape)
            full[axis] *= shards
            merged = np.empty(full, dtype=np.float32)
            step = shape[axis]
            for s in range(shards):
                part = self._load(s, leaf.member)
                index = [slice(None)] * len(shape)
                index[axis] = slice(s * step, (s + 1) * step)
                merged[tuple(index)] = part
                del part
            return merged
        first = self._load(0, leaf.member).astype(np.float32)
        total = first.copy()
        replicas_equal = True
        replicas_at_init = True
        for s in range(1, shards):
            part = self._load(s, leaf.member).astype(np.float32)
            replicas_equal &= bool(np.array_equal(part, first))
            replicas_at_init &= bool((part == 0).all() or (part == 1).all())
            total += part
            del part
        if leaf.kind == FIRST:
            if not replicas_at_init:
                log.warning(
                    "slim.layernorm_replicas_trained",
                    leaf=leaf.name,
                    detail="using shard 0's copy, as mesh-transformer-jax does; upstream's "
                    "converter would have scaled or refused it",
                )
            return first
        if replicas_equal:
            return first * np.float32(shards)  # upstream: x[0:1] * 8
        log.warning(
            "slim.shard_bias_copies_differ",
            leaf=leaf.name,
            detail="using the sum of the shards' copies, which is what the sharded model adds",
        )
        return total


@dataclass(frozen=True)
class _Output:
    """A Hugging Face tensor: its shape and the leaves it is built from."""

    shape: tuple[int, ...]
    leaves: tuple[Leaf, ...]


def _describe(members: list[Member]) -> str:
    return (
        f"{len(members)} member(s) ["
        + ", ".join(f"{m.name} {list(m.shape)} {m.dtype}" for m in members[:4])
        + (", …]" if len(members) > 4 else "]")
    )


_BLOCK = 1 << 22
"""Elements rounded per step, so the fp16 temporaries stay small whatever the tensor size."""


def _round_through_fp16(x: np.ndarray, name: str) -> None:
    """Upstream's ``torch.half`` step, in place on a C-contiguous float32 array, with its Inf/NaN check."""
    import numpy as np

    if not x.flags.c_contiguous:
        raise ValueError("_round_through_fp16 works in place on a C-contiguous array")
    flat = x.reshape(-1)  # a view
    for start in range(0, flat.size, _BLOCK):
        block = flat[start : start + _BLOCK]
        with np.errstate(over="ignore", invalid="ignore"):
            half = block.astype(np.float16)
        if not np.isfinite(half).all():
            with np.errstate(over="ignore", invalid="ignore"):
                bad = int(flat.size - np.count_nonzero(np.isfinite(flat.astype(np.float16))))
            finite = flat[np.isfinite(flat)]
            largest = f"{float(np.abs(finite).max()):g}" if finite.size else "none"
            raise CheckpointError(
                f"fp16 over/underflow in {name}: {bad} value(s) are NaN/Inf or beyond float16's range "
                f"(largest finite magnitude: {largest}; float16 stops at 65504)",
                hint="upstream's slim converter passes every weight through float16 and aborts here too; "
                "this checkpoint holds values float16 cannot represent",
            )
        block[...] = half


def _plan_leaves(members: list[Member], shards: int, path: Path) -> tuple[list[Leaf], SlimDims]:
    """Match shard 0's members to the expected leaf list; sizes come from their shapes."""
    params = list(members)
    while params and params[-1].shape == ():  # trailing scalars: the "step" counter
        params.pop()
    for m in params:
        if m.dtype not in _STORED_DTYPES:
            raise CheckpointError(
                f"{path}: shard_0/{m.piece}.npz:{m.name} has dtype {m.dtype}",
                hint="slim checkpoints store bfloat16 (V2), float16 or float32 weights",
            )
    n = len(params)
    if n < _FIXED_LEAVES + len(_LAYER_LEAVES) or (n - _FIXED_LEAVES) % len(_LAYER_LEAVES):
        raise CheckpointError(
            f"{path} holds {n} parameter leaves; a slim GPT-J checkpoint holds "
            f"{_FIXED_LEAVES} + {len(_LAYER_LEAVES)} per layer",
            hint="this is not a slimmed mesh-transformer-jax GPT-J checkpoint (a full one with optimizer "
            "state must be slimmed first with slim_model.py), or trailing pieces are missing",
        )
    layers = (n - _FIXED_LEAVES) // len(_LAYER_LEAVES)
    try:
        (hidden,) = params[0].shape
        vocab_part = params[1].shape[0]
        hidden_part = params[2].shape[1]
        (inner_part,) = params[6].shape
    except (ValueError, IndexError):
        raise CheckpointError(
            f"{path}: the first leaves do not have the shapes of a GPT-J embedding and layer ({_describe(params[:7])})",
            hint="this is not a mesh-transformer-jax slim GPT-J checkpoint",
        ) from None
    if hidden_part * shards != hidden:
        raise CheckpointError(
            f"{path}: the attention projections' {shards} shard(s) hold {hidden_part} of {hidden} output "
            f"columns each, which adds up to {hidden_part * shards}",
            hint=f"shard folders are missing (found shard_0/ … shard_{shards - 1}/; GPT-J-6B has 8); "
            + _INCOMPLETE_HINT,
        )
    H, Hs, Vs, Is = hidden, hidden_part, vocab_part, inner_part
    expected: list[tuple[str, str, tuple[int, ...]]] = [
        ("transformer.wte.bias", SUM, (H,)),
        ("transformer.wte.weight", ROW, (Vs, H)),
    ]
    per_layer_shapes = ((H, Hs), (H, Hs), (H, Hs), (Hs, H), (Is,), (H, Is), (H,), (Is, H), (H,), (H,))
    for layer in layer_order(layers):
        for (old, _new, kind), shape in zip(_LAYER_LEAVES, per_layer_shapes, strict=True):
            expected.append((f"transformer.h.{layer}.{old}", kind, shape))
    for (old, _new, kind), shape in zip(_HEAD_LEAVES, ((Vs,), (H, Vs), (H,), (H,)), strict=True):
        expected.append((old, kind, shape))
    leaves = []
    for (name, kind, shape), member in zip(expected, params, strict=True):
        if member.shape != shape:
            raise CheckpointError(
                f"{path}: shard_0/{member.piece}.npz:{member.name} has shape {list(member.shape)} where the "
                f"slim GPT-J layout puts {name} with per-shard shape {list(shape)}",
                hint="this is not a mesh-transformer-jax slim GPT-J checkpoint, or its pieces are mixed up",
            )
        leaves.append(Leaf(name, kind, shape, member))
    dims = SlimDims(shards=shards, layers=layers, hidden=H, inner=Is * shards, vocab=Vs * shards)
    return leaves, dims


def _outputs(leaves: list[Leaf], dims: SlimDims) -> dict[str, _Output]:
    """Hugging Face name -> (shape, leaves), in storage order."""
    H, I, V = dims.hidden, dims.inner, dims.vocab  # noqa: E741 - the tables' dimension names
    by_name = {leaf.name: leaf for leaf in leaves}
    outputs: dict[str, _Output] = {}
    shapes = {
        "attn.q_proj.weight": (H, H),
        "attn.v_proj.weight": (H, H),
        "attn.k_proj.weight": (H, H),
        "attn.out_proj.weight": (H, H),
        "mlp.fc_in.bias": (I,),
        "mlp.fc_in.weight": (I, H),
        "mlp.fc_out.bias": (H,),
        "mlp.fc_out.weight": (H, I),
        "ln_1.bias": (H,),
        "ln_1.weight": (H,),
        "lm_head.bias": (V,),
        "lm_head.weight": (V, H),
        "transformer.ln_f.bias": (H,),
        "transformer.ln_f.weight": (H,),
    }
    renames = {
        f"transformer.h.{layer}.{old}": (f"transformer.h.{layer}.{new}", new)
        for layer in range(dims.layers)
        for old, new, _kind in _LAYER_LEAVES
    }
    renames.update({old: (new, new) for old, new, _kind in _HEAD_LEAVES})
    for leaf in leaves:
        if leaf.name == "transformer.wte.bias":
            continue  # folded into the embedding
        if leaf.name == "transformer.wte.weight":
            outputs[leaf.name] = _Output((V, H), (leaf, by_name["transformer.wte.bias"]))
            continue
        new, key = renames[leaf.name]
        outputs[new] = _Output(shapes[key], (leaf,))
    return outputs


# -- config ------------------------------------------------------------------------------------


def gptj_hf_config(
    *,
    n_embd: int,
    n_head: int,
    n_layer: int,
    n_inner: int,
    vocab_size: int,
    rotary_dim: int,
    n_positions: int = 2048,
    bos_token_id: int = DEFAULT_TOKEN_ID,
    eos_token_id: int = DEFAULT_TOKEN_ID,
    name: str | None = None,
) -> dict[str, Any]:
    """A Hugging Face style GPT-J ``config.json`` dict."""
    config: dict[str, Any] = {
        "model_type": "gptj",
        "architectures": ["GPTJForCausalLM"],
        "n_embd": n_embd,
        "n_head": n_head,
        "n_layer": n_layer,
        "n_inner": n_inner,
        "rotary_dim": rotary_dim,
        "vocab_size": vocab_size,
        "n_positions": n_positions,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": False,
    }
    if name:
        config["_name_or_path"] = name
    return config


# keys accepted in a config.json placed beside the shards: Hugging Face name first, then the
# mesh-transformer-jax config name (``configs/6B_roto_256.json``)
_ALIASES: dict[str, tuple[str, ...]] = {
    "n_head": ("n_head", "n_heads", "num_attention_heads"),
    "rotary_dim": ("rotary_dim", "pe_rotary_dims"),
    "n_positions": ("n_positions", "seq"),
    "n_embd": ("n_embd", "d_model", "hidden_size"),
    "n_layer": ("n_layer", "layers", "num_hidden_layers"),
    "vocab_size": ("vocab_size", "n_vocab"),
    "n_inner": ("n_inner",),
    "shards": ("cores_per_replica",),
}


def _pick(config: Mapping[str, Any], key: str) -> Any:
    for alias in _ALIASES[key]:
        if config.get(alias) is not None:
            return config[alias]
    return None


def read_slim_config(path: Path, dims: SlimDims | None = None) -> dict[str, Any]:
    """The GPT-J config of a slim checkpoint, derived from the weights actually stored.

    Layers, width, inner size and vocabulary come from the leaf shapes. The head count cannot
    be derived from shapes (q/k/v are ``[H, H]`` whatever the split into heads): it comes from
    a ``config.json`` beside the shards when there is one (``n_head``, or mesh-transformer-jax's
    ``n_heads``), otherwise GPT-J-6B's head size of 256 is assumed (``n_head = n_embd // 256``,
    at least 1). ``rotary_dim`` likewise (``rotary_dim`` / ``pe_rotary_dims``), else
    ``min(64, head size)`` (GPT-J-6B: 64 of 256); bos/eos 50256 unless the config says otherwise.
    Sizes in that config.json must agree with the weights.
    """
    path = Path(path)
    if dims is None:
        reader = SlimCheckpointReader(path)
        dims = reader.dims
        reader.close()
    given = _beside_config(path)
    for key, actual in (
        ("n_embd", dims.hidden),
        ("n_layer", dims.layers),
        ("vocab_size", dims.vocab),
        ("n_inner", dims.inner),
        ("shards", dims.shards),
    ):
        value = _pick(given, key)
        if value is not None and int(value) != actual:
            raise CheckpointError(
                f"{path / 'config.json'} says {key} = {value} but the slim checkpoint holds {actual}",
                hint="the config.json beside the shards belongs to another model; fix or remove it",
            )
    heads_given = _pick(given, "n_head")
    if heads_given is not None:
        heads = int(heads_given)
        if heads < 1 or dims.hidden % heads:
            raise ConfigError(
                f"{path / 'config.json'}: n_head = {heads} does not divide n_embd = {dims.hidden}",
                hint="set the checkpoint's real head count in config.json",
            )
    else:
        heads = max(1, dims.hidden // DEFAULT_HEAD_SIZE)
        if dims.hidden % heads:
            raise ConfigError(
                f"{path}: the head count cannot be read from the weights, and GPT-J-6B's head size "
                f"{DEFAULT_HEAD_SIZE} does not fit n_embd = {dims.hidden}",
                hint='put a config.json with the head count beside the shards, e.g. {"n_head": 16}',
            )
        log.info(
            "slim.heads_assumed",
            n_head=heads,
            head_size=dims.hidden // heads,
            detail="no config.json beside the shards: assuming GPT-J-6B's head size 256",
        )
    head_size = dims.hidden // heads
    rotary = _pick(given, "rotary_dim")
    rotary = int(rotary) if rotary is not None else min(64, head_size)
    if not 0 < rotary <= head_size:
        raise ConfigError(
            f"{path / 'config.json'}: rotary_dim = {rotary} is not within the head size {head_size}",
            hint="set the checkpoint's real rotary_dim in config.json",
        )
    positions = _pick(given, "n_positions")
    return gptj_hf_config(
        n_embd=dims.hidden,
        n_head=heads,
        n_layer=dims.layers,
        n_inner=dims.inner,
        vocab_size=dims.vocab,
        rotary_dim=rotary,
        n_positions=int(positions) if positions is not None else 2048,
        bos_token_id=int(given.get("bos_token_id", DEFAULT_TOKEN_ID)),
        eos_token_id=int(given.get("eos_token_id", DEFAULT_TOKEN_ID)),
        name=given.get("_name_or_path") or None,
    )


def _beside_config(path: Path) -> dict[str, Any]:
    config_path = path / "config.json"
    if not config_path.is_file():
        return {}
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} does not hold a JSON object")
    return config
