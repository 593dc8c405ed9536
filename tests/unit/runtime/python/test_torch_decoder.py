"""The python runtime's plain-torch decoders (``torch_decoder.py``, ``torch_model.py``, ``torch_sampling.py``)
against transformers, on tiny random checkpoints converted to FT files, on the CPU in fp32.

Logits equal transformers' bit for bit (GPT-J, KoGPT, GPT-NeoX with the parallel and the sequential residual,
with and without left padding, over a prompt and then token by token on the cache, whose keys and values
equal and are laid out as ``DynamicCache``'s); each logits processor
equals transformers' own on random scores; the python runtime's model loads and answers greedy and sampled
requests without importing transformers, and imports it for beam search, answering as transformers does.
Decoding equality with ``generate`` (ids, log probabilities, streamed steps) is in ``test_decode_loop.py``.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ftx_triton.runtime.python.decode_loop import prompt_positions
from ftx_triton.runtime.python.generation import Sampling
from ftx_triton.runtime.python.hf_model import load_model
from ftx_triton.runtime.python.torch_model import load_torch_model
from python_runtime_support import BUILDERS, convert, options, registered_families

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ftx_triton.runtime.python import torch_sampling  # noqa: E402 - needs torch
from ftx_triton.runtime.python.torch_decoder import KVCache, config_of  # noqa: E402

CASES = ("gptj", "kogpt", "gptneox", "gptneox-sequential")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    """case -> (family, converted 1-gpu directory)."""
    from ftx_gptneox.tiny import tiny_gptneox

    families = registered_families()
    out = {}
    for case in CASES:
        name = case.split("-")[0]
        root = tmp_path_factory.mktemp(f"plain-{case}")
        if case == "gptneox-sequential":
            src = tiny_gptneox(root / "hf", use_parallel_residual=False, random_init=True, seed=11)
        else:
            src = BUILDERS[name](root / "hf")
        out[case] = (families[name], Path(convert(families[name], src, root / "ft", 1)))
    return out


@pytest.mark.parametrize("case", CASES)
def test_logits_equal_transformers_bit_for_bit_over_the_prompt_and_each_step(
    checkpoints: dict[str, tuple[Any, Path]], case: str
) -> None:
    family, ckpt = checkpoints[case]
    reference = load_model(family, ckpt, device="cpu").model
    loaded = load_torch_model(family, ckpt, device="cpu")
    assert loaded is not None and getattr(loaded.model, "is_plain_torch", False)
    plain = loaded.model
    if case == "gptneox-sequential":
        assert not plain.config.parallel_residual and reference.config.use_parallel_residual is False
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(reference.forward).parameters else {}
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    for attention in (torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6]), torch.ones_like(ids)):
        positions = prompt_positions(attention)
        cache, past = KVCache(), transformers.DynamicCache()
        with torch.inference_mode():
            expected = reference(
                input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=past, **keep
            )
            got = plain(ids, attention, positions, cache)
            assert torch.equal(got, expected.logits[:, -1].float()), case
            _assert_caches_alike(cache, expected.past_key_values)
            mask, position, token = attention, positions[:, -1:], got.argmax(-1)[:, None]
            for _ in range(3):  # one token at a time on the caches
                mask = torch.cat([mask, mask.new_ones((2, 1))], dim=-1)
                position = position + 1
                expected = reference(
                    input_ids=token,
                    attention_mask=mask,
                    position_ids=position,
                    past_key_values=expected.past_key_values,
                    cache_position=torch.tensor([mask.shape[1] - 1]),
                    **keep,
                )
                got = plain(token, mask, position, cache)
                assert torch.equal(got, expected.logits[:, -1].float()), case
                token = got.argmax(-1)[:, None]
            _assert_caches_alike(cache, expected.past_key_values)


def _assert_caches_alike(cache: KVCache, past: Any) -> None:
    """Equal keys and values laid out alike: on some CPUs (MKL on AVX2) the attention matmul rounds by layout,
    so a permuted view where ``DynamicCache`` holds a contiguous copy changes the logits' last bits."""
    assert len(cache.layers) == len(past.layers)
    for (keys, values), layer in zip(cache.layers, past.layers, strict=True):
        for ours, theirs in ((keys, layer.keys), (values, layer.values)):
            assert torch.equal(ours, theirs) and ours.stride() == theirs.stride(), (ours.stride(), theirs.stride())


