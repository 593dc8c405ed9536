"""ftx_triton.repository.textproc: the logic of the preprocessing/postprocessing models, without a server.

Tokenizers are trained offline here (ftx_triton.tiny). The known upstream bugs that live in
pre/post-processing code are shown absent: #1/#2/#6/#7 (decode honours sequence_length and only
the generated part), #5 (optional word lists, the configured tokenizer, the model's pad id),
#7 (ids from the model, no GPT-2 constants).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ftx_kogpt.tiny import train_kogpt_tokenizer
from ftx_t5.tiny import train_sentencepiece_tokenizer
from ftx_triton.repository import textproc
from ftx_triton.repository.textproc import (
    Postprocessor,
    Preprocessor,
    RequestError,
    TextSettings,
    load_codec,
    word_list,
)
from ftx_triton.tiny import END_OF_TEXT, train_bpe_tokenizer


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def kogpt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kogpt-tok")
    train_kogpt_tokenizer(path)
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
    """BAD/STOP words are optional and really may be omitted."""
    codec = load_codec(bpe_dir, "hf")
    pre = Preprocessor(codec, decoder_settings(codec))
    out = pre.run({"text_input": text_batch("Hello world"), "max_tokens": np.array([[5]], dtype=np.int64)})
    ids = codec.encode("Hello world", prompt=True)
    assert out["INPUT_ID"].dtype == np.uint32 and out["INPUT_ID"].tolist() == [ids]
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(ids)]] and out["REQUEST_INPUT_LEN"].dtype == np.uint32
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[5]] and out["REQUEST_OUTPUT_LEN"].dtype == np.uint32
    assert out["BAD_WORDS_IDS"].tolist() == [[[0], [-1]]] and out["STOP_WORDS_IDS"].tolist() == [[[0], [-1]]]
    assert out["runtime_top_k"].tolist() == [[0]] and out["runtime_top_p"].tolist() == [[0.0]]  # greedy
    assert out["beam_width"].tolist() == [[1]] and out["temperature"].tolist() == [[1.0]]
    assert out["random_seed"].dtype == np.uint64


def test_preprocessing_pads_with_the_models_pad_id_not_gpt2s(kogpt_dir: Path) -> None:
    """Padding uses the configured pad id (KoGPT's [PAD]), never 50256 or a hard-coded 2."""
    codec = load_codec(kogpt_dir, "hf")
    pad = codec.token_id("[PAD]")
    settings = TextSettings(
        "decoder", "hf", start_id=codec.token_id("[BOS]"), end_id=codec.token_id("[EOS]"), pad_id=pad
    )
    out = Preprocessor(codec, settings).run(
        {
            "text_input": text_batch("Hello", "The quick brown fox jumps"),
            "max_tokens": np.array([[4], [4]], dtype=np.int64),
        }
    )
    short = int(out["REQUEST_INPUT_LEN"][0, 0])
    assert short < out["INPUT_ID"].shape[1]
    assert set(out["INPUT_ID"][0, short:].tolist()) == {pad}
    assert pad == 3 and 50256 not in out["INPUT_ID"]


def test_preprocessing_encodes_stop_and_bad_words_with_the_configured_tokenizer(kogpt_dir: Path) -> None:
    codec = load_codec(kogpt_dir, "hf")
    pre = Preprocessor(codec, TextSettings("decoder", "hf", 0, 1, 3))
    out = pre.run(
        {
            "text_input": text_batch("Hello"),
            "max_tokens": np.array([[3]], dtype=np.int64),
            "stop": np.array([[b" dog", b""]], dtype=np.object_),
            "bad_words": np.array([[b" fox"]], dtype=np.object_),
        }
    )
    assert out["STOP_WORDS_IDS"].tolist() == word_list([[" dog"]], codec).tolist()
    assert out["BAD_WORDS_IDS"].tolist() == word_list([[" fox"]], codec).tolist()


def test_preprocessing_maps_generate_names_to_ft_types(bpe_dir: Path) -> None:
    codec = load_codec(bpe_dir, "hf")
    out = Preprocessor(codec, decoder_settings(codec)).run(
        {
            "text_input": text_batch("Hello"),
            "max_tokens": np.array([[3]], dtype=np.int64),
            "top_k": np.array([[7]], dtype=np.int32),
            "top_p": np.array([[0.5]], dtype=np.float32),
            "temperature": np.array([[0.7]], dtype=np.float32),
            "beam_width": np.array([[2]], dtype=np.int32),
            "random_seed": np.array([[42]], dtype=np.uint64),
        }
    )
    assert out["runtime_top_k"].dtype == np.uint32 and out["runtime_top_k"].tolist() == [[7]]
    assert out["runtime_top_p"].tolist() == [[0.5]] and out["beam_width"].dtype == np.uint32
    assert out["random_seed"].tolist() == [[42]]
    assert abs(float(out["temperature"][0, 0]) - 0.7) < 1e-6


def _assert_one_value_refused(bpe_dir: Path, name: str, value: np.ndarray, message: str) -> None:
    """A one-prompt generate request with input ``name`` set to ``value`` is refused with ``message``."""
    codec = load_codec(bpe_dir, "hf")
    inputs = {"text_input": text_batch("Hello"), "max_tokens": np.array([[3]], dtype=np.int64), name: value}
    with pytest.raises(RequestError, match=message):
        Preprocessor(codec, decoder_settings(codec)).run(inputs)


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("max_tokens", np.array([[0]], dtype=np.int64), "max_tokens"),
        ("top_p", np.array([[1.5]], dtype=np.float32), "top_p"),
        ("temperature", np.array([[0.0]], dtype=np.float32), "temperature"),
        ("stream", np.array([[True]]), "--streaming"),
    ],
)
def test_preprocessing_refuses_bad_request_values(bpe_dir: Path, name: str, value: np.ndarray, message: str) -> None:
    _assert_one_value_refused(bpe_dir, name, value, message)


