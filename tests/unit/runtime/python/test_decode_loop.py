"""The python runtime's lean decode loop (``decode_loop.py``) against transformers' ``generate`` path.

The loop is for CUDA devices; here it runs eagerly on CPU (mode ``lean``: no graph capture, which needs
a GPU): same ids, lengths, log probabilities and streamed steps as ``generate`` for a batch of prompts of
different lengths (left padding), greedy and sampled with a seed, with penalties, bad and stop words, and
rows ending early at ``end_id``. The graph and compile modes differ only in how the one-token forward is
launched; they are measured on a GPU by ``benchmarks/bench_python_runtime.py --modes``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ftx_triton.errors import ConfigError
from ftx_triton.repository.textproc import encode_words
from ftx_triton.runtime.python import decode_loop
from ftx_triton.runtime.python.decode_loop import COMPILE_ENV, EXACT, LEAN, TRANSFORMERS_STATIC, decode_mode
from ftx_triton.runtime.python.generation import Generator, StepSink, TokenEvent, build_outputs
from ftx_triton.runtime.python.hf_model import load_model
from python_runtime_support import BUILDERS, column, convert, decoder_inputs, registered_families

torch = pytest.importorskip("torch")
DECODERS = ("gptj", "gptneox")
PROMPTS = ([5, 6, 7, 8, 9, 10, 11], [11, 12, 13], [20, 21, 22, 23, 24], [30, 31])
NEW = 12


def _generators(tmp_path_factory: pytest.TempPathFactory, load: Any, tag: str) -> dict[str, Generator]:
    """Generators of tiny decoder models rebuilt from converted files by ``load`` (family, directory, device)."""
    families = registered_families()
    out = {}
    for name in DECODERS:
        root = tmp_path_factory.mktemp(f"{tag}-{name}")
        ckpt = convert(families[name], BUILDERS[name](root / "hf"), root / "ft", 1)
        loaded = load(families[name], Path(ckpt), device="cpu")
        spec = families[name].spec_from_ini(loaded.ini)
        out[name] = Generator.for_model(loaded.model, end_id=spec.end_id, start_id=spec.start_id)
    return out


@pytest.fixture(scope="module")
def generators(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Generator]:
    """Eager (``generate``) generators of tiny decoder models rebuilt from converted files, on CPU."""
    return _generators(tmp_path_factory, load_model, "loop")


@pytest.fixture(scope="module")
def plain_generators(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Generator]:
    """Generators of the same tiny decoders built in plain torch (``torch_model.py``), as the runtime builds them."""
    from ftx_triton.runtime.python.torch_model import load_torch_model

    return _generators(tmp_path_factory, load_torch_model, "plain")


class _Steps(StepSink):
    def __init__(self) -> None:
        self.steps: list[list[TokenEvent]] = []

    def on_tokens(self, events: list[TokenEvent]) -> None:
        self.steps.append(events)


_Decoded = tuple[dict[str, np.ndarray], list[list[TokenEvent]]]
"""A run's outputs and the token events it streamed, step by step."""


def _run(gen: Generator, inputs: dict[str, np.ndarray]) -> _Decoded:
    request = gen.parse(inputs)
    sink = _Steps()
    return build_outputs(request, gen.run(request.items, sink)), sink.steps


def _assert_same_decoding(case: str, got: _Decoded, expected: _Decoded, atol: float) -> None:
    """The same ids and lengths, and log probabilities (outputs and streamed steps) within ``atol``."""
    (got_outputs, got_steps), (expected_outputs, expected_steps) = got, expected
    for output in ("output_ids", "sequence_length"):
        assert np.array_equal(got_outputs[output], expected_outputs[output]), (case, output)
    np.testing.assert_allclose(
        got_outputs["output_log_probs"], expected_outputs["output_log_probs"], atol=atol, err_msg=case
    )
    assert got_steps == [
        [replace(e, log_prob=pytest.approx(e.log_prob, abs=atol)) if e.log_prob is not None else e for e in s]
        for s in expected_steps
    ], case


def _end_id_met_early(gen: Generator) -> int:
    """A token the second row generates (greedy) at its third step, so rows end early at it."""
    free, _ = _run(gen, decoder_inputs(PROMPTS, NEW, end_id=column(10_000, len(PROMPTS), np.uint32)))
    return int(free["output_ids"][1, 0, len(PROMPTS[1]) + 2])


