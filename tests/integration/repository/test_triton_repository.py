"""Generated repositories served by the real tritonserver (nvidia-pytriton wheel) on 127.0.0.1.

For each family (GPT-J, GPT-NeoX, a KoGPT-shaped checkpoint with [BOS]/[EOS]/[PAD] specials, T5
with a sentencepiece model) a tiny checkpoint and a tokenizer are built offline, ``ftx configure``
writes the repository, and the server loads its ``preprocessing`` and ``postprocessing`` models with
explicit model control: text → ids → text round-trips through the server.

The ``fastertransformer`` model itself cannot load here: this machine has no FasterTransformer
backend (the wheel ships the Python backend only) and no GPU. The ensemble is therefore proven
with a stand-in for it: ``FAKE_FT_MODEL_PY``, a Python model with the FT model's exact config
(names, dtypes, ragged batching) that echoes the prompt as its "generation" — and, where ftx's
python runtime is installed, with that runtime's real model.

The known upstream bugs that concern repositories are shown absent (see each test).
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
from ftx_triton.repository.model_config import parse_config
from ftx_triton.repository.textproc import load_codec, word_list
from google.protobuf import text_format

pytestmark = pytest.mark.skipif(find_spec("pytriton") is None, reason="nvidia-pytriton is not installed")

FAMILIES = ("gptj", "gptneox", "kogpt", "t5")
PROMPTS = {
    "gptj": "The quick brown fox jumps over the lazy dog.",
    "gptneox": "Hello world, this is a tiny model.",
    "kogpt": "안녕하세요, 작은 언어 모델입니다. Hello world",
    "t5": "the lazy dog jumps over the quick brown fox",
}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


# --------------------------------------------------------------------------- building


def run_cli(home: Path, *args: str) -> str:
    from click.testing import CliRunner
    from ftx_triton.cli import cli
    from ftx_triton.cli.common import reset_host

    reset_host()
    try:
        # FTX_ACCEPT_LICENSE: the tiny KoGPT stand-in carries KoGPT's non-commercial licence
        result = CliRunner().invoke(
            cli, list(args), env={"FTX_HOME": str(home), "FTX_ACCEPT_LICENSE": "1"}, catch_exceptions=True
        )
    finally:
        reset_host()
    assert result.exit_code == 0, f"{result.stderr}\n{result.exception!r}"
    return result.stdout.strip()


def tiny_source(family: str, dest: Path) -> tuple[Path, tuple[str, ...]]:
    """A tiny checkpoint of ``family`` with its tokenizer, and the configure options it needs."""
    from ftx_gptj.tiny import tiny_gptj
    from ftx_gptneox.tiny import tiny_gptneox
    from ftx_kogpt.tiny import TOKEN_IDS, train_kogpt_tokenizer
    from ftx_t5.tiny import tiny_t5, train_sentencepiece_tokenizer

    if family == "gptj":
        return tiny_gptj(dest), ()
    if family == "gptneox":
        return tiny_gptneox(dest), ()
    if family == "kogpt":
        tiny_gptj(dest, tokenizer=False, token_ids=TOKEN_IDS)
        train_kogpt_tokenizer(dest)
        return dest, ("--family", "kogpt")
    if family == "t5":
        tiny_t5(dest)
        train_sentencepiece_tokenizer(dest)
        return dest, ()
    raise AssertionError(family)


def family_registered(name: str) -> bool:
    from ftx_triton.plugins import load_host

    return name in load_host().families


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ftx-home")


@pytest.fixture(scope="module")
def repositories(home: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Family → a repository written by ``ftx configure`` (families not installed are left out)."""
    repos = {}
    for family in FAMILIES:
        if not family_registered(family):
            continue
        source, extra = tiny_source(family, tmp_path_factory.mktemp(f"src-{family}"))
        out = tmp_path_factory.mktemp(f"repos-{family}") / "repo"
        run_cli(home, "configure", str(source), "--output", str(out), *extra)
        repos[family] = out
    return repos


def repository(repositories: dict[str, Path], family: str) -> Path:
    if family not in repositories:
        pytest.skip(f"family {family} is not installed yet")
    return repositories[family]


# --------------------------------------------------------------------------- serving