def test_t5_preprocessing_appends_eos_under_fastertransformer_backends_names(spiece_dir: Path) -> None:
    codec = load_codec(spiece_dir, "sentencepiece")
    pre = Preprocessor(codec, TextSettings("encoder-decoder", "sentencepiece", start_id=0, end_id=1, pad_id=0))
    out = pre.run(
        {
            "text_input": text_batch("Hello world", "the lazy dog jumps over the fox"),
            "max_tokens": np.array([[6], [6]], dtype=np.int64),
        }
    )
    assert set(out) >= {"INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN"}
    assert "sequence_length" not in out and "max_output_len" not in out  # the ensemble maps the names
    n = int(out["REQUEST_INPUT_LEN"][0, 0])
    assert out["INPUT_ID"][0, n - 1] == 1  # </s>
    assert set(out["INPUT_ID"][0, n:].tolist()) <= {0}  # <pad>
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[6], [6]]


# --------------------------------------------------------------------------- postprocessing


def test_postprocessing_decodes_only_the_generated_part_up_to_sequence_length(bpe_dir: Path) -> None:
    """Sequence_length is honoured and the prompt is not returned."""
    codec = load_codec(bpe_dir, "hf")
    prompt = codec.encode("The quick brown", prompt=True)
    generated = codec.encode(" fox jumps", prompt=False)
    junk = codec.encode(" lazy dog", prompt=False)
    row = prompt + generated + junk
    post = Postprocessor(codec, decoder_settings(codec))
    out = post.run(
        {
            "TOKENS_BATCH": np.array([[row]], dtype=np.uint32),
            "sequence_length": np.array([[len(prompt) + len(generated)]], dtype=np.uint32),
            "REQUEST_INPUT_LEN": np.array([[len(prompt)]], dtype=np.uint32),
        }
    )
    assert out["text_output"].tolist() == [[b" fox jumps"]]


def test_postprocessing_decodes_only_the_outputs_asked_for(bpe_dir: Path) -> None:
    """The text ensemble asks for text_output, the classic one for OUTPUT: one decode each, not two (a
    streamed answer passes through postprocessing once per token)."""
    codec = load_codec(bpe_dir, "hf")
    decoded: list[int] = []
    decode = codec.decode
    codec.decode = lambda ids: decoded.append(len(ids)) or decode(ids)  # type: ignore[method-assign]
    row = codec.encode("The quick brown fox", prompt=True)
    inputs = {"TOKENS_BATCH": np.array([[row]], dtype=np.uint32), "sequence_length": np.array([[len(row)]])}
    post = Postprocessor(codec, decoder_settings(codec))
    assert set(post.run(inputs, ["text_output"])) == {"text_output"} and len(decoded) == 1
    assert set(post.run(inputs, ["OUTPUT"])) == {"OUTPUT"} and len(decoded) == 2
    assert set(post.run(inputs)) >= {"text_output", "OUTPUT"} and len(decoded) == 4  # a direct call: all
    assert set(post.run(inputs, ["output_token_ids"])) == {"output_token_ids", "output_token_log_probs"}
    assert len(decoded) == 4  # ids and log probabilities decode nothing