def _cases(gen: Generator) -> dict[str, dict[str, np.ndarray]]:
    rows = len(PROMPTS)
    end = column(_end_id_met_early(gen), rows, np.uint32)
    logp = column(True, rows, np.bool_)
    return {
        "greedy": {"end_id": end, "is_return_log_probs": logp},
        "top-k": {
            "runtime_top_k": column(5, rows, np.uint32),
            "temperature": column(0.8, rows, np.float32),
            "random_seed": column(1234, rows, np.uint64),
            "end_id": end,
            "is_return_log_probs": logp,
        },
        "top-p + repetition": {
            "runtime_top_p": column(0.9, rows, np.float32),
            "repetition_penalty": column(1.3, rows, np.float32),
            "random_seed": column(7, rows, np.uint64),
            "end_id": end,
        },
        "presence + bad and stop words": {
            "presence_penalty": column(0.5, rows, np.float32),
            "bad_words_list": encode_words([[(40,), (41, 42)]] * rows),
            "stop_words_list": encode_words([[(7, 8), (50,)]] * rows),
            "end_id": column(10_000, rows, np.uint32),
        },
    }


@pytest.mark.parametrize("mode", [LEAN, EXACT])
@pytest.mark.parametrize("name", DECODERS)
def test_the_lean_loop_decodes_exactly_like_generate(generators: dict[str, Generator], name: str, mode: str) -> None:
    """``lean`` on a static cache; ``exact`` on a dynamic cache whose layers are views of fixed buffers."""
    gen = generators[name]
    lean = replace(gen, mode=mode)
    for case, extra in _cases(gen).items():
        inputs = decoder_inputs(PROMPTS, [NEW, NEW, NEW - 3, NEW], **extra)
        (expected, expected_steps), (got, got_steps) = _run(gen, inputs), _run(lean, inputs)
        _assert_same_decoding(case, (got, got_steps), (expected, expected_steps), atol=1e-5)
        if case == "greedy":  # the chosen end id ends some rows early, and they stop there
            lengths = got["sequence_length"][:, 0] - [len(p) for p in PROMPTS]
            assert lengths.min() < NEW - 3 and lengths.max() > lengths.min(), lengths
    assert lean.decoder is not None and lean.decoder.shapes, "the lean loop did not run"
    assert gen.decoder is None


