"""The python runtime in-process: rebuilding transformers models from FT files, and FT request
semantics (greedy, sampling, beams, penalties, end id, stop/bad words, lengths, streaming) against
``transformers`` generate on the original checkpoint. Servers are tested in test_python_runtime_server.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ftx_triton.errors import CheckpointError, ConfigError
from ftx_triton.repository.textproc import encode_words
from ftx_triton.runtime.python.generation import (
    Generator,
    ModelLimits,
    RequestError,
    build_outputs,
    decode_words,
    finished_length,
    parse_request,
)
from ftx_triton.runtime.python.hf_model import load_model
from ftx_triton.runtime.python.triton_model import FtModel, TritonPythonModel
from python_runtime_support import (
    BUILDERS,
    column,
    convert,
    decoder_inputs,
    hf_greedy,
    hf_sampled,
    options,
    reference_model,
    registered_families,
    t5_inputs,
)

torch = pytest.importorskip("torch")
FAMILIES = registered_families()
PROMPTS = ([5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """name -> (family, source dir, {tp: <tp>-gpu dir}, reference model)."""
    out = {}
    for name, family in FAMILIES.items():
        root = tmp_path_factory.mktemp(f"rt-{name}")
        src = BUILDERS[name](root / "hf")
        ckpts = {tp: convert(family, src, root / f"ft{tp}", tp) for tp in (1, 2)}
        out[name] = (family, src, ckpts, reference_model(src))
    return out


@pytest.fixture(scope="module")
def gptj(built: dict[str, Any]) -> tuple[Any, Generator, Any]:
    family, _src, ckpts, ref = built["gptj"]
    loaded = load_model(family, ckpts[2], device="cpu")
    spec = family.spec_from_ini(loaded.ini)
    return ref, Generator.for_model(loaded.model, end_id=spec.end_id, start_id=spec.start_id), spec


def _run(gen: Generator, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    request = gen.parse(inputs)
    return build_outputs(request, gen.run(request.items))


def _tokens(outputs: dict[str, np.ndarray], b: int = 0, k: int = 0) -> list[int]:
    return outputs["output_ids"][b, k, : outputs["sequence_length"][b, k]].tolist()


# --------------------------------------------------------------------------- rebuilding


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("tp", [1, 2])
def test_rebuilt_model_has_the_original_weights_and_greedy_output(built: dict[str, Any], name: str, tp: int) -> None:
    family, _src, ckpts, ref = built[name]
    loaded = load_model(family, ckpts[tp], device="cpu")
    original = ref.state_dict()
    for key, tensor in loaded.model.state_dict().items():
        if key in original:
            assert torch.allclose(tensor.float(), original[key].float(), atol=1e-6), key
    spec = family.spec_from_ini(loaded.ini)
    gen = Generator.for_model(loaded.model, end_id=spec.end_id, start_id=spec.start_id)
    if loaded.is_encoder_decoder:
        out = _run(gen, t5_inputs(PROMPTS, 12))
        for b, prompt in enumerate(PROMPTS):
            assert _tokens(out, b) == hf_greedy(ref, prompt, 12), (name, tp, b)
    else:
        out = _run(gen, decoder_inputs(PROMPTS, 12))
        for b, prompt in enumerate(PROMPTS):
            assert _tokens(out, b) == hf_greedy(ref, prompt, 12), (name, tp, b)


def test_weights_that_need_no_cast_are_the_mapped_files(built: dict[str, Any]) -> None:
    """fp32 files on the CPU: every GPT-J weight that the table only moves is a view of its memory-mapped
    .bin file (no read, no copy), and the model still equals the original."""
    family, _src, ckpts, ref = built["gptj"]
    loaded = load_model(family, ckpts[1], device="cpu", data_type="fp32")
    ft_dir = ckpts[1]
    files = {str(p.resolve()) for p in ft_dir.glob("*.bin")}
    spans = []  # this process's mappings of those files (/proc/self/maps: "start-end perms offset dev inode path")
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] in files:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            spans.append((start, end))
    views = sum(
        any(start <= tensor.data_ptr() < end for start, end in spans) for tensor in loaded.model.state_dict().values()
    )
    assert views >= 3 * int(loaded.ini["gptj"]["num_layer"]), views  # qkv, dense, fc per layer at least
    original = ref.state_dict()
    for key, tensor in loaded.model.state_dict().items():
        if key in original:
            assert torch.equal(tensor.float(), original[key].float()), key


def test_load_model_refuses_a_directory_without_config_ini(tmp_path: Path) -> None:
    family = FAMILIES["gptj"]
    with pytest.raises(CheckpointError, match="no config.ini"):
        load_model(family, tmp_path)


def test_load_model_names_missing_weight_files(built: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    family, _src, ckpts, _ref = built["gptj"]
    broken = tmp_path / "1-gpu"
    shutil.copytree(ckpts[1], broken)
    (broken / "model.final_layernorm.weight.bin").unlink()
    with pytest.raises(CheckpointError):
        load_model(family, broken)


def test_cuda_device_is_refused_without_cuda(built: dict[str, Any]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    family, _src, ckpts, _ref = built["gptj"]
    with pytest.raises(ConfigError, match="no CUDA device"):
        load_model(family, ckpts[1], device="cuda")


# --------------------------------------------------------------------------- FT semantics


def test_output_layout_includes_prompt_and_pads_with_end_id(gptj: Any) -> None:
    ref, gen, spec = gptj
    out = _run(gen, decoder_inputs(PROMPTS, [4, 9, 6]))
    assert out["output_ids"].shape == (3, 1, 6 + 9)
    for b, (prompt, n) in enumerate(zip(PROMPTS, (4, 9, 6), strict=True)):
        seq = int(out["sequence_length"][b, 0])
        assert out["output_ids"][b, 0, : len(prompt)].tolist() == list(prompt)
        assert seq <= len(prompt) + n
        assert (out["output_ids"][b, 0, seq:] == spec.end_id).all()
        assert _tokens(out, b) == hf_greedy(ref, prompt, n)


def test_end_id_override_stops_generation_and_is_counted(gptj: Any) -> None:
    ref, gen, _spec = gptj
    prompt = PROMPTS[0]
    free = hf_greedy(ref, prompt, 10, eos_token_id=None)[len(prompt) :]
    stop_token = free[3]
    first = free.index(stop_token)
    out = _run(gen, decoder_inputs([prompt], 10, end_id=column(stop_token, 1, np.uint32)))
    assert int(out["sequence_length"][0, 0]) == len(prompt) + first + 1
    assert _tokens(out) == list(prompt) + free[: first + 1]
    assert (out["output_ids"][0, 0, len(prompt) + first + 1 :] == stop_token).all()


def test_stop_words_end_the_sequence_after_the_word(gptj: Any) -> None:
    ref, gen, _spec = gptj
    prompt = PROMPTS[1]
    free = hf_greedy(ref, prompt, 12, eos_token_id=None)[len(prompt) :]
    word = tuple(free[4:6])
    stops = encode_words([[word, (999, 998)]])
    out = _run(gen, decoder_inputs([prompt], 12, end_id=column(10_000, 1, np.uint32), stop_words_list=stops))
    seq = int(out["sequence_length"][0, 0])
    generated = _tokens(out)[len(prompt) :]
    assert tuple(generated[-2:]) == word and len(generated) <= 6
    assert generated == free[: len(generated)]
    assert seq == len(prompt) + len(generated)


def test_bad_words_are_never_generated(gptj: Any) -> None:
    ref, gen, _spec = gptj
    prompt = PROMPTS[2]
    free = hf_greedy(ref, prompt, 10, eos_token_id=None)[len(prompt) :]
    banned = sorted(set(free[:3]))
    bad = encode_words([[(t,) for t in banned]])
    out = _run(gen, decoder_inputs([prompt], 10, end_id=column(10_000, 1, np.uint32), bad_words_list=bad))
    generated = _tokens(out)[len(prompt) :]
    assert not set(generated) & set(banned)
    expected = hf_greedy(ref, prompt, 10, eos_token_id=None, bad_words_ids=[[t] for t in banned])[len(prompt) :]
    assert generated == expected


def test_top_k_sampling_matches_transformers_with_the_same_seed(gptj: Any) -> None:
    ref, gen, _spec = gptj
    prompt = PROMPTS[0]
    extra = {
        "runtime_top_k": column(5, 1, np.uint32),
        "temperature": column(0.7, 1, np.float32),
        "random_seed": column(1234, 1, np.uint64),
        "end_id": column(10_000, 1, np.uint32),
    }
    a = _tokens(_run(gen, decoder_inputs([prompt], 10, **extra)))
    b = _tokens(_run(gen, decoder_inputs([prompt], 10, **extra)))
    assert a == b  # same seed, same tokens
    assert a == hf_sampled(ref, prompt, 10, 1234, top_k=5, top_p=1.0, temperature=0.7, eos_token_id=10_000)
    other = _tokens(_run(gen, decoder_inputs([prompt], 10, **{**extra, "random_seed": column(99, 1, np.uint64)})))
    assert len(other) == len(a)


def test_top_p_and_repetition_penalty_match_transformers(gptj: Any) -> None:
    ref, gen, _spec = gptj
    prompt = PROMPTS[1]
    extra = {
        "runtime_top_p": column(0.8, 1, np.float32),
        "repetition_penalty": column(1.3, 1, np.float32),
        "random_seed": column(7, 1, np.uint64),
        "end_id": column(10_000, 1, np.uint32),
    }
    got = _tokens(_run(gen, decoder_inputs([prompt], 10, **extra)))
    assert got == hf_sampled(ref, prompt, 10, 7, top_k=0, top_p=0.8, repetition_penalty=1.3, eos_token_id=10_000)


def test_top_k_one_is_greedy(gptj: Any) -> None:
    ref, gen, _spec = gptj
    prompt = PROMPTS[2]
    out = _run(
        gen, decoder_inputs([prompt], 8, runtime_top_k=column(1, 1, np.uint32), random_seed=column(5, 1, np.uint64))
    )
    assert _tokens(out) == hf_greedy(ref, prompt, 8)


def test_beam_search_returns_every_beam_like_transformers(gptj: Any) -> None:
    ref, gen, _spec = gptj
    prompt = PROMPTS[0]
    out = _run(
        gen,
        decoder_inputs(
            [prompt],
            8,
            beam_width=column(3, 1, np.uint32),
            len_penalty=column(1.0, 1, np.float32),
            end_id=column(10_000, 1, np.uint32),
        ),
    )
    assert out["output_ids"].shape == (1, 3, len(prompt) + 8)
    assert out["sequence_length"].shape == (1, 3)
    ids = torch.tensor([prompt])
    expected = ref.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=8,
        num_beams=3,
        num_return_sequences=3,
        do_sample=False,
        length_penalty=1.0,
        early_stopping=False,
        eos_token_id=10_000,
        pad_token_id=10_000,
    )
    for k in range(3):
        assert _tokens(out, 0, k) == expected[k].tolist()


def test_log_probs_are_returned_when_asked(gptj: Any) -> None:
    _ref, gen, _spec = gptj
    out = _run(
        gen,
        decoder_inputs(
            PROMPTS[:2], 5, is_return_log_probs=column(True, 2, np.bool_), end_id=column(10_000, 2, np.uint32)
        ),
    )
    assert out["output_log_probs"].shape == (2, 1, 5)
    assert (out["output_log_probs"] <= 0).all() and (out["output_log_probs"] < 0).any()
    assert np.allclose(out["cum_log_probs"][:, 0], out["output_log_probs"][:, 0].sum(-1), atol=1e-5)


def test_log_probs_equal_transformers_log_softmax_of_the_original_checkpoint(gptj: Any) -> None:
    """#36: each generated token's log probability is the original model's log-softmax at that token
    (the sequence fed back through transformers), within fp32 tolerance; streamed or not."""
    ref, gen, _spec = gptj
    prompt = PROMPTS[0]
    out = _run(
        gen,
        decoder_inputs([prompt], 6, is_return_log_probs=column(True, 1, np.bool_), end_id=column(10_000, 1, np.uint32)),
    )
    sequence = _tokens(out)
    with torch.inference_mode():
        logits = ref(torch.tensor([sequence])).logits[0].float().log_softmax(-1)
    expected = [float(logits[p - 1, sequence[p]]) for p in range(len(prompt), len(sequence))]
    assert np.allclose(out["output_log_probs"][0, 0, : len(expected)], expected, atol=1e-4)
    assert np.isclose(out["cum_log_probs"][0, 0], sum(expected), atol=1e-3)


def test_seeds_are_reproducible_and_different_seeds_differ(gptj: Any) -> None:
    _ref, gen, _spec = gptj
    prompt = PROMPTS[1]
    base = {"temperature": column(1.5, 1, np.float32), "runtime_top_p": column(1.0, 1, np.float32)}
    base["end_id"] = column(10_000, 1, np.uint32)

    def sample(seed: int) -> list[int]:
        return _tokens(_run(gen, decoder_inputs([prompt], 12, random_seed=column(seed, 1, np.uint64), **base)))

    assert sample(11) == sample(11)
    assert len({tuple(sample(seed)) for seed in (1, 2, 3, 4)}) > 1


def test_many_bad_words_are_never_generated_and_match_transformers(gptj: Any) -> None:
    """A thousand two-token bad words (FT's bad_words_list, OpenAI's logit_bias of -100 as one-token
    words beside them) through ftx's trie-based processor: the same tokens as transformers' bad_words_ids."""
    ref, gen, _spec = gptj
    prompt = PROMPTS[2]
    free = hf_greedy(ref, prompt, 10, eos_token_id=None)[len(prompt) :]
    words = [(free[0],), *[(a, b) for a in range(40) for b in range(25)]]
    words.append((free[1], free[2]))
    out = _run(
        gen, decoder_inputs([prompt], 10, end_id=column(10_000, 1, np.uint32), bad_words_list=encode_words([words]))
    )
    generated = _tokens(out)[len(prompt) :]
    assert free[0] not in generated
    expected = hf_greedy(ref, prompt, 10, eos_token_id=None, bad_words_ids=[list(w) for w in words])[len(prompt) :]
    assert generated == expected


def test_presence_penalty_is_fastertransformers_additive_penalty(gptj: Any) -> None:
    """FT's presence_penalty: each token present in the prompt or the text so far loses it once. Greedy with
    a large one never repeats a token; a small one equals transformers' greedy over logits penalized by hand;
    and FT takes either it or repetition_penalty, not both."""
    ref, gen, _spec = gptj
    prompt = PROMPTS[0]
    end = column(10_000, 1, np.uint32)
    out = _run(gen, decoder_inputs([prompt], 10, presence_penalty=column(1000.0, 1, np.float32), end_id=end))
    tokens = _tokens(out)
    assert len(set(tokens)) == len(tokens), tokens
    small = _tokens(_run(gen, decoder_inputs([prompt], 8, presence_penalty=column(0.5, 1, np.float32), end_id=end)))
    sequence = list(prompt)
    with torch.inference_mode():
        for _ in range(8):
            logits = ref(torch.tensor([sequence])).logits[0, -1].float()
            logits[sorted(set(sequence))] -= 0.5
            sequence.append(int(logits.argmax()))
    assert small == sequence
    both = decoder_inputs(
        [prompt], 4, presence_penalty=column(0.5, 1, np.float32), repetition_penalty=column(1.1, 1, np.float32)
    )
    with pytest.raises(RequestError, match="exclude each other"):
        gen.parse(both)


def test_items_with_different_settings_run_in_separate_groups(gptj: Any) -> None:
    ref, gen, _spec = gptj
    before = gen.groups_run
    prompts = PROMPTS[:2]
    out = _run(
        gen,
        decoder_inputs(
            prompts, 6, runtime_top_k=np.array([[1], [4]], np.uint32), random_seed=np.array([[1], [2]], np.uint64)
        ),
    )
    assert gen.groups_run - before == 2
    assert _tokens(out, 0) == hf_greedy(ref, prompts[0], 6)


def test_greedy_items_batch_together_whatever_their_seeds(gptj: Any) -> None:
    _ref, gen, _spec = gptj
    before = gen.groups_run
    _run(
        gen,
        decoder_inputs(
            PROMPTS,
            4,
            random_seed=np.array([[1], [2], [3]], np.uint64),
            temperature=np.array([[0.5], [1.0], [2.0]], np.float32),
        ),
    )
    assert gen.groups_run - before == 1


# --------------------------------------------------------------------------- request validation

LIMITS = ModelLimits(vocab_size=100, end_id=0, start_id=0, max_positions=64)


def test_a_vanishing_temperature_decodes_greedily(gptj: Any) -> None:
    """A temperature of 1e-40 with sampling on used to turn the logits into infinities inside generate()
    (HTTP 500); below 1e-5 the item decodes greedily, its limit."""
    ref, gen, _spec = gptj
    for temperature in (1e-40, 0.0):
        inputs = decoder_inputs(
            [PROMPTS[0]],
            4,
            temperature=np.array([[temperature]], np.float32),
            runtime_top_k=column(5, 1, np.uint32),
            runtime_top_p=np.array([[0.9]], np.float32),
        )
        assert not gen.parse(inputs).items[0].sampling.do_sample
        assert _tokens(_run(gen, inputs)) == hf_greedy(ref, PROMPTS[0], 4)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"input_ids": np.zeros((1, 0), np.uint32)}, "empty"),
        ({"input_lengths": np.array([[0]], np.uint32)}, "at least 1"),
        ({"input_lengths": np.array([[9]], np.uint32)}, "exceeds the input_ids width"),
        ({"request_output_len": np.array([[0]], np.uint32)}, "at least 1"),
        ({"request_output_len": np.array([[2**32 - 1]], np.uint32)}, "exceeds the limit"),
        ({"request_output_len": np.array([[60]], np.uint32)}, "exceeds the model's 64 positions"),
        (
            {"input_ids": np.array([[1, 2, 300]], np.uint32), "input_lengths": np.array([[3]], np.uint32)},
            "outside the vocabulary",
        ),
        ({"runtime_top_p": np.array([[1.5]], np.float32)}, "runtime_top_p"),
        ({"beam_width": np.array([[0]], np.uint32)}, "beam_width"),
        ({"repetition_penalty": np.array([[0.0]], np.float32)}, "repetition_penalty"),
        ({"stop_words_list": np.array([[[1, 2], [5, -1]]], np.int32)}, "offsets"),
        ({"stop_words_list": np.array([[[1, 2, 3]]], np.int32)}, "shape"),
    ],
)
def test_bad_requests_are_refused_with_a_reason(change: dict[str, np.ndarray], message: str) -> None:
    inputs = {**decoder_inputs([[1, 2, 3, 4, 5]], 4), **change}
    with pytest.raises(RequestError, match=message):
        parse_request(inputs, LIMITS)


def test_required_inputs() -> None:
    with pytest.raises(RequestError, match="request_output_len"):
        parse_request({"input_ids": np.ones((1, 3), np.uint32)}, LIMITS)
    with pytest.raises(RequestError, match="max_output_len"):
        parse_request({"input_ids": np.ones((1, 3), np.uint32)}, LIMITS, "encoder-decoder")


def test_word_lists_round_trip_in_ft_encoding() -> None:
    words = [[(5, 6), (7,)], [], [(9, 9, 9)]]
    encoded = encode_words(words)
    assert encoded.dtype == np.int32 and encoded.shape == (3, 2, 3)
    assert encoded[0].tolist() == [[5, 6, 7], [2, 3, -1]]
    assert encoded[1].tolist() == [[0, 0, 0], [-1, -1, -1]]  # "no list"
    assert decode_words(encoded, 3, "w") == [((5, 6), (7,)), (), ((9, 9, 9),)]
    assert decode_words(np.array([[[0], [-1]]], np.int32), 2, "w") == [(), ()]  # one row broadcasts


def test_finished_length_counts_the_end_token_and_stop_words() -> None:
    from ftx_triton.runtime.python.generation import Item, Sampling

    item = Item(np.array([1, 2]), 6, Sampling(end_id=0, start_id=0), stop_words=((7, 8),))
    assert finished_length([1, 2], [5, 0, 4, 4], item) == 2
    assert finished_length([1, 2], [5, 7, 8, 4], item) == 3
    assert finished_length([1, 2], [5, 5, 5, 5, 5, 5, 5], item) == 6


# --------------------------------------------------------------------------- the Triton model object


def _config(family: Any, ckpt: Path, tp: int, streaming: bool = False) -> dict[str, Any]:
    """The model config as Triton hands it to a Python model (JSON of the protobuf message)."""
    from ftx_triton.runtime.python.repository import build_python_ft_model_config
    from google.protobuf import json_format

    message = build_python_ft_model_config(options(family, ckpt, tp, streaming=streaming), family)
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


class FakePbUtils:
    """A stand-in for triton_python_backend_utils (only what TritonPythonModel uses); not Triton."""

    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    class Tensor:
        def __init__(self, name: str, value: np.ndarray) -> None:
            self.name, self.value = name, value

        def as_numpy(self) -> np.ndarray:
            return self.value

        def to_dlpack(self) -> Any:  # the exchange TritonPythonModel uses under numpy 2
            import torch
            from torch.utils.dlpack import to_dlpack

            return to_dlpack(torch.from_numpy(np.ascontiguousarray(self.value)))

        @classmethod
        def from_dlpack(cls, name: str, capsule: Any) -> Any:
            from torch.utils.dlpack import from_dlpack

            return cls(name, from_dlpack(capsule).numpy())

    class TritonError:
        def __init__(self, message: str) -> None:
            self.message = message

    class InferenceResponse:
        def __init__(self, output_tensors: list[Any], error: Any = None) -> None:
            self.outputs = {t.name: t.value for t in output_tensors}
            self.error = error

    class Request:
        def __init__(self, inputs: dict[str, np.ndarray], sent: list[Any] | None = None) -> None:
            self.inputs, self.sent = inputs, sent if sent is not None else []

        def requested_output_names(self) -> list[str]:
            return []

        def get_response_sender(self) -> Any:
            request = self

            class Sender:
                def send(self, response: Any, flags: int = 0) -> None:
                    request.sent.append((response, flags))

            return Sender()

    @staticmethod
    def get_input_tensor_by_name(request: Any, name: str) -> Any:
        value = request.inputs.get(name)
        return None if value is None else FakePbUtils.Tensor(name, value)


def test_triton_model_casts_outputs_to_the_config_dtypes_and_isolates_bad_requests(built: dict[str, Any]) -> None:
    family, _src, ckpts, ref = built["gptj"]
    model = TritonPythonModel(FakePbUtils)
    config = _config(family, ckpts[1], 1)
    model.initialize({"model_config": json.dumps(config)})
    declared = {o["name"]: o["data_type"] for o in config["output"]}
    assert declared["sequence_length"] == "TYPE_INT32"  # GPT-J's, as FasterTransformer returns it
    good = FakePbUtils.Request(decoder_inputs([PROMPTS[0]], 5))
    bad = FakePbUtils.Request(decoder_inputs([PROMPTS[1]], 0))
    responses = model.execute([good, bad, good])
    assert responses[1].error is not None and "at least 1" in responses[1].error.message
    for response in (responses[0], responses[2]):
        assert response.error is None
        assert response.outputs["output_ids"].dtype == np.uint32
        assert response.outputs["sequence_length"].dtype == np.int32
        assert response.outputs["output_ids"].shape == (1, 1, len(PROMPTS[0]) + 5)
        ids = response.outputs["output_ids"][0, 0, : response.outputs["sequence_length"][0, 0]].tolist()
        assert ids == hf_greedy(ref, PROMPTS[0], 5)
    model.finalize()


def test_decoupled_model_sends_one_response_per_token_and_flags_the_last(built: dict[str, Any]) -> None:
    family, _src, ckpts, ref = built["gptj"]
    model = TritonPythonModel(FakePbUtils)
    model.initialize({"model_config": json.dumps(_config(family, ckpts[1], 1, streaming=True))})
    assert model.decoupled
    sent_a: list[Any] = []
    sent_b: list[Any] = []
    no_eos = column(10_000, 1, np.uint32)
    a = FakePbUtils.Request(decoder_inputs([PROMPTS[0]], 7, end_id=no_eos), sent_a)
    b = FakePbUtils.Request(decoder_inputs([PROMPTS[1]], 3, end_id=no_eos), sent_b)
    assert model.execute([a, b]) is None
    assert [flags for _r, flags in sent_a] == [0] * 6 + [1]
    assert [flags for _r, flags in sent_b] == [0] * 2 + [1]
    expected = hf_greedy(ref, PROMPTS[0], 7, eos_token_id=None)
    for step, (response, _flags) in enumerate(sent_a, start=1):
        ids, seq = response.outputs["output_ids"], response.outputs["sequence_length"]
        assert ids.shape == (1, 1, len(PROMPTS[0]) + step)
        assert ids[0, 0, : seq[0, 0]].tolist() == expected[: len(PROMPTS[0]) + step]


def test_ft_model_streams_a_whole_batch_request(built: dict[str, Any]) -> None:
    family, _src, ckpts, _ref = built["gptj"]
    ft = FtModel.from_config(_config(family, ckpts[2], 2), device="cpu")
    inputs = decoder_inputs(PROMPTS[:2], 5, end_id=column(10_000, 2, np.uint32))
    replies: list[Any] = []
    ft.stream([inputs], lambda index, reply: replies.append(reply))
    assert [r.final for r in replies] == [False] * 4 + [True]
    whole = ft.infer([inputs])[0].outputs
    assert np.array_equal(replies[-1].outputs["output_ids"], whole["output_ids"])
    assert np.array_equal(replies[-1].outputs["sequence_length"], whole["sequence_length"])


# --------------------------------------------------------------------------- streaming (#16)


@pytest.fixture(scope="module")
def streaming_gptj(built: dict[str, Any]) -> tuple[Any, FtModel]:
    family, _src, ckpts, ref = built["gptj"]
    return ref, FtModel.from_config(_config(family, ckpts[1], 1, streaming=True), device="cpu")


def test_streamed_responses_carry_the_log_probs_of_their_tokens(streaming_gptj: Any) -> None:
    """#16.1: with is_return_log_probs every streamed response (the final one too) has the log
    probabilities of the tokens so far, equal to the unstreamed answer's."""
    _ref, ft = streaming_gptj
    inputs = decoder_inputs(
        [PROMPTS[0]], 5, end_id=column(10_000, 1, np.uint32), is_return_log_probs=column(True, 1, np.bool_)
    )
    replies: list[Any] = []
    ft.stream([inputs], lambda index, reply: replies.append(reply))
    whole = ft.infer([inputs])[0].outputs
    assert [r.final for r in replies] == [False] * 4 + [True]
    final = replies[-1].outputs
    assert (final["output_log_probs"] < 0).all() and final["cum_log_probs"][0, 0] < 0
    np.testing.assert_allclose(final["output_log_probs"], whole["output_log_probs"], rtol=1e-5)
    np.testing.assert_allclose(final["cum_log_probs"], whole["cum_log_probs"], rtol=1e-5)
    for step, reply in enumerate(replies, start=1):  # each partial response: the log probs so far
        np.testing.assert_allclose(
            reply.outputs["output_log_probs"][0, 0, :step], whole["output_log_probs"][0, 0, :step], rtol=1e-5
        )


