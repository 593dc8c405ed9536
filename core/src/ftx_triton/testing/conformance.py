"""``FamilyConformance``: the tests every family plugin inherits.

A plugin's whole conformance test file::

    from ftx_triton.testing.conformance import FamilyConformance
    from ftx_gptj.family import GPTJ

    class TestGPTJ(FamilyConformance):
        family = GPTJ
        tiny_hf_config = {"model_type": "gptj", "n_layer": 2, "n_embd": 64, "n_head": 4,
                          "rotary_dim": 8, "vocab_size": 128, "n_positions": 64}

The tiny checkpoint is built offline from ``tiny_hf_config`` with the transformers class named by
``family.hf_model_class`` (seeded random weights drawn with ``tiny_weight_std``, so that
attention is far from uniform), saved as safetensors.

``test_ftx_reference_matches_transformers`` checks the converted files against an oracle that
shares nothing with the family's table: :mod:`ftx_triton.oracle`, FasterTransformer's own math on CPU
for the family's ``triton_model_type``, reading the files as FT's loaders do, compared with
transformers' logits on the original checkpoint. A table that swaps q and k, splits on the wrong
axis or fuses in the wrong order passes the round trip (the python runtime inverts the same
table) but fails here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from ftx_triton.conversion.family import Family
from ftx_triton.formats.ftformat import gpu_dir_name, read_ini, read_tensor

TP = 2


TINY_WEIGHT_STD = 0.2
"""Every weight of a tiny checkpoint gets N(0, 0.2²) added to transformers' init
(:func:`ftx_triton.tiny.randomize`). The default init alone (std 0.02) leaves a tiny model's attention almost
uniform, where swapping q and k moves its logits less than FasterTransformer's own approximations do;
with the noise a wrong layout moves them by tens of percent."""


def build_tiny_checkpoint(
    family: Family, hf_config: Mapping[str, Any], dest: Path, seed: int = 0, weight_std: float | None = None
) -> Path:
    """Save a randomly initialised model of ``family`` described by ``hf_config`` into ``dest``: transformers'
    own init, plus N(0, ``weight_std``²) on every parameter when ``weight_std`` is given."""
    import torch
    import transformers

    from ftx_triton.tiny import randomize

    config = transformers.AutoConfig.for_model(**dict(hf_config))
    model_class = getattr(transformers, family.hf_model_class)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    if weight_std is not None:
        randomize(model, seed, weight_std, around_init=True)
    model.save_pretrained(dest, safe_serialization=True)
    return dest


@pytest.fixture(scope="class")
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The conformance class's tiny checkpoint (built once per class)."""
    cls = request.cls
    return build_tiny_checkpoint(
        cls.family(), cls.tiny_hf_config, tmp_path_factory.mktemp("tiny"), weight_std=cls.tiny_weight_std
    )


@pytest.fixture(scope="class")
def converted(
    request: pytest.FixtureRequest, checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, Path]:
    """The tiny checkpoint converted at tp 1 and at the class's tp (fp32)."""
    from ftx_triton.conversion.convert import convert_directory

    cls = request.cls
    out = tmp_path_factory.mktemp("ft")
    for tp in (1, cls.tp):
        convert_directory(cls.family(), checkpoint, out, tp=tp, weight_dtype="fp32")
    return {1: out / gpu_dir_name(1), cls.tp: out / gpu_dir_name(cls.tp)}


