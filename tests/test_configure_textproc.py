"""ftx.triton.textproc: the logic of the preprocessing/postprocessing models, without a server.

Tokenizers are trained offline here (ftx.tiny). The upstream bugs of ft-format.md §8 that live in
pre/post-processing code are shown absent: #1/#2/#6/#7 (decode honours sequence_length and only
the generated part), #5 (optional word lists, the configured tokenizer, the model's pad id),
#7 (ids from the model, no GPT-2 constants).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ftx.tiny import END_OF_TEXT, train_bpe_tokenizer, train_sentencepiece_tokenizer
from ftx.triton import textproc
from ftx.triton.textproc import Postprocessor, Preprocessor, RequestError, TextSettings, load_codec, word_list

KOGPT_SPECIALS = ("[BOS]", "[EOS]", "[UNK]", "[PAD]", "[MASK]")


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def kogpt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kogpt-tok")
    train_bpe_tokenizer(path, specials=KOGPT_SPECIALS,
                        extra_config={"bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]",
                                      "pad_token": "[PAD]"})
    return path


@pytest.fixture(scope="module")
def spiece_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spiece")
    train_sentencepiece_tokenizer(path)
    return path


def decoder_settings(codec, **changes) -> TextSettings:
    eos = codec.token_id(END_OF_TEXT)
    values = dict(io_kind="decoder", tokenizer_kind="hf", start_id=eos, end_id=eos, pad_id=eos)
    values.update(changes)
    return TextSettings(**values)


def text_batch(*prompts: str) -> np.ndarray:
    return np.array([[p.encode()] for p in prompts], dtype=np.object_)


# --------------------------------------------------------------------------- word lists


def test_word_list_is_ft_format_ids_then_cumulative_offsets(bpe_dir: Path) -> None:
    codec = load_codec(bpe_dir, "hf")
    a, b = codec.encode(" fox", prompt=False), codec.encode(" lazy dog", prompt=False)
    out = word_list([[" fox", " lazy dog"], []], codec)
    assert out.dtype == np.int32 and out.shape == (2, 2, len(a) + len(b))
    assert list(out[0, 0]) == a + b
    assert list(out[0, 1, :2]) == [len(a), len(a) + len(b)] and set(out[0, 1, 2:]) <= {-1}
    # an item without words is FT's "no list": ids 0, offsets -1
    assert set(out[1, 0]) == {0} and set(out[1, 1]) == {-1}


def test_word_list_without_any_word_is_disabled_list(bpe_dir: Path) -> None:
    out = word_list([[], [""]], load_codec(bpe_dir, "hf"))
    assert out.tolist() == [[[0], [-1]], [[0], [-1]]]


# --------------------------------------------------------------------------- preprocessing


def test_preprocessing_without_optional_inputs_fills_ft_defaults(bpe_dir: Path) -> None:
    """§8 #5: BAD/STOP words are optional and really may be omitted."""
    codec = load_codec(bpe_dir, "hf")
    pre = Preprocessor(codec, decoder_settings(codec))
    out = pre.run({"text_input": text_batch("Hello world"), "max_tokens": np.array([[5]], dtype=np.int32)})
    ids = codec.encode("Hello world", prompt=True)
    assert out["input_ids"].dtype == np.uint32 and out["input_ids"].tolist() == [ids]
    assert out["input_lengths"].tolist() == [[len(ids)]] and out["input_lengths"].dtype == np.uint32
    assert out["request_output_len"].tolist() == [[5]] and out["request_output_len"].dtype == np.uint32
    assert out["bad_words_list"].tolist() == [[[0], [-1]]] and out["stop_words_list"].tolist() == [[[0], [-1]]]
    assert out["runtime_top_k"].tolist() == [[0]] and out["runtime_top_p"].tolist() == [[0.0]]  # greedy
    assert out["beam_width"].tolist() == [[1]] and out["temperature"].tolist() == [[1.0]]
    assert out["random_seed"].dtype == np.uint64


def test_preprocessing_pads_with_the_models_pad_id_not_gpt2s(kogpt_dir: Path) -> None:
    """§8 #5/#7: padding uses the configured pad id (KoGPT's [PAD]), never 50256 or a hard-coded 2."""
    codec = load_codec(kogpt_dir, "hf")
    pad = codec.token_id("[PAD]")
    settings = TextSettings("decoder", "hf", start_id=codec.token_id("[BOS]"), end_id=codec.token_id("[EOS]"),
                            pad_id=pad)
    out = Preprocessor(codec, settings).run({"text_input": text_batch("Hello", "The quick brown fox jumps"),
                                            "max_tokens": np.array([[4], [4]], dtype=np.int32)})
    short = int(out["input_lengths"][0, 0])
    assert short < out["input_ids"].shape[1]
    assert set(out["input_ids"][0, short:].tolist()) == {pad}
    assert pad == 3 and 50256 not in out["input_ids"]