def test_stream_offsets_mark_where_each_responses_new_tokens_start(streaming_gptj: Any) -> None:
    _ref, ft = streaming_gptj
    inputs = decoder_inputs([PROMPTS[0]], 4, end_id=column(10_000, 1, np.uint32))
    replies: list[Any] = []
    ft.stream([inputs], lambda index, reply: replies.append(reply))
    offsets = [int(r.outputs["ftx_stream_offset"][0, 0]) for r in replies]
    lengths = [int(r.outputs["sequence_length"][0, 0]) for r in replies]
    assert offsets == [len(PROMPTS[0])] + lengths[:-1]
    assert [b - a for a, b in zip(offsets, lengths, strict=True)] == [1, 1, 1, 1]


def test_beam_search_streams_one_response_per_step(streaming_gptj: Any) -> None:
    """#16.7: beam width 2 streams the best running beams each step, then the finished beams."""
    _ref, ft = streaming_gptj
    inputs = decoder_inputs([PROMPTS[1]], 4, end_id=column(10_000, 1, np.uint32), beam_width=column(2, 1, np.uint32))
    replies: list[Any] = []
    ft.stream([inputs], lambda index, reply: replies.append(reply))
    whole = ft.infer([inputs])[0].outputs
    assert [r.final for r in replies] == [False] * 4 + [True]
    for step, reply in enumerate(replies[:-1], start=1):
        assert reply.outputs["output_ids"].shape == (1, 2, len(PROMPTS[1]) + step)
        assert (reply.outputs["output_ids"][0, :, : len(PROMPTS[1])] == PROMPTS[1]).all()
    assert np.array_equal(replies[-1].outputs["output_ids"], whole["output_ids"])