class Served:
    """A running server with HTTP helpers (clients closed after each call)."""

    def __init__(self, server) -> None:
        self.server = server

    def infer(self, model: str, arrays: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        import tritonclient.http as httpclient
        from tritonclient.utils import np_to_triton_dtype

        client = httpclient.InferenceServerClient(self.server.http_url)
        try:
            tensors = []
            for name, value in arrays.items():
                tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
                tensor.set_data_from_numpy(value)
                tensors.append(tensor)
            result = client.infer(model, tensors, outputs=[httpclient.InferRequestedOutput(n) for n in outputs])
            return {n: result.as_numpy(n) for n in outputs}
        finally:
            client.close()

    def post(self, path: str, body: dict) -> tuple[int, str]:
        request = urllib.request.Request(
            f"http://{self.server.http_url}{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


def serve(repo: Path, home: Path, models: list[str]) -> Iterator[Served]:
    from ftx_triton.server.tritonserver import TritonServer

    with TritonServer(repo, home=home, model_control="explicit", load_models=models, env=OFFLINE) as server:
        yield Served(server)


@pytest.fixture(scope="module", params=FAMILIES)
def text_models(
    request: pytest.FixtureRequest, repositories: dict[str, Path], home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path, Served]]:
    """One family's whole repository on the real server, from a *copy* of it whose fastertransformer
    model is FAKE_FT_MODEL_PY (the backend needs a GPU; one server per family serves every test here).

    The copy lives elsewhere and tritonserver runs in another working directory, so nothing in the
    repository may depend on where it was written.
    """
    family = request.param
    original = repository(repositories, family)
    moved = with_fake_ft(original, tmp_path_factory.mktemp(f"moved-{family}") / "repo")
    models = ["fastertransformer", "preprocessing", "postprocessing", "text"]
    yield from ((family, moved, served) for served in serve(moved, home, models))


def text(value: str) -> np.ndarray:
    return np.array([[value.encode()]], dtype=np.object_)


def declared_dtype(repo: Path, model: str, tensor: str) -> type[np.generic]:
    """The numpy dtype ``model``'s config.pbtxt declares for its input ``tensor``."""
    from tritonclient.grpc import model_config_pb2 as mc
    from tritonclient.utils import triton_to_np_dtype

    declared = {t.name: t.data_type for t in parse_config(repo / model / "config.pbtxt").input}
    return triton_to_np_dtype(mc.DataType.Name(declared[tensor]).removeprefix("TYPE_"))


def pre_outputs(family: str) -> list[str]:
    """Preprocessing's outputs, by fastertransformer_backend's names (the same for every family)."""
    return [
        "INPUT_ID",
        "REQUEST_INPUT_LEN",
        "REQUEST_OUTPUT_LEN",
        "STOP_WORDS_IDS",
        "BAD_WORDS_IDS",
        "runtime_top_k",
        "beam_width",
    ]


def test_text_round_trips_through_the_server(text_models) -> None:
    """Text → preprocessing → ids (the model's own tokenizer and ids) → postprocessing → the same text."""
    family, repo, served = text_models
    prompt = PROMPTS[family]
    pre = served.infer(
        "preprocessing",
        {"text_input": text(prompt), "max_tokens": np.array([[8]], dtype=np.int64)},
        pre_outputs(family),
    )
    codec = load_codec(repo / "preprocessing" / "1")
    deployment = json.loads((repo / "ftx-deployment.json").read_text())
    ids = pre["INPUT_ID"][0].tolist()
    assert ids == codec.encode(prompt, prompt=True)
    assert pre["INPUT_ID"].dtype == np.uint32
    # optional stop/bad words omitted: FT's "no list"
    assert pre["STOP_WORDS_IDS"].tolist() == [[[0], [-1]]] == pre["BAD_WORDS_IDS"].tolist()
    if family == "t5":
        assert ids[-1] == deployment["tokenizer"]["end_id"] == 1  # </s>, as T5Tokenizer appends it
        assert pre["REQUEST_INPUT_LEN"].tolist() == [[len(ids)]] and pre["REQUEST_OUTPUT_LEN"].tolist() == [[8]]
        # FT's T5 output holds decoder tokens only (INT32): the "generation" is the prompt, then </s> and padding
        row = ids + [0, 0, 0]
        post = served.infer(
            "postprocessing",
            {
                "TOKENS_BATCH": np.array([[row]], dtype=np.int32),
                "sequence_length": np.array([[len(ids)]], dtype=np.int32),
            },
            ["text_output"],
        )
    else:
        n = len(ids)
        assert pre["REQUEST_INPUT_LEN"].tolist() == [[n]] and pre["REQUEST_OUTPUT_LEN"].tolist() == [[8]]
        # FT's decoder output holds the prompt, then the generation, then padding past sequence_length
        junk = codec.encode(" zzz junk after the end", prompt=False)
        row = ids + ids + junk
        post = served.infer(
            "postprocessing",
            {
                "TOKENS_BATCH": np.array([[row]], dtype=np.uint32),
                "sequence_length": np.array([[2 * n]], dtype=declared_dtype(repo, "postprocessing", "sequence_length")),
                "REQUEST_INPUT_LEN": np.array([[n]], dtype=np.uint32),
            },
            ["text_output"],
        )
    assert [[t.decode() for t in r] for r in post["text_output"].tolist()] == [[prompt]]


def test_ids_come_from_the_model_not_gpt2(text_models) -> None:
    """Start/end/pad ids are the model's (KoGPT: [BOS]/[EOS]/[PAD]), padding uses its pad id."""
    family, repo, served = text_models
    deployment = json.loads((repo / "ftx-deployment.json").read_text())
    codec = load_codec(repo / "preprocessing" / "1")
    params = {k: v.string_value for k, v in parse_config(repo / "preprocessing" / "config.pbtxt").parameters.items()}
    expected = {
        "gptj": ("<|endoftext|>",) * 3,
        "gptneox": ("<|endoftext|>",) * 3,
        "kogpt": ("[BOS]", "[EOS]", "[PAD]"),
        "t5": ("<pad>", "</s>", "<pad>"),
    }[family]
    assert [int(params[k]) for k in ("start_id", "end_id", "pad_id")] == [codec.token_id(t) for t in expected]
    assert int(params["end_id"]) == deployment["tokenizer"]["end_id"] != 50256
    out = served.infer(
        "preprocessing",
        {
            "text_input": np.array([[b"Hello"], [PROMPTS[family].encode()]], dtype=np.object_),
            "max_tokens": np.array([[4], [4]], dtype=np.int64),
        },
        pre_outputs(family),
    )
    short = int(out["REQUEST_INPUT_LEN"][0, 0])
    assert set(out["INPUT_ID"][0, short:].tolist()) == {int(params["pad_id"])}


def test_stop_and_bad_words_are_encoded_ft_style_by_the_server(text_models) -> None:
    family, repo, served = text_models
    codec = load_codec(repo / "preprocessing" / "1")
    words = np.array([[b" dog", b" fox"]], dtype=np.object_)
    out = served.infer(
        "preprocessing",
        {
            "text_input": text(PROMPTS[family]),
            "max_tokens": np.array([[4]], np.int64),
            "stop": words,
            "bad_words": np.array([[b" lazy"]], dtype=np.object_),
        },
        pre_outputs(family),
    )
    assert out["STOP_WORDS_IDS"].tolist() == word_list([[" dog", " fox"]], codec).tolist()
    assert out["BAD_WORDS_IDS"].tolist() == word_list([[" lazy"]], codec).tolist()
    assert out["STOP_WORDS_IDS"].dtype == np.int32
    offsets = [o for o in out["STOP_WORDS_IDS"][0, 1].tolist() if o != -1]
    assert offsets == [
        len(codec.encode(" dog", prompt=False)),
        len(codec.encode(" dog", prompt=False)) + len(codec.encode(" fox", prompt=False)),
    ]


def test_postprocessing_honours_sequence_length(text_models) -> None:
    """Decode stops at sequence_length; no prompt lengths are needed."""
    family, repo, served = text_models
    codec = load_codec(repo / "preprocessing" / "1")
    generated = codec.encode(" quick brown", prompt=False)
    junk = codec.encode(" lazy dog", prompt=False)
    # as FasterTransformer returns them: T5 INT32 ids and lengths, GPT-J INT32 lengths, GPT-NeoX UINT32
    post = served.infer(
        "postprocessing",
        {
            "TOKENS_BATCH": np.array(
                [[generated + junk]], dtype=declared_dtype(repo, "postprocessing", "TOKENS_BATCH")
            ),
            "sequence_length": np.array(
                [[len(generated)]], dtype=declared_dtype(repo, "postprocessing", "sequence_length")
            ),
        },
        ["text_output"],
    )
    assert post["text_output"].tolist() == [[codec.decode(generated).encode()]]
    assert "dog" not in post["text_output"][0, 0].decode()


def test_bad_request_values_are_request_errors(text_models) -> None:
    from tritonclient.utils import InferenceServerException

    family, repo, served = text_models
    with pytest.raises(InferenceServerException, match="max_tokens must be at least 1"):
        served.infer(
            "preprocessing", {"text_input": text("Hello"), "max_tokens": np.array([[0]], dtype=np.int64)}, ["INPUT_ID"]
        )


# --------------------------------------------------------------------------- static checks of known upstream bugs


@pytest.mark.parametrize("family", FAMILIES)
def test_repository_is_self_contained(repositories: dict[str, Path], family: str) -> None:
    """Each text model has its own tokenizer copy; no path, download or hub import anywhere."""
    repo = repository(repositories, family)
    for role in ("preprocessing", "postprocessing"):
        version = repo / role / "1"
        files = {p.name for p in version.iterdir() if p.is_file()}
        assert {"model.py", "ftx_textproc.py"} <= files
        assert files & {"tokenizer.json", "spiece.model"}
        config = parse_config(repo / role / "config.pbtxt")
        for key, value in config.parameters.items():
            assert "/" not in value.string_value, f"{role} parameter {key} holds a path"
        for source in ("model.py", "ftx_textproc.py"):
            code = (version / source).read_text()
            for forbidden in ("huggingface_hub", "from_pretrained", "import transformers", "np.bool)", "np.bool "):
                assert forbidden not in code, (source, forbidden)
    pre = parse_config(repo / "preprocessing" / "config.pbtxt")
    assert "PROMPT_LEARNING_TASK_NAME_IDS" not in {o.name for o in pre.output}


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_config_ini_has_no_prompt_learning_keys_and_matches(
    repositories: dict[str, Path], family: str
) -> None:
    """The checkpoint the repository points at has no prompt tables, no '#' comments, right tp."""
    from ftx_triton.formats.ftformat import read_ini
    from ftx_triton.repository.model_config import parameter

    repo = repository(repositories, family)
    ft = parse_config(repo / "fastertransformer" / "config.pbtxt")
    checkpoint = Path(parameter(ft, "model_checkpoint_path"))
    assert checkpoint.is_absolute() and checkpoint.name == f"{parameter(ft, 'tensor_para_size')}-gpu"
    ini = read_ini(checkpoint / "config.ini")
    keys = {k for section in ini.values() for k in section}
    assert not {"num_tasks", "prompt_learning_type"} & keys and not [s for s in ini if s.startswith("task_")]
    assert not [v for section in ini.values() for v in section.values() if "#" in v]
    expected_type = {"gptj": "GPT-J", "kogpt": "GPT-J", "gptneox": "GPT-NeoX", "t5": "T5"}[family]
    assert parameter(ft, "model_type") == expected_type


@pytest.mark.parametrize("family", FAMILIES)
def test_every_config_parses_back_identically(repositories: dict[str, Path], family: str) -> None:
    repo = repository(repositories, family)
    for path in sorted(repo.glob("*/config.pbtxt")):
        config = parse_config(path)
        assert text_format.Parse(text_format.MessageToString(config), type(config)()) == config
        assert config.name == path.parent.name


# --------------------------------------------------------------------------- the ensemble


FAKE_FT_MODEL_PY = '''
"""FAKE fastertransformer model for tests: FT's config, a Python body that echoes the prompt.

Its output mimics FT's layout: decoder models return prompt + "generation" (here: the prompt again,
then the stop words' ids it received) + junk past sequence_length; T5 returns decoder tokens only.
"""
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.t5 = config["parameters"]["model_type"]["string_value"] == "T5"
        # the dtypes the real model returns, as its config declares them
        self.dtypes = {o["name"]: pb_utils.triton_string_to_numpy(o["data_type"]) for o in config["output"]}

    def execute(self, requests):
        responses = []
        for request in requests:
            get = lambda name: pb_utils.get_input_tensor_by_name(request, name)
            ids = get("input_ids").as_numpy()
            lengths = get("sequence_length" if self.t5 else "input_lengths").as_numpy().reshape(-1)
            stops = get("stop_words_list").as_numpy()
            rows, seq = [], []
            for b in range(ids.shape[0]):
                prompt = ids[b, : lengths[b]].tolist()
                offsets = [o for o in stops[b, 1].tolist() if o >= 0]
                stop_ids = stops[b, 0, : offsets[-1]].tolist() if offsets else []
                gen = (prompt[:-1] if self.t5 else prompt) + stop_ids
                row = gen if self.t5 else prompt + gen
                seq.append(len(row))
                rows.append(row + [7, 7, 7])
            width = max(len(r) for r in rows)
            out = np.array([[r + [0] * (width - len(r))] for r in rows], dtype=self.dtypes["output_ids"])
            lengths = np.array(seq, dtype=self.dtypes["sequence_length"]).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("output_ids", out), pb_utils.Tensor("sequence_length", lengths)]))
        return responses
'''


def with_fake_ft(repo: Path, dest: Path) -> Path:
    """A copy of ``repo`` whose fastertransformer model is FAKE_FT_MODEL_PY (same config, python backend)."""
    shutil.copytree(repo, dest)
    path = dest / "fastertransformer" / "config.pbtxt"
    config = parse_config(path)
    config.backend = "python"
    del config.batch_input[:]
    path.write_text(text_format.MessageToString(config))
    (dest / "fastertransformer" / "1" / "model.py").write_text(FAKE_FT_MODEL_PY)
    return dest


def test_text_generate_endpoint_with_a_fake_ft_model(text_models) -> None:
    """POST /v2/models/text/generate with only text_input and max_tokens, then with stop words."""
    family, _, served = text_models
    prompt = PROMPTS[family]
    status, body = served.post("/v2/models/text/generate", {"text_input": prompt, "max_tokens": 16})
    assert status == 200, body
    assert json.loads(body)["text_output"] == prompt  # the echoed "generation", prompt stripped
    status, body = served.post(
        "/v2/models/text/generate",
        {
            "text_input": prompt,
            "max_tokens": 16,
            "stop": [" dog"],
            "temperature": 0.5,
            "top_k": 4,
            "top_p": 0.9,
            "beam_width": 1,
            "random_seed": 7,
        },
    )
    assert status == 200, body
    assert json.loads(body)["text_output"] == prompt + " dog"
    status, body = served.post("/v2/models/text/generate", {"text_input": prompt, "max_tokens": 0})
    assert status == 400 and "max_tokens must be at least 1" in body


def test_ensemble_with_the_python_runtime_generates_like_transformers(
    home: Path, tmp_path: Path, tiny_gptj_dir: Path
) -> None:
    """The whole ensemble with ftx's python runtime as the fastertransformer model (greedy, tiny GPT-J)."""
    pytest.importorskip("ftx_triton.runtime.python.repository")
    import torch
    from tokenizers import Tokenizer
    from transformers import GPTJForCausalLM

    repo = Path(
        run_cli(home, "configure", str(tiny_gptj_dir), "--output", str(tmp_path / "repo"), "--runtime", "python")
    )
    prompt, max_tokens = "The quick brown fox", 6
    tokenizer = Tokenizer.from_file(str(tiny_gptj_dir / "tokenizer.json"))
    ids = tokenizer.encode(prompt).ids
    model = GPTJForCausalLM.from_pretrained(tiny_gptj_dir).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=model.config.eos_token_id
        )
    generated = out[0, len(ids) :].tolist()
    eos = model.config.eos_token_id
    generated = generated[: generated.index(eos)] if eos in generated else generated
    expected = tokenizer.decode(generated, skip_special_tokens=True)  # a cut-off character too, as decoded
    for served in serve(repo, home, ["fastertransformer", "preprocessing", "postprocessing", "text"]):
        status, body = served.post("/v2/models/text/generate", {"text_input": prompt, "max_tokens": max_tokens})
        assert status == 200, body
        assert json.loads(body)["text_output"] == expected