def test_postprocessing_answers_the_generated_ids_and_their_log_probs(bpe_dir: Path) -> None:
    """#36: the text model answers the best beam's generated ids (up to the end id) and FT's log
    probability of each; a streamed response only its new ones (from the stream offset, FT's
    output_log_probs counting generated positions after the prompt)."""
    codec = load_codec(bpe_dir, "hf")
    settings = decoder_settings(codec)
    prompt, generated = codec.encode("The quick", prompt=True), codec.encode(" brown fox", prompt=False)
    row = [*prompt, *generated, settings.end_id, settings.end_id]
    log_probs = np.array([[[-0.5 - i for i in range(len(generated) + 2)]]], np.float32)
    post = Postprocessor(codec, settings)
    base = {
        "TOKENS_BATCH": np.array([[row]], np.uint32),
        "sequence_length": np.array([[len(row) - 1]], np.uint32),
        "output_log_probs": log_probs,
    }
    whole = post.run({**base, "REQUEST_INPUT_LEN": np.array([[len(prompt)]], np.uint32)})
    assert whole["output_token_ids"].tolist() == [generated]
    assert whole["output_token_log_probs"].tolist() == [log_probs[0, 0, : len(generated)].tolist()]
    offset = len(prompt) + 1  # a stream's second response: the tokens after the first generated one
    piece = post.run(
        {
            **base,
            "sequence_length": np.array([[len(prompt) + 2]], np.uint32),
            "ftx_stream_offset": np.array([[offset]], np.uint32),
            "RESPONSE_INPUT_LENGTHS": np.array([[len(prompt)]], np.int32),
        }
    )
    assert piece["output_token_ids"].tolist() == [generated[1:2]]
    assert piece["output_token_log_probs"].tolist() == [[float(log_probs[0, 0, 1])]]


def test_preprocessing_caps_word_lists_before_tokenizing_them(bpe_dir: Path) -> None:
    """#33.4: stop and bad words (text, FT's CSV lists, banned ids) are limited in number and length."""
    codec = load_codec(bpe_dir, "hf")
    pre = Preprocessor(codec, decoder_settings(codec))
    base = {"text_input": text_batch("Hello"), "max_tokens": np.array([[3]], dtype=np.int64)}
    many = np.array([[b"x"] * (textproc.MAX_WORDS + 1)], dtype=np.object_)
    for change, message in (
        ({"stop": many}, "at most 1024"),
        ({"bad_words": many}, "at most 1024"),
        ({"stop": np.array([[b"y" * (textproc.MAX_WORD_CHARS + 1)]], dtype=np.object_)}, "longer than 512"),
        ({"bad_token_ids": np.arange(textproc.MAX_WORDS + 1, dtype=np.int64)[None]}, "at most 1024"),
        ({"bad_token_ids": np.array([[codec.vocab_size]], np.int64)}, "outside the vocabulary"),
    ):
        with pytest.raises(RequestError, match=message):
            pre.run({**base, **change})
    csv_line = np.array([[(",".join(["a"] * (textproc.MAX_WORDS + 1))).encode()]], dtype=np.object_)
    with pytest.raises(RequestError, match="at most 1024"):
        pre.run(
            {
                "QUERY": text_batch("Hello"),
                "REQUEST_OUTPUT_LEN": np.array([[3]], np.uint32),
                "STOP_WORDS_DICT": csv_line,
            }
        )
    greedy = pre.run({**base, "logprobs": np.array([[True]])})
    assert greedy["runtime_top_p"].tolist() == [[np.float32(textproc.GREEDY_TOP_P)]]
    assert greedy["runtime_top_k"].tolist() == [[0]]
    sampled = pre.run({**base, "logprobs": np.array([[True]]), "top_k": np.array([[5]], np.int64)})
    assert sampled["runtime_top_k"].tolist() == [[5]] and sampled["runtime_top_p"].tolist() == [[0.0]]
    banned = pre.run({**base, "bad_token_ids": np.array([[5, 9, -1]], np.int64)})
    assert banned["BAD_WORDS_IDS"].tolist() == word_list([[]], codec, token_ids=[[5, 9]]).tolist()
    assert banned["is_return_log_probs"].tolist() == [[True]]