def test_auto_stream_interval_grows_with_the_requests_generated_together(streaming_gptj: Any) -> None:
    """``--stream-interval auto`` (the default; R = 4 responses per step for the whole batch), the CPU reference
    of ftx's backend patch: five requests generated together get the first step, every 2nd and the final reply, each reply
    holding every token so far (the stream offsets say where its new ones start); one request alone, even of five
    rows, gets every step."""
    ref, ft = streaming_gptj
    assert ft.stream_interval.every is None  # the repository's default: auto
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(5)]
    batch = [decoder_inputs([p], 6, end_id=column(10_000, 1, np.uint32)) for p in prompts]
    sent: dict[int, list[Any]] = {}
    ft.stream(batch, lambda index, reply: sent.setdefault(index, []).append(reply))
    for index, prompt in enumerate(prompts):
        replies = sent[index]
        assert [r.final for r in replies] == [False, False, False, True], index
        lengths = [int(r.outputs["sequence_length"][0, 0]) for r in replies]
        assert lengths == [len(prompt) + step for step in (1, 2, 4, 6)]
        assert [int(r.outputs["ftx_stream_offset"][0, 0]) for r in replies] == [len(prompt), *lengths[:-1]]
        assert _tokens(replies[-1].outputs) == hf_greedy(ref, prompt, 6, eos_token_id=None)
    alone: list[Any] = []
    ft.stream([decoder_inputs(prompts, 6, end_id=column(10_000, 5, np.uint32))], lambda _i, reply: alone.append(reply))
    assert [r.final for r in alone] == [False] * 5 + [True]