def test_preprocessing_encodes_stop_and_bad_words_with_the_configured_tokenizer(kogpt_dir: Path) -> None:
    codec = load_codec(kogpt_dir, "hf")
    pre = Preprocessor(codec, TextSettings("decoder", "hf", 0, 1, 3))
    out = pre.run({"text_input": text_batch("Hello"), "max_tokens": np.array([[3]], dtype=np.int32),
                   "stop": np.array([[b" dog", b""]], dtype=np.object_),
                   "bad_words": np.array([[b" fox"]], dtype=np.object_)})
    assert out["stop_words_list"].tolist() == word_list([[" dog"]], codec).tolist()
    assert out["bad_words_list"].tolist() == word_list([[" fox"]], codec).tolist()


def test_preprocessing_maps_generate_names_to_ft_types(bpe_dir: Path) -> None:
    codec = load_codec(bpe_dir, "hf")
    out = Preprocessor(codec, decoder_settings(codec)).run({
        "text_input": text_batch("Hello"), "max_tokens": np.array([[3]], dtype=np.int32),
        "top_k": np.array([[7]], dtype=np.int32), "top_p": np.array([[0.5]], dtype=np.float32),
        "temperature": np.array([[0.7]], dtype=np.float32), "beam_width": np.array([[2]], dtype=np.int32),
        "random_seed": np.array([[42]], dtype=np.uint64)})
    assert out["runtime_top_k"].dtype == np.uint32 and out["runtime_top_k"].tolist() == [[7]]
    assert out["runtime_top_p"].tolist() == [[0.5]] and out["beam_width"].dtype == np.uint32
    assert out["random_seed"].tolist() == [[42]]
    assert abs(float(out["temperature"][0, 0]) - 0.7) < 1e-6


@pytest.mark.parametrize("name, value, message", [
    ("max_tokens", np.array([[0]], dtype=np.int32), "max_tokens"),
    ("top_p", np.array([[1.5]], dtype=np.float32), "top_p"),
    ("temperature", np.array([[0.0]], dtype=np.float32), "temperature"),
    ("stream", np.array([[True]]), "--streaming"),
])
def test_preprocessing_refuses_bad_request_values(bpe_dir: Path, name: str, value: np.ndarray, message: str) -> None:
    codec = load_codec(bpe_dir, "hf")
    inputs = {"text_input": text_batch("Hello"), "max_tokens": np.array([[3]], dtype=np.int32), name: value}
    with pytest.raises(RequestError, match=message):
        Preprocessor(codec, decoder_settings(codec)).run(inputs)


def test_t5_preprocessing_appends_eos_and_uses_encoder_decoder_names(spiece_dir: Path) -> None:
    codec = load_codec(spiece_dir, "sentencepiece")
    pre = Preprocessor(codec, TextSettings("encoder-decoder", "sentencepiece", start_id=0, end_id=1, pad_id=0))
    out = pre.run({"text_input": text_batch("Hello world", "the lazy dog jumps over the fox"),
                   "max_tokens": np.array([[6], [6]], dtype=np.int32)})
    assert set(out) >= {"input_ids", "sequence_length", "max_output_len"}
    assert "input_lengths" not in out and "request_output_len" not in out
    n = int(out["sequence_length"][0, 0])
    assert out["input_ids"][0, n - 1] == 1  # </s>
    assert set(out["input_ids"][0, n:].tolist()) <= {0}  # <pad>
    assert out["max_output_len"].tolist() == [[6], [6]]


# --------------------------------------------------------------------------- postprocessing


def test_postprocessing_decodes_only_the_generated_part_up_to_sequence_length(bpe_dir: Path) -> None:
    """§8 #1/#2/#6/#7: sequence_length is honoured and the prompt is not returned."""
    codec = load_codec(bpe_dir, "hf")
    prompt = codec.encode("The quick brown", prompt=True)
    generated = codec.encode(" fox jumps", prompt=False)
    junk = codec.encode(" lazy dog", prompt=False)
    row = prompt + generated + junk
    post = Postprocessor(codec, decoder_settings(codec))
    out = post.run({"output_ids": np.array([[row]], dtype=np.uint32),
                    "sequence_length": np.array([[len(prompt) + len(generated)]], dtype=np.uint32),
                    "input_lengths": np.array([[len(prompt)]], dtype=np.uint32)})
    assert out["text_output"].tolist() == [[b" fox jumps"]]