def test_postprocessing_stops_at_the_end_id(bpe_dir: Path) -> None:
    codec = load_codec(bpe_dir, "hf")
    eos = codec.token_id(END_OF_TEXT)
    prompt = codec.encode("Hello", prompt=True)
    row = prompt + codec.encode(" world", prompt=False) + [eos] + codec.encode(" fox", prompt=False)
    texts = Postprocessor(codec, decoder_settings(codec)).texts(
        np.array([[row]]), np.array([[len(row)]]), np.array([[len(prompt)]])
    )
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
    ids[0, 0, 1 : 1 + len(a)] = a
    ids[0, 1, 1 : 1 + len(b)] = b
    ids[1, 0, 1 : 1 + len(b)] = b
    ids[1, 1, 1 : 1 + len(a)] = a
    lengths = np.array([[1 + len(a), 1 + len(b)], [1 + len(b), 1 + len(a)]], dtype=np.uint32)
    texts = Postprocessor(codec, decoder_settings(codec)).texts(ids, lengths, np.array([[1], [1]]))
    assert texts == [[" fox", " dog"], [" dog", " fox"]]


def test_t5_postprocessing_decodes_decoder_tokens_only(spiece_dir: Path) -> None:
    codec = load_codec(spiece_dir, "sentencepiece")
    generated = codec.encode("the lazy dog", prompt=False)
    row = generated + [1, 0, 0]  # </s> then padding
    post = Postprocessor(codec, TextSettings("encoder-decoder", "sentencepiece", 0, 1, 0))
    out = post.run(
        {
            "TOKENS_BATCH": np.array([[row]], dtype=np.int32),
            "sequence_length": np.array([[len(generated) + 1]], dtype=np.int32),
            "REQUEST_INPUT_LEN": np.array([[99]], dtype=np.uint32),
        }
    )  # ignored for T5
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
    base = {"text_input": text_batch("Hello"), "max_tokens": np.array([[3]], dtype=np.int64)}
    streaming = Preprocessor(codec, decoder_settings(codec, streaming=True))
    streaming.run({**base, "stream": np.array([[True]])})
    streaming.run(base)  # stream omitted: fine either way
    with pytest.raises(RequestError, match="generate_stream"):
        streaming.run({**base, "stream": np.array([[False]])})
    Preprocessor(codec, decoder_settings(codec)).run({**base, "stream": np.array([[False]])})


# --------------------------------------------------------------------------- streaming pieces (#16)


def _stream_pieces(post: Postprocessor, full: list[int], first: int) -> list[str]:
    """Text_output of each response of a stream that adds one token per response, FT-style (every
    response holds the whole sequence) with the stream offset where its new token starts."""
    pieces = []
    for end in range(first + 1, len(full) + 1):
        out = post.run(
            {
                "TOKENS_BATCH": np.array([[full[:end]]], dtype=np.uint32),
                "sequence_length": np.array([[end]], dtype=np.uint32),
                textproc.STREAM_OFFSET: np.array([[end - 1]], dtype=np.uint32),
            }
        )
        pieces.append(out["text_output"][0, 0].decode())
    return pieces


def test_streamed_responses_carry_each_piece_of_text_once(bpe_dir: Path) -> None:
    """A stream's text_output pieces join to exactly the generated text; no prompt, no repeats."""
    codec = load_codec(bpe_dir, "hf")
    prompt = codec.encode("The quick brown", prompt=True)
    generated = codec.encode(" fox jumps over the lazy dog", prompt=False)
    post = Postprocessor(codec, decoder_settings(codec, streaming=True))
    pieces = _stream_pieces(post, prompt + generated, len(prompt))
    assert len(pieces) == len(generated)
    assert "".join(pieces) == " fox jumps over the lazy dog"
    assert not any("quick" in p for p in pieces)
    # OUTPUT (FasterTransformer's ensemble text) stays the whole sequence
    out = post.run(
        {
            "TOKENS_BATCH": np.array([[prompt + generated]], dtype=np.uint32),
            "sequence_length": np.array([[len(prompt) + len(generated)]], dtype=np.uint32),
            textproc.STREAM_OFFSET: np.array([[len(prompt)]], dtype=np.uint32),
        }
    )
    assert out["OUTPUT"][0, 0].decode() == "The quick brown fox jumps over the lazy dog"