def test_streaming_ensemble_streams_through_generate_stream(home: Path, tmp_path: Path, tiny_gptj_dir: Path) -> None:
    """--streaming: the decoupled model streams through the ensemble (python runtime as the FT model)."""
    pytest.importorskip("ftx_triton.runtime.python.repository")
    repo = Path(
        run_cli(
            home,
            "configure",
            str(tiny_gptj_dir),
            "--output",
            str(tmp_path / "repo"),
            "--runtime",
            "python",
            "--streaming",
        )
    )
    prompt = "Hello world"
    for served in serve(repo, home, ["fastertransformer", "preprocessing", "postprocessing", "text"]):
        status, body = served.post(
            "/v2/models/text/generate_stream", {"text_input": prompt, "max_tokens": 4, "stream": True}
        )
        assert status == 200, body
        events = [json.loads(line[len("data: ") :]) for line in body.splitlines() if line.startswith("data: ")]
        texts = [e["text_output"] for e in events if "text_output" in e]
        assert len(texts) == 4, body  # one response per token
        # each response holds only its new text: no prompt, nothing sent before (#16.2)
        assert not any(t.startswith(prompt) for t in texts if t)


def test_a_repository_that_does_not_stream_gets_no_token_route_and_loads_no_tokenizer(
    repositories: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OpenAI front asks for the token route as it starts (after the server is ready): the model's config says
    it does not stream before the tokenizer is loaded for nothing (a GPT-J tokenizer is a tenth of a second)."""
    from ftx_triton.client.token_stream import TokenRoute
    from ftx_triton.repository import textproc

    loaded: list[object] = []
    real = textproc.Preprocessor.from_directory
    monkeypatch.setattr(textproc.Preprocessor, "from_directory", lambda *a, **k: loaded.append(a) or real(*a, **k))
    assert TokenRoute.open(repository(repositories, "gptj")) is None
    assert loaded == []


@pytest.mark.parametrize("family", FAMILIES)
def test_the_token_routes_whole_answer_is_the_postprocessing_codes_best_beam(
    repositories: dict[str, Path], family: str
) -> None:
    """``TokenRoute.answer`` decodes the best beam's kept ids once (the OpenAI endpoint's cost per request): the same
    text, ids and log probabilities as the ``postprocessing`` model's code gives for that beam (``texts`` of every
    beam, ``tokens`` of the best), for a decoder and for T5, with two beams, an end id and padding after it."""
    from ftx_triton.client.token_stream import TokenRoute
    from ftx_triton.repository.textproc import Postprocessor

    route = TokenRoute.open(repository(repositories, family), streaming_only=False)
    assert route is not None
    end, prompt_len = route.settings.end_id, 3
    rng = np.random.default_rng(5)
    words = route.codec.encode(" café naïve 東京 the end", prompt=False)
    for cut in (None, 4):
        beams = np.array([words[:8] + [7] * 4, words[3:11] + [9] * 4], np.int32)
        if cut is not None:
            beams[0, prompt_len + cut] = end  # generation ends there; what follows is not text
        ids = beams[None]
        outputs = {
            "output_ids": ids,
            "sequence_length": np.array([[10, 12]], np.int32),
            "output_log_probs": rng.normal(size=(1, 2, 12)).astype(np.float32),
        }
        answer = route.answer(outputs, prompt_len)
        post = Postprocessor(route.codec, route.settings)
        prompt = np.full((1, 1), prompt_len, np.int64)
        tokens, probs = post.tokens(ids, outputs["sequence_length"], outputs["output_log_probs"], None, prompt)
        kept = [int(t) for t in tokens[0] if t >= 0]
        assert answer.text == post.texts(ids, outputs["sequence_length"], prompt)[0][0]
        assert answer.token_ids == kept and answer.log_probs == [float(p) for p in probs[0][: len(kept)]]
        assert answer.prompt_tokens == prompt_len