# --------------------------------------------------------------------------- one request fails alone (#14.3)


POISON = 250
"""A token id no prompt here uses: with ``poisoned_generate`` a generate() call holding it fails."""


def _hostile(prompt: list[int]) -> dict[str, np.ndarray]:
    """A request whose generate() call fails (staged by ``poisoned_generate``)."""
    return decoder_inputs([[POISON, *prompt]], 3)


@pytest.fixture
def poisoned_generate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Staged failure inside generation for any batch holding POISON, in transformers' generate() and in the
    plain-torch decoder (the runtime's default model): every finite, in-range request value decodes now (a
    vanishing temperature is greedy, penalties are bounded), so no real request fails there any more, but a model
    or a device still can."""
    from ftx_triton.runtime.python.torch_model import TorchDecoder
    from transformers.generation.utils import GenerationMixin

    def poisoned(real: Any, ids_of: Any) -> Any:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            ids = ids_of(args, kwargs)
            if ids is not None and (ids == POISON).any():
                raise RuntimeError("staged failure inside generate()")
            return real(self, *args, **kwargs)

        return run

    monkeypatch.setattr(
        GenerationMixin,
        "generate",
        poisoned(GenerationMixin.generate, lambda args, kwargs: kwargs.get("input_ids", args[0] if args else None)),
    )
    monkeypatch.setattr(TorchDecoder, "decode", poisoned(TorchDecoder.decode, lambda args, kwargs: args[0]))


def test_a_request_that_fails_inside_generate_fails_alone(
    gptj: Any, streaming_gptj: Any, poisoned_generate: None
) -> None:
    ref, gen, _spec = gptj
    ft = FtModel(gen, {"output_ids": np.uint32, "sequence_length": np.uint32})
    batch = [decoder_inputs([PROMPTS[0]], 3), _hostile(PROMPTS[1]), decoder_inputs([PROMPTS[2]], 4)]
    replies = ft.infer(batch)
    assert replies[1].error and "generation failed" in replies[1].error and replies[1].kind == "internal"
    for reply, (prompt, n) in ((replies[0], (PROMPTS[0], 3)), (replies[2], (PROMPTS[2], 4))):
        assert reply.error is None
        assert _tokens(reply.outputs) == hf_greedy(ref, prompt, n)
    _ref, streaming = streaming_gptj
    sent: dict[int, list[Any]] = {}
    streaming.stream(batch, lambda index, reply: sent.setdefault(index, []).append(reply))
    assert [r.error is not None for r in sent[1]] == [True]
    for index in (0, 2):
        assert sent[index][-1].final and sent[index][-1].error is None
        assert not any(r.error for r in sent[index])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"temperature": np.array([[np.nan]], np.float32)}, "temperature must be a finite"),
        ({"temperature": np.array([[np.inf]], np.float32)}, "temperature must be a finite"),
        ({"temperature": np.array([[-1.0]], np.float32)}, "temperature must not be negative"),
        ({"repetition_penalty": np.array([[np.nan]], np.float32)}, "repetition_penalty must be a finite"),
        ({"runtime_top_p": np.array([[np.nan]], np.float32)}, "runtime_top_p must be a finite"),
        ({"len_penalty": np.array([[np.inf]], np.float32)}, "len_penalty must be a finite"),
        (
            {"len_penalty": np.array([[1e30]], np.float32), "beam_width": column(2, 1, np.uint32)},
            "len_penalty must be between -10 and 10",
        ),
        ({"len_penalty": np.array([[-11]], np.float32)}, "len_penalty must be between"),
        (
            {"repetition_penalty": np.array([[1e-40]], np.float32)},
            "repetition_penalty must be between 0.0001 and 10000",
        ),
        ({"repetition_penalty": np.array([[1e30]], np.float32)}, "repetition_penalty must be between"),
        ({"beam_search_diversity_rate": np.array([[np.nan]], np.float32)}, "beam_search_diversity_rate"),
        ({"runtime_top_k": np.array([[1000]], np.uint32)}, "runtime_top_k"),
        ({"random_seed": np.array([[-5]], np.int64)}, "random_seed"),
        (
            {
                "request_prompt_lengths": np.array([[4]], np.uint32),
                "request_prompt_embedding": np.zeros((1, 4, 8), np.float16),
            },
            "p-tuning",
        ),
    ],
)
def test_sampling_values_are_checked_finite_and_in_range(change: dict[str, np.ndarray], message: str) -> None:
    inputs = {**decoder_inputs([[1, 2, 3, 4, 5]], 4), **change}
    with pytest.raises(RequestError, match=message):
        parse_request(inputs, LIMITS)


def test_fastertransformer_defaults_from_upstream_clients_are_accepted() -> None:
    """GPT-2's start id 50256 on a small decoder (FT ignores start_id there), any uint64 seed,
    T5's ia3_tasks; a T5 start id outside the vocabulary is still refused."""
    inputs = decoder_inputs(
        [[1, 2, 3]],
        4,
        start_id=column(50256, 1, np.uint32),
        end_id=column(50256, 1, np.uint32),
        random_seed=np.array([[2**64 - 1]], np.uint64),
    )
    request = parse_request(inputs, LIMITS)
    assert request.items[0].sampling.end_id == 50256
    t5 = t5_inputs([[1, 2, 3]], 4, ia3_tasks=np.array([[0]], np.int32))
    assert parse_request(t5, LIMITS, "encoder-decoder").items
    with pytest.raises(RequestError, match="start_id"):
        parse_request({**t5, "start_id": column(50256, 1, np.uint32)}, LIMITS, "encoder-decoder")