def test_a_character_split_across_tokens_is_streamed_once_complete(bpe_dir: Path) -> None:
    """Byte-level tokens can end inside a UTF-8 character: it is held back, not sent as U+FFFD."""
    codec = load_codec(bpe_dir, "hf")
    byte_ids = [codec.token_id(piece) for piece in ("Ã", "©")]  # "é" = 0xC3 0xA9 in byte-level BPE
    assert None not in byte_ids, "the tiny tokenizer lacks the byte tokens"
    prompt = codec.encode("Caf", prompt=True)
    pieces = _stream_pieces(
        Postprocessor(codec, decoder_settings(codec, streaming=True)), prompt + byte_ids, len(prompt)
    )
    assert pieces == ["", "é"]


def test_t5_stream_pieces_join_to_the_answer(spiece_dir: Path) -> None:
    codec = load_codec(spiece_dir, "sentencepiece")
    generated = codec.encode("the lazy dog sleeps", prompt=False)
    post = Postprocessor(codec, TextSettings("encoder-decoder", "sentencepiece", 0, 1, 0, streaming=True))
    pieces = []
    for end in range(1, len(generated) + 1):
        out = post.run(
            {
                "TOKENS_BATCH": np.array([[generated[:end]]], dtype=np.int32),
                "sequence_length": np.array([[end]], dtype=np.int32),
                textproc.STREAM_OFFSET: np.array([[end - 1]], dtype=np.uint32),
            }
        )
        pieces.append(out["text_output"][0, 0].decode())
    assert "".join(pieces) == "the lazy dog sleeps"


def test_the_stream_offset_name_matches_the_ensembles() -> None:
    from ftx_triton.repository.io import STREAM_OFFSET

    assert textproc.STREAM_OFFSET == STREAM_OFFSET  # textproc is copied into repositories: no ftx import


# --------------------------------------------------------------------------- FasterTransformer's ensemble interface


def test_ft_interface_preprocessing_reads_queries_lengths_and_csv_word_lists(bpe_dir: Path) -> None:
    """INPUT_0..INPUT_3 as upstream's ensemble feeds them: [B, 1] strings, UINT32 lengths, CSV words."""
    codec = load_codec(bpe_dir, "hf")
    pre = Preprocessor(codec, decoder_settings(codec))
    out = pre.run(
        {
            "QUERY": text_batch("The quick brown fox", "Hello"),
            "REQUEST_OUTPUT_LEN": np.array([[24], [24]], dtype=np.uint32),
            "BAD_WORDS_DICT": text_batch("title, title,German, German", ""),
            "STOP_WORDS_DICT": text_batch("", " Olympic Games"),
        }
    )
    same = pre.run(
        {"text_input": text_batch("The quick brown fox", "Hello"), "max_tokens": np.array([[24], [24]], dtype=np.int64)}
    )
    assert np.array_equal(out["INPUT_ID"], same["INPUT_ID"])
    assert out["REQUEST_INPUT_LEN"].tolist() == same["REQUEST_INPUT_LEN"].tolist()
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[24], [24]] and out["REQUEST_OUTPUT_LEN"].dtype == np.uint32
    assert out["BAD_WORDS_IDS"].tolist() == word_list([["title", " title", "German", " German"], []], codec).tolist()
    assert out["STOP_WORDS_IDS"].tolist() == word_list([[], [" Olympic Games"]], codec).tolist()
    with pytest.raises(RequestError, match="INPUT_1"):
        pre.run({"QUERY": text_batch("Hello"), "REQUEST_OUTPUT_LEN": np.array([[0]], dtype=np.uint32)})


# --------------------------------------------------------------------------- hostile values (#14)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("temperature", np.array([[np.nan]], np.float32), "finite"),
        ("temperature", np.array([[np.inf]], np.float32), "finite"),
        ("top_p", np.array([[np.nan]], np.float32), "finite"),
        ("repetition_penalty", np.array([[np.nan]], np.float32), "finite"),
        ("max_tokens", np.array([[2**32 + 5]], np.int64), "too large"),
        ("top_k", np.array([[2**40]], np.int64), "top_k"),
        ("beam_width", np.array([[2**33]], np.int64), "beam_width"),
    ],
)
def test_non_finite_and_out_of_range_values_are_refused(
    bpe_dir: Path, name: str, value: np.ndarray, message: str
) -> None:
    _assert_one_value_refused(bpe_dir, name, value, message)