def test_configurations_no_plain_module_covers_are_left_to_transformers(
    checkpoints: dict[str, tuple[Any, Path]],
) -> None:
    from ftx_triton.formats.ftformat import read_ini

    family, ckpt = checkpoints["gptneox"]
    hf = family.hf_config_from_ini(read_ini(ckpt / "config.ini"))
    assert config_of(hf) is not None
    for change in (
        {"model_type": "t5"},
        {"hidden_act": "gelu_10"},
        {"tie_word_embeddings": True},
        {"rotary_emb_base": 500.0},
        {"hidden_size": None},
    ):
        assert config_of({**hf, **change}) is None, change


def test_a_missing_weight_file_is_named(checkpoints: dict[str, tuple[Any, Path]], tmp_path: Path) -> None:
    import shutil

    from ftx_triton.errors import CheckpointError

    family, ckpt = checkpoints["gptj"]
    broken = tmp_path / "1-gpu"
    shutil.copytree(ckpt, broken)
    (broken / "model.final_layernorm.bias.bin").unlink()
    with pytest.raises(CheckpointError, match="final_layernorm.bias|ln_f.bias"):
        load_torch_model(family, broken, device="cpu")


# --------------------------------------------------------------------------- logits processors


def _scores(seed: int) -> Any:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn((4, 300), generator=generator) * 3
    scores[:, 7] = scores[:, 8]  # ties, which top-k and top-p must treat as transformers does
    return scores


def test_each_processor_equals_transformers_own() -> None:
    from transformers.generation import logits_process as hf

    ids = torch.tensor([[1, 5, 5, 9], [2, 7, 8, 299], [0, 0, 0, 0], [3, 4, 5, 6]])
    pairs = [
        (torch_sampling.RepetitionPenalty(1.3), hf.RepetitionPenaltyLogitsProcessor(1.3)),
        (torch_sampling.RepetitionPenalty(0.7), hf.RepetitionPenaltyLogitsProcessor(0.7)),
        (torch_sampling.Temperature(0.6), hf.TemperatureLogitsWarper(0.6)),
        (torch_sampling.TopK(5), hf.TopKLogitsWarper(5)),
        (torch_sampling.TopK(1000), hf.TopKLogitsWarper(1000)),
        (torch_sampling.TopP(0.9), hf.TopPLogitsWarper(0.9)),
        (torch_sampling.TopP(0.01), hf.TopPLogitsWarper(0.01)),
    ]
    for seed in range(3):
        for ours, theirs in pairs:
            assert torch.equal(ours(ids, _scores(seed)), theirs(ids, _scores(seed))), (seed, ours)


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(end_id=0, start_id=0),
        Sampling(end_id=0, start_id=0, repetition_penalty=1.4),
        Sampling(end_id=0, start_id=0, top_k=7, temperature=0.7, repetition_penalty=0.8),
        Sampling(end_id=0, start_id=0, top_p=0.85),
        Sampling(end_id=0, start_id=0, top_k=20, top_p=0.5, temperature=1.3),
        Sampling(end_id=0, start_id=0, top_p=1.0, temperature=2.0),
    ],
)
def test_the_chain_equals_the_processors_generate_builds(sampling: Sampling) -> None:
    """The same processors in the same order as transformers' ``_get_logits_processor`` for the GenerationConfig
    the runtime gives ``generate``, ftx's own (here a presence penalty) in between as generate merges them."""
    from ftx_triton.runtime.python.generation import _PresencePenalty

    tiny = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=300))
    config = transformers.GenerationConfig(max_new_tokens=4, min_new_tokens=0, **sampling.generate_kwargs(300))
    extra = [_PresencePenalty(0.5)]
    ids = torch.tensor([[1, 5, 5, 9], [2, 7, 8, 299], [0, 0, 0, 0], [3, 4, 5, 6]])
    theirs = tiny._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=4,
        encoder_input_ids=ids,
        prefix_allowed_tokens_fn=None,
        logits_processor=transformers.LogitsProcessorList(extra),
        device="cpu",
        model_kwargs={},
    )
    ours = torch_sampling.logits_chain(sampling, extra)
    assert len(ours.processors) == len(theirs)
    for seed in range(3):
        assert torch.equal(ours(ids, _scores(seed)), theirs(ids, _scores(seed))), seed


# --------------------------------------------------------------------------- the stub's imports