class FamilyConformance:
    """Inherit, set ``family`` and ``tiny_hf_config``; every test here must pass."""

    family: ClassVar[type[Family]]
    tiny_hf_config: ClassVar[Mapping[str, Any]]
    tp: ClassVar[int] = TP
    tiny_weight_std: ClassVar[float | None] = TINY_WEIGHT_STD

    def _spec(self, checkpoint: Path) -> Any:
        family = self.family()
        return family.spec(family.read_hf_config(checkpoint))

    # -- the tests -----------------------------------------------------------------------

    def test_table_covers_the_checkpoint(self, checkpoint: Path) -> None:
        from ftx_triton.conversion.tensormap import plan

        family = self.family()
        reader = family.open_weights(checkpoint)
        spec = self._spec(checkpoint)
        result = plan(family.tensor_map(spec), {n: reader.shape(n) for n in reader.names()}, spec.layers, spec.dims)
        consumed = {n for job in result.jobs for n in job.sources}
        assert consumed | set(result.skipped) == set(reader.names())

    def test_every_ft_file_is_written_once_per_rank(self, checkpoint: Path, converted: dict[int, Path]) -> None:
        from ftx_triton.conversion.convert import ft_layout

        spec = self._spec(checkpoint)
        for tp, directory in converted.items():
            expected = {"config.ini"}
            for dst, (_shape, split) in ft_layout(self.family(), spec).items():
                expected |= {f"{dst}.bin"} if split is None else {f"{dst}.{r}.bin" for r in range(tp)}
            written = {p.name for p in directory.iterdir()}
            optional = self._optional_files(spec, tp)
            assert expected - optional <= written <= expected, sorted(written ^ expected)

    def _optional_files(self, spec: Any, tp: int) -> set[str]:
        from ftx_triton.conversion import tensormap

        names = set()
        for row in self.family().tensor_map(spec).rows:
            if row.optional:
                for binding in tensormap.expand(row, spec.layers):
                    dst = tensormap.bind(row.dst, binding)
                    names |= {f"{dst}.bin"} if row.split is None else {f"{dst}.{r}.bin" for r in range(tp)}
        return names

    def test_tp_split_joins_back(self, checkpoint: Path, converted: dict[int, Path]) -> None:
        """Split files joined on their axis equal tp=1's; a whole file is the same bytes at any tp, unless an
        arithmetic op computes it from tp (GPT-NeoX's bias sum: the FT reference checks those)."""
        from ftx_triton.conversion.convert import ft_layout

        one, many, dtype = converted[1], converted[self.tp], np.dtype(np.float32)
        spec = self._spec(checkpoint)
        for dst, (shape, split) in ft_layout(self.family(), spec).items():
            if split is None:
                if (one / f"{dst}.bin").exists() and dst not in self._computed_files(spec):
                    assert (many / f"{dst}.bin").read_bytes() == (one / f"{dst}.bin").read_bytes(), dst
                continue
            if not (one / f"{dst}.0.bin").exists():
                continue
            part = list(shape)
            part[split] //= self.tp
            joined = np.concatenate(
                [read_tensor(many / f"{dst}.{r}.bin", dtype, tuple(part)) for r in range(self.tp)], axis=split
            )
            np.testing.assert_array_equal(joined, read_tensor(one / f"{dst}.0.bin", dtype, shape), err_msg=dst)

    def _computed_files(self, spec: Any) -> set[str]:
        """FT file stems written by ops that compute values (not layout only), which may depend on tp."""
        from ftx_triton.conversion import tensormap

        return {
            tensormap.bind(row.dst, binding)
            for row in self.family().tensor_map(spec).rows
            if not row.op.layout_only
            for binding in tensormap.expand(row, spec.layers)
        }

    def test_round_trip_returns_the_original_tensors(self, checkpoint: Path, converted: dict[int, Path]) -> None:
        from ftx_triton.conversion.convert import invert_checkpoint

        family = self.family()
        reader = family.open_weights(checkpoint)
        skipped = set(self._skipped(checkpoint))
        kept = self._kept(checkpoint)
        for tp, directory in converted.items():
            rebuilt = dict(invert_checkpoint(family, directory))
            for name in reader.names():
                if name in skipped:
                    continue
                assert name in rebuilt, f"tp={tp}: {name} is not rebuilt"
                part = kept.get(name, slice(None))  # a row's declared lossy step: only what FT keeps comes back
                np.testing.assert_array_equal(
                    rebuilt[name][part], reader.read(name)[part], err_msg=f"tp={tp}: {name}[{part}]"
                )

    def _kept(self, checkpoint: Path) -> dict[str, slice]:
        """Source tensors of rows whose op declares a lossy step (``Op.kept_rows``), with the part they keep."""
        from ftx_triton.conversion import tensormap

        spec = self._spec(checkpoint)
        return {
            tensormap.bind(source, binding): row.op.kept
            for row in self.family().tensor_map(spec).rows
            if row.op.kept_rows is not None
            for binding in tensormap.expand(row, spec.layers)
            for source in row.sources
        }

    def _skipped(self, checkpoint: Path) -> list[str]:
        from ftx_triton.conversion.tensormap import plan

        family = self.family()
        reader = family.open_weights(checkpoint)
        spec = self._spec(checkpoint)
        return plan(
            family.tensor_map(spec), {n: reader.shape(n) for n in reader.names()}, spec.layers, spec.dims
        ).skipped

    def test_config_ini_describes_the_checkpoint(self, checkpoint: Path, converted: dict[int, Path]) -> None:
        family = self.family()
        spec = self._spec(checkpoint)
        ini = read_ini(converted[1] / "config.ini")
        assert all("weight_data_type" in section for name, section in ini.items() if name != "structure")
        rebuilt = family.spec_from_ini(ini)
        assert dict(rebuilt.dims) == dict(spec.dims)
        assert dict(rebuilt.layers) == dict(spec.layers)
        assert (rebuilt.start_id, rebuilt.end_id) == (spec.start_id, spec.end_id)

    def test_config_pbtxt_agrees_with_config_ini(self, converted: dict[int, Path]) -> None:
        from ftx_triton.repository.model_config import FtModelOptions, build_ft_model_config

        family = self.family()
        opts = FtModelOptions.for_family(family, converted[self.tp], self.tp, data_type=family.data_types[0])
        config = build_ft_model_config(opts)
        params = {k: v.string_value for k, v in config.parameters.items()}
        assert params["model_type"] == family.triton_model_type
        assert Path(params["model_checkpoint_path"]).name == gpu_dir_name(int(params["tensor_para_size"]))
        assert params["data_type"] in family.data_types
        assert (Path(params["model_checkpoint_path"]) / "config.ini").is_file()

    def test_the_python_runtime_generates_like_transformers(self, checkpoint: Path, converted: dict[int, Path]) -> None:
        """What ``ftx run --runtime python`` serves: the model the python runtime rebuilds from the FT files
        (split for the class's tp) generates the same greedy tokens as transformers on the original
        checkpoint (a weight the inverse table misses, or a tied head left untied, shows here)."""
        import torch
        import transformers

        from ftx_triton.runtime.python.hf_model import load_model

        family = self.family()
        rebuilt = load_model(family, converted[self.tp], device="cpu", data_type="fp32").model
        original = getattr(transformers, family.hf_model_class).from_pretrained(checkpoint).eval()
        vocab = int(original.config.vocab_size)
        ids = torch.tensor([[(7 * i + 3) % vocab for i in range(6)]])
        mask = torch.ones_like(ids)
        end = self._spec(checkpoint).end_id
        with torch.no_grad():
            want = original.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=end)
            got = rebuilt.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=end)
        assert got.tolist() == want.tolist()

    def test_ftx_reference_matches_transformers(self, checkpoint: Path, converted: dict[int, Path]) -> None:
        """What FasterTransformer would compute from the converted files, at tp 1 and at the class's tp,
        matches transformers on the original checkpoint (the oracle reads FT's files, not the table)."""
        from ftx_triton.oracle import verify
        from ftx_triton.oracle.verify import MODEL_TYPES

        family = self.family()
        if family.triton_model_type not in MODEL_TYPES:
            pytest.skip(
                f"the FasterTransformer reference covers {', '.join(MODEL_TYPES)}, not {family.triton_model_type}"
            )
        for tp, directory in converted.items():
            verdict = verify(directory, checkpoint, model_class=family.hf_model_class)
            assert verdict.model_type == family.triton_model_type, verdict.describe()
            assert verdict.tp == tp
            assert verdict.passed, verdict.describe()

    def test_slug_is_consistent(self) -> None:
        family = self.family()
        module = type(family).__module__.split(".")[0]
        assert module == f"ftx_{family.name}"
        eps = [ep for ep in metadata.entry_points(group="ftx") if ep.value.split(":")[0] == module]
        assert [ep.name for ep in eps] == [family.name]
        assert eps[0].dist is not None and eps[0].dist.name == f"ftx-triton-{family.name}"

    def test_listed_by_ftx_plugins(self, ftx_cli: Any) -> None:
        result = ftx_cli("plugins", "--json")
        records = {r["name"]: r for r in json.loads(result.stdout)}
        family = self.family()
        assert family.name in records[family.name]["families"]
        assert records[family.name]["status"] == "loaded"