@pytest.mark.parametrize("name", DECODERS)
def test_the_plain_torch_decoder_decodes_exactly_like_generate(
    generators: dict[str, Generator], plain_generators: dict[str, Generator], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The python runtime's default model (plain torch, no transformers) against transformers' ``generate`` on the
    same files: the same ids, lengths, log probabilities and streamed steps, greedy and sampled with a seed."""
    from transformers.generation.utils import GenerationMixin

    gen, plain = generators[name], plain_generators[name]
    assert getattr(plain.model, "is_plain_torch", False) and not getattr(gen.model, "is_plain_torch", False)
    real = GenerationMixin.generate
    calls: list[str] = []

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(type(self).__name__)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", counted)
    for case, extra in _cases(gen).items():
        inputs = decoder_inputs(PROMPTS, [NEW, NEW, NEW - 3, NEW], **extra)
        calls.clear()
        (expected, expected_steps), (got, got_steps) = _run(gen, inputs), _run(plain, inputs)
        assert len(calls) == 1, (case, calls)  # generate ran for the reference only
        _assert_same_decoding(case, (got, got_steps), (expected, expected_steps), atol=1e-6)
    assert getattr(plain.model, "is_plain_torch", False)  # transformers' model was never built


@pytest.mark.parametrize("mode", [LEAN, EXACT])
def test_the_decoding_step_of_an_eager_attention_model_makes_no_host_tensor(
    generators: dict[str, Generator], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA graph capture refuses a host-to-device copy, and transformers' own eager-attention mask makes its 0
    with ``torch.tensor(0.0, device=…)`` (every capture of GPT-J's step failed so on an H100). The loop hands
    GPT-J (eager attention) its own 4D step mask, made by device operations only: with ``torch.tensor``
    refused after the prompt's pass, the steps still run and decode as ``generate`` does. (transformers 5, the
    GPU image's, fails this without the loop's mask; 4.x built its mask without ``torch.tensor``.)"""
    gen = generators["gptj"]
    assert gen.model.config._attn_implementation == "eager"
    loop = replace(gen, mode=mode)
    inputs = decoder_inputs(PROMPTS, NEW, end_id=column(10_000, len(PROMPTS), np.uint32))
    expected, _ = _run(gen, inputs)
    original_forward = decode_loop.LeanDecoder._forward
    made: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        made.append(repr(args)[:80])
        raise AssertionError("torch.tensor called inside a decoding step")

    def forward(self: Any, shape: Any, **inputs: Any) -> Any:
        if inputs["input_ids"].shape[1] > 1:  # the prompt's pass is never captured
            return original_forward(self, shape, **inputs)
        with monkeypatch.context() as patch:
            patch.setattr(torch, "tensor", refuse)
            return original_forward(self, shape, **inputs)

    monkeypatch.setattr(decode_loop.LeanDecoder, "_forward", forward)
    got, _ = _run(loop, inputs)
    assert not made
    assert np.array_equal(got["output_ids"], expected["output_ids"])


def test_the_loop_stops_once_every_row_has_finished(generators: dict[str, Generator]) -> None:
    """Rows are read every few steps, so the loop runs past the last end by at most that many steps."""
    gen = generators["gptj"]
    lean = replace(gen, mode=LEAN)
    end = _end_id_met_early(gen)
    request = lean.parse(decoder_inputs([PROMPTS[1]], 200, end_id=column(end, 1, np.uint32)))
    seen: list[int] = []
    assert lean.decoder is None
    original = decode_loop._hand_over

    def spy(tokens: Any, chosen: Any, start: int, take: Any) -> bool:
        seen.append(start + tokens.shape[1])
        return original(tokens, chosen, start, take)

    decode_loop._hand_over = spy
    try:
        result = lean.run(request.items)[0]
    finally:
        decode_loop._hand_over = original
    assert int(result.lengths[0]) == 3
    assert seen == [1, 3]  # read after steps 1 and 3 (groups of 1, 2, 4 …), then stopped


@pytest.mark.parametrize("mode", [LEAN, EXACT])
def test_the_static_cache_is_reused_and_cleared_between_requests(generators: dict[str, Generator], mode: str) -> None:
    """A second request of the same shape decodes on the same cache and still gives generate's ids."""
    gen = generators["gptneox"]
    lean = replace(gen, mode=mode)
    first = decoder_inputs(PROMPTS, 6, end_id=column(10_000, 4, np.uint32))
    second = decoder_inputs([list(reversed(p)) for p in PROMPTS], 6, end_id=column(10_000, 4, np.uint32))
    _run(lean, first)
    assert lean.decoder is not None
    cache = next(iter(lean.decoder.shapes.values())).cache
    got, _ = _run(lean, second)
    assert next(iter(lean.decoder.shapes.values())).cache is cache
    assert np.array_equal(got["output_ids"], _run(gen, second)[0]["output_ids"])


def test_beam_search_keeps_using_generate(generators: dict[str, Generator]) -> None:
    gen = generators["gptj"]
    lean = replace(gen, mode=LEAN)
    inputs = decoder_inputs(PROMPTS[:2], 5, beam_width=column(2, 2, np.uint32), end_id=column(10_000, 2, np.uint32))
    assert np.array_equal(_run(lean, inputs)[0]["output_ids"], _run(gen, inputs)[0]["output_ids"])
    assert lean.decoder is None


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        ("", "exact"),  # the CUDA default: eager's ids, 4-5x its speed on an H100
        ("0", "eager"),
        ("eager", "eager"),
        ("1", "transformers"),
        ("graph", "graph"),
        ("Inductor", "inductor"),
        ("cudagraphs", "cudagraphs"),
        ("lean", "lean"),
        ("exact", "exact"),
        ("transformers", "transformers"),
    ],
)
def test_the_decoding_mode_comes_from_the_environment_on_cuda_only(
    monkeypatch: pytest.MonkeyPatch, value: str, mode: str
) -> None:
    monkeypatch.setenv(COMPILE_ENV, value)
    assert decode_mode(torch.device("cuda")) == mode
    assert decode_mode(torch.device("cuda", 1)) == mode
    assert decode_mode(torch.device("cpu")) == "eager"  # CPU stays as it was


@pytest.mark.parametrize("value", ["yes", "2", "graph;rm -rf /", "GRAPHS"])
def test_an_unknown_decoding_mode_is_refused_with_a_hint(
    generators: dict[str, Generator], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(COMPILE_ENV, value)
    with pytest.raises(ConfigError, match=f"{COMPILE_ENV}=.* is not a decoding mode") as caught:
        decode_mode(torch.device("cuda"))
    assert "eager, transformers, lean, graph, exact, cudagraphs, inductor" in str(caught.value.hint)
    gen = generators["gptj"]
    with pytest.raises(ConfigError, match="is not a decoding mode"):  # even on CPU: a typo is said at start
        Generator.for_model(gen.model, end_id=0, start_id=0)


def test_transformers_static_mode_generates_what_the_eager_one_does(generators: dict[str, Generator]) -> None:
    gen = generators["gptj"]
    static = replace(gen, mode=TRANSFORMERS_STATIC)
    inputs = decoder_inputs(PROMPTS, 6, end_id=column(10_000, 4, np.uint32))
    assert np.array_equal(_run(static, inputs)[0]["output_ids"], _run(gen, inputs)[0]["output_ids"])