def test_request_errors_are_invalid_argument_and_failures_internal(
    built: dict[str, Any], poisoned_generate: None
) -> None:
    """#16.4: a refused request becomes TritonError(INVALID_ARG) — HTTP 400 / gRPC INVALID_ARGUMENT."""
    family, _src, ckpts, _ref = built["gptj"]

    class CodedPbUtils(FakePbUtils):
        class TritonError:
            INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

            def __init__(self, message: str, code: str = "INTERNAL") -> None:
                self.message, self.code = message, code

    model = TritonPythonModel(CodedPbUtils)
    model.initialize({"model_config": json.dumps(_config(family, ckpts[1], 1))})
    bad = CodedPbUtils.Request(decoder_inputs([PROMPTS[1]], 0))
    failing = CodedPbUtils.Request(_hostile(PROMPTS[0]))
    responses = model.execute([bad, failing])
    assert (responses[0].error.code, responses[1].error.code) == ("INVALID_ARG", "INTERNAL")
    model.finalize()


# --------------------------------------------------------------------------- sizes


def test_a_large_batch_runs_as_token_budgeted_generate_calls(gptj: Any) -> None:
    _ref, gen, _spec = gptj
    prompts = [list(PROMPTS[i % 3]) for i in range(6)]
    inputs = decoder_inputs(prompts, 5)
    expected = _run(gen, inputs)
    small = Generator(gen.model, gen.kind, gen.device, replace(gen.limits, max_batch_tokens=2 * (6 + 5)))
    out = _run(small, inputs)
    assert small.groups_run == 3  # two rows of (longest prompt 6 + 5 new tokens) per call
    assert np.array_equal(out["output_ids"], expected["output_ids"])