def test_invalid_utf8_is_a_request_error_without_a_traceback(bpe_dir: Path) -> None:
    codec = load_codec(bpe_dir, "hf")
    pre = Preprocessor(codec, decoder_settings(codec))
    for inputs in (
        {"text_input": np.array([[b"He\xff\xfello"]], dtype=np.object_)},
        {"text_input": text_batch("Hello"), "stop": np.array([[b"\xc3"]], dtype=np.object_)},
        {"QUERY": np.array([[b"\xff"]], dtype=np.object_)},
    ):
        with pytest.raises(RequestError, match="not valid UTF-8"):
            pre.run(
                {"max_tokens": np.array([[3]], np.int64), "REQUEST_OUTPUT_LEN": np.array([[3]], np.uint32), **inputs}
            )


class CountingCodec(textproc.Codec):
    """The real codec, counting the characters it is asked to tokenize (a spy, not a fake)."""

    def __init__(self, codec: textproc.Codec) -> None:
        self.codec, self.chars = codec, 0

    def encode(self, text: str, *, prompt: bool) -> list[int]:
        self.chars += len(text)
        return self.codec.encode(text, prompt=prompt)


def test_an_over_long_prompt_is_refused_after_tokenizing_only_a_prefix(bpe_dir: Path, spiece_dir: Path) -> None:
    codec = CountingCodec(load_codec(bpe_dir, "hf"))
    pre = Preprocessor(codec, decoder_settings(codec.codec, max_prompt_tokens=256))
    with pytest.raises(RequestError, match="longer than the model's context of 256 tokens"):
        pre.run({"text_input": text_batch("a " * 2_000_000), "max_tokens": np.array([[3]], np.int64)})
    assert codec.chars <= (256 + 64) * textproc.PROMPT_CHARS_PER_TOKEN  # not the 4 MB
    with pytest.raises(RequestError, match="context holds 256"):  # just over: found by the full tokenization
        pre.run({"text_input": text_batch("a " * 300), "max_tokens": np.array([[3]], np.int64)})
    # a long prompt that tokenizes short (sentencepiece collapses runs of spaces) is still served
    spiece = load_codec(spiece_dir, "sentencepiece")
    settings = TextSettings("decoder", "sentencepiece", 0, 1, 0, max_prompt_tokens=256)
    out = Preprocessor(spiece, settings).run(
        {"text_input": text_batch("Hello" + " " * 9000 + "world"), "max_tokens": np.array([[3]], np.int64)}
    )
    assert int(out["REQUEST_INPUT_LEN"][0, 0]) < 20


def test_postprocessing_keeps_what_the_tokenizer_makes_of_a_cut_off_character(kogpt_dir: Path) -> None:
    """A response ending inside a multi-byte character (KoGPT's byte-level tokens) keeps the tokenizer's
    '\\ufffd' in text_output and OUTPUT, as FasterTransformer's own postprocessing does."""
    codec = load_codec(kogpt_dir, "hf")
    prompt = codec.encode("Hello", prompt=True)
    word = codec.encode(" 안녕하세요", prompt=False)
    cut = next(n for n in range(1, len(word)) if codec.decode(word[:n]).endswith("\ufffd"))
    expected = codec.decode(word[:cut])
    row = prompt + word[:cut]
    post = Postprocessor(codec, decoder_settings(codec))
    out = post.run(
        {
            "TOKENS_BATCH": np.array([[row]], dtype=np.uint32),
            "sequence_length": np.array([[len(row)]], dtype=np.uint32),
            "REQUEST_INPUT_LEN": np.array([[len(prompt)]], dtype=np.uint32),
        }
    )
    assert expected.endswith("\ufffd")
    assert out["text_output"][0, 0].decode() == expected
    assert out["OUTPUT"][0, 0].decode() == codec.decode(row)


def test_postprocessing_decodes_every_token_when_a_client_sends_the_ids_alone(bpe_dir: Path) -> None:
    """fastertransformer_backend's end_to_end_test.py sends TOKENS_BATCH only: OUTPUT is all of it."""
    codec = load_codec(bpe_dir, "hf")
    row = codec.encode("The quick brown fox", prompt=True)
    out = Postprocessor(codec, decoder_settings(codec)).run({"TOKENS_BATCH": np.array([[row]], dtype=np.uint32)})
    assert out["OUTPUT"].tolist() == [[codec.decode(row).encode()]]