def test_postprocessing_stops_at_the_end_id(bpe_dir: Path) -> None:
    codec = load_codec(bpe_dir, "hf")
    eos = codec.token_id(END_OF_TEXT)
    prompt = codec.encode("Hello", prompt=True)
    row = prompt + codec.encode(" world", prompt=False) + [eos] + codec.encode(" fox", prompt=False)
    texts = Postprocessor(codec, decoder_settings(codec)).texts(np.array([[row]]), np.array([[len(row)]]),
                                                                np.array([[len(prompt)]]))
    assert texts == [[" world"]]


def test_postprocessing_without_prompt_lengths_decodes_the_whole_sequence(bpe_dir: Path) -> None:
    """Streaming ensembles cannot pass input_lengths (Triton rule): the prompt is then included."""
    codec = load_codec(bpe_dir, "hf")
    row = codec.encode("Hello world", prompt=True)
    texts = Postprocessor(codec, decoder_settings(codec)).texts(np.array([[row + [5, 6]]]), np.array([[len(row)]]))
    assert texts == [["Hello world"]]


def test_postprocessing_handles_beams_and_batches(bpe_dir: Path) -> None:
    codec = load_codec(bpe_dir, "hf")
    a, b = codec.encode(" fox", prompt=False), codec.encode(" dog", prompt=False)
    width = max(len(a), len(b)) + 2
    ids = np.zeros((2, 2, width), dtype=np.uint32)
    ids[0, 0, 1:1 + len(a)] = a
    ids[0, 1, 1:1 + len(b)] = b
    ids[1, 0, 1:1 + len(b)] = b
    ids[1, 1, 1:1 + len(a)] = a
    lengths = np.array([[1 + len(a), 1 + len(b)], [1 + len(b), 1 + len(a)]], dtype=np.uint32)
    texts = Postprocessor(codec, decoder_settings(codec)).texts(ids, lengths, np.array([[1], [1]]))
    assert texts == [[" fox", " dog"], [" dog", " fox"]]


def test_t5_postprocessing_decodes_decoder_tokens_only(spiece_dir: Path) -> None:
    codec = load_codec(spiece_dir, "sentencepiece")
    generated = codec.encode("the lazy dog", prompt=False)
    row = generated + [1, 0, 0]  # </s> then padding
    post = Postprocessor(codec, TextSettings("encoder-decoder", "sentencepiece", 0, 1, 0))
    out = post.run({"output_ids": np.array([[row]], dtype=np.int32),
                    "sequence_length": np.array([[len(generated) + 1]], dtype=np.int32),
                    "input_lengths": np.array([[99]], dtype=np.uint32)})  # ignored for T5
    assert out["text_output"].tolist() == [[b"the lazy dog"]]


def test_settings_round_trip_through_model_parameters() -> None:
    settings = TextSettings("decoder", "hf", start_id=0, end_id=1, pad_id=3, streaming=True)
    assert TextSettings.from_parameters(settings.as_parameters()) == settings
    with pytest.raises(textproc.TokenizerLoadError, match="end_id"):
        TextSettings.from_parameters({"io_kind": "decoder", "start_id": "0"})


def test_codec_kinds_and_missing_files(tmp_path: Path, bpe_dir: Path, spiece_dir: Path) -> None:
    assert textproc.detect_kind(bpe_dir) == "hf" and textproc.detect_kind(spiece_dir) == "sentencepiece"
    assert textproc.detect_kind(tmp_path) is None
    with pytest.raises(textproc.TokenizerLoadError, match="no tokenizer"):
        load_codec(tmp_path)


def test_stream_flag_must_match_the_deployment(bpe_dir: Path) -> None:
    codec = load_codec(bpe_dir, "hf")
    base = {"text_input": text_batch("Hello"), "max_tokens": np.array([[3]], dtype=np.int32)}
    streaming = Preprocessor(codec, decoder_settings(codec, streaming=True))
    streaming.run({**base, "stream": np.array([[True]])})
    streaming.run(base)  # stream omitted: fine either way
    with pytest.raises(RequestError, match="generate_stream"):
        streaming.run({**base, "stream": np.array([[False]])})
    Preprocessor(codec, decoder_settings(codec)).run({**base, "stream": np.array([[False]])})