def test_the_context_size_is_the_source_checkpoints(built: dict[str, Any]) -> None:
    """#14.3: config.ini has no context size, so the rebuilt model got transformers' 2048; the
    source's (carried as max_positions) is what requests are checked against."""
    family, _src, ckpts, _ref = built["gptj"]
    loaded = load_model(family, ckpts[1], device="cpu", max_positions=32)
    assert loaded.config.n_positions == 32
    spec = family.spec_from_ini(loaded.ini)
    gen = Generator.for_model(loaded.model, end_id=spec.end_id, start_id=spec.start_id, max_positions=32)
    with pytest.raises(RequestError, match="exceeds the model's 32 positions"):
        gen.parse(decoder_inputs([PROMPTS[0]], 30))
    assert gen.parse(decoder_inputs([PROMPTS[0]], 20)).items


@pytest.mark.parametrize("value", ["abc", "0", "-5"])
def test_batch_token_budget_from_the_environment_is_checked(
    gptj: Any, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    _ref, gen, spec = gptj
    monkeypatch.setenv("FTX_MAX_BATCH_TOKENS", value)
    with pytest.raises(ConfigError, match=f"FTX_MAX_BATCH_TOKENS={value!r} is not an integer"):
        Generator.for_model(gen.model, end_id=spec.end_id, start_id=spec.start_id)