STUB = """
import json, sys
from ftx_triton.runtime.python.triton_model import FtModel
sys.path.insert(0, {tests!r})
from python_runtime_support import decoder_inputs, column
import numpy as np
config = json.loads({config!r})
ft = FtModel.from_config(config, device="cpu", own_process=True)
report = {{"after_load": sorted(m for m in sys.modules if m.split(".")[0] == "transformers")}}
import torch
report["rich"], report["structlog"] = "rich" in sys.modules, "structlog" in sys.modules
report["threads"] = torch.get_num_threads()
from ftx_triton.plugins import DEFAULT_PLUGINS
report["core_plugins"] = sorted(m for m in (*DEFAULT_PLUGINS, "click") if m in sys.modules)
greedy = ft.infer([decoder_inputs([[5, 6, 7]], 6, end_id=column(10_000, 1, np.uint32))])[0].outputs
sampled = ft.infer([decoder_inputs([[5, 6, 7]], 6, runtime_top_k=column(4, 1, np.uint32),
    random_seed=column(3, 1, np.uint64), end_id=column(10_000, 1, np.uint32))])[0].outputs
report["after_greedy_and_sampled"] = sorted(m for m in sys.modules if m.split(".")[0] == "transformers")
beams = ft.infer([decoder_inputs([[5, 6, 7]], 4, beam_width=column(2, 1, np.uint32),
    end_id=column(10_000, 1, np.uint32))])[0].outputs
report["after_beams"] = "transformers" in sys.modules
report["swapped"] = not getattr(ft.generator.model, "is_plain_torch", False)
again = ft.infer([decoder_inputs([[5, 6, 7]], 6, end_id=column(10_000, 1, np.uint32))])[0].outputs
report["outputs"] = {{k: v["output_ids"].tolist() for k, v in
    (("greedy", greedy), ("sampled", sampled), ("beams", beams), ("greedy again", again))}}
print(json.dumps(report))
"""


@pytest.mark.parametrize("case", ["gptj", "gptneox"])
def test_the_stub_loads_and_decodes_without_importing_transformers_until_beam_search(
    checkpoints: dict[str, tuple[Any, Path]], case: str
) -> None:
    """In a fresh interpreter (as Triton's stub starts): building the ``fastertransformer`` model and answering
    greedy and sampled requests import nothing of transformers (nor core's stage and runtime plugins, nor click:
    the stub's host holds the families only; nor rich, which structlog would import for tracebacks), and the tiny
    model runs on one torch thread; a beam-search request builds transformers' model
    then, which serves every later request (greedy ones answered as before). The answers equal those of the model
    built with transformers from the start."""
    from ftx_triton.runtime.python.repository import build_python_ft_model_config
    from ftx_triton.runtime.python.triton_model import FtModel
    from google.protobuf import json_format
    from python_runtime_support import column, decoder_inputs

    family, ckpt = checkpoints[case]
    message = build_python_ft_model_config(options(family, ckpt, 1), family)
    config = json_format.MessageToDict(message, preserving_proto_field_name=True)
    tests = str(Path(__file__).resolve().parents[3])
    script = STUB.format(tests=tests, config=json.dumps(config))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["after_load"] == [] and report["after_greedy_and_sampled"] == [], report
    assert report["core_plugins"] == []  # the family alone: no stage, runtime or command module (0.2 s)
    assert report["structlog"] and not report["rich"]  # structlog's rich tracebacks go unused in a stub (0.1-0.2 s)
    assert report["threads"] == 1  # a tiny model on the CPU: one torch thread (cpu_threads)
    assert report["after_beams"] is True and report["swapped"] is True  # transformers' model serves from then on
    assert report["outputs"]["greedy again"] == report["outputs"]["greedy"]

    # the same requests through transformers' model (the generator's loader), in this process
    ft = FtModel.from_config(config, device="cpu")
    ft.generator.model = ft.generator.transformers_model()
    no_end = column(10_000, 1, np.uint32)
    expected = {
        "greedy": decoder_inputs([[5, 6, 7]], 6, end_id=no_end),
        "sampled": decoder_inputs(
            [[5, 6, 7]], 6, runtime_top_k=column(4, 1, np.uint32), random_seed=column(3, 1, np.uint64), end_id=no_end
        ),
        "beams": decoder_inputs([[5, 6, 7]], 4, beam_width=column(2, 1, np.uint32), end_id=no_end),
    }
    for name, inputs in expected.items():
        assert ft.infer([inputs])[0].outputs["output_ids"].tolist() == report["outputs"][name], name
