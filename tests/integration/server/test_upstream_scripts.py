"""fastertransformer_backend's own client scripts, run unchanged against ftx's python runtime.

The scripts and request files are that project's unmodified sources, read from the directory
``FTX_UPSTREAM_CLIENTS`` names (default: ``../shared/upstream-clients`` beside the repository); the
test skips when it is absent. Only their protocol flags and some of their own size flags are given
(T5 translation and LAMBADA: 3004 sentences of 128 tokens are hours on a CPU; the identity scripts:
8 new tokens instead of 24). What they need is given in this test's environment, never by editing them:

- numpy < 1.24 (they use ``np.bool``): the clients' interpreter ``.venv/clients`` that
  ``scripts/setup.sh --dev`` builds (numpy 1.23 first, then the main environment's packages);
- localhost:8000/8001: each server runs in a private network namespace (``unshare -n``) with its
  scripts, so other tritonservers on the machine keep their ports;
- their working directory: ``tools`` (a link to the sources), the GPT-2 vocabulary LAMBADA reads, a
  small ``lambada_test.jsonl`` and a ``t5-small`` tokenizer directory (the served T5's tokenizer).

Tiny random models carry the real vocabularies (GPT-J: GPT-2's; GPT-NeoX: GPT-NeoX-20B's; KoGPT and T5
are sized to the ids the scripts send), so the scripts' fixed token ids are valid. The scripts print
and swallow errors: every call, streamed ones included, is recorded (``upstream_client_launcher.py``)
and checked here: no errors, raw ids equal transformers' greedy generation, preprocessing ids equal
the tokenizer's, and postprocessing/ensemble text equals decoding those ids. Families: GPT-J, KoGPT,
GPT-NeoX, T5 v1.0 and v1.1 layouts, each over HTTP and gRPC. Time: one server per family (its
``--streaming`` repository served beside it in a second namespace), the scripts forked from one
interpreter that imported their libraries, four at a time.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from python_runtime_support import SERVER_MARKS, build_repository, hf_greedy, reference_model, train_t5_spiece
from repo_paths import REPO, TESTS

CLIENTS = Path(os.environ.get("FTX_UPSTREAM_CLIENTS", REPO.parent / "shared" / "upstream-clients"))
CLIENT_PYTHON = REPO / ".venv" / "clients" / "bin" / "python"
HERE = TESTS  # upstream_client_launcher.py, upstream_namespace_runner.py
PROTOCOLS = ("http", "grpc")
GPT_FILES = (
    "sample_request.json",
    "sample_request_single.json",
    "sample_request_runtime_top_k.json",
    "sample_request_ensemble.json",
)
IDENTITY_SIZE = ("-o", "8")  # new tokens per request (default 24): the identity scripts send 10 batches of 8
PARALLEL = 4  # scripts at once against one server: their start-up and sleeps overlap the server's work
T5_FILES = ("sample_request_single_t5.json", "sample_request_single_t5_ia3.json")


def _namespace_prefix() -> list[str] | None:
    """``unshare -n`` (``-rn`` when not root: a user namespace too), if this machine grants it."""
    if shutil.which("unshare") is None:
        return None
    prefix = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    probe = [*prefix, sys.executable, str(HERE / "upstream_namespace_runner.py"), "--probe"]
    return prefix if subprocess.run(probe, capture_output=True).returncode == 0 else None


NAMESPACE = _namespace_prefix() if (CLIENTS / "tools").is_dir() and CLIENT_PYTHON.is_file() else None

pytestmark = [
    *SERVER_MARKS,
    pytest.mark.skipif(
        not (CLIENTS / "tools" / "issue_request.py").is_file(),
        reason="fastertransformer_backend's client sources are absent (FTX_UPSTREAM_CLIENTS)",
    ),
    pytest.mark.skipif(not CLIENT_PYTHON.is_file(), reason="no clients' interpreter: run scripts/setup.sh --dev"),
    pytest.mark.skipif(NAMESPACE is None, reason="no private network namespace (unshare -n) here"),
]

# --------------------------------------------------------------------------- tiny models with real vocabularies


def _positions(dest: Path, key: str, n: int = 1024) -> None:
    """Room for the scripts' longest request (gptneox_jp_test.py: 500 new tokens); rotary models hold no
    position table, so only the config changes."""
    config = json.loads((dest / "config.json").read_text())
    config[key] = n
    (dest / "config.json").write_text(json.dumps(config))


def _gptj(dest: Path) -> Path:
    from ftx_gptj.tiny import tiny_gptj
    from transformers import GPT2TokenizerFast

    tiny_gptj(
        dest,
        vocab_size=50400,
        tokenizer=False,
        random_init=True,
        seed=3,
        token_ids={"bos_token_id": 50256, "eos_token_id": 50256},
    )
    _positions(dest, "n_positions")
    vocab = CLIENTS / "vocab"
    GPT2TokenizerFast(
        vocab_file=str(vocab / "gpt2-vocab.json"), merges_file=str(vocab / "gpt2-merges.txt")
    ).save_pretrained(dest)
    return dest


def _kogpt(dest: Path) -> Path:
    """KoGPT's layout and ids ([BOS] 0, [EOS] 1, [PAD] 3), its vocabulary size (64512)."""
    from python_runtime_support import tiny_kogpt

    tiny_kogpt(dest, vocab_size=64512)
    _positions(dest, "n_positions")
    return dest


def _gptneox(dest: Path) -> Path:
    from ftx_gptneox.tiny import tiny_gptneox
    from transformers import GPTNeoXTokenizerFast

    tiny_gptneox(dest, vocab_size=50432, tokenizer=False, random_init=True, seed=4)  # <|endoftext|> is 0
    _positions(dest, "max_position_embeddings")
    GPTNeoXTokenizerFast(tokenizer_file=str(CLIENTS / "vocab" / "20B_tokenizer.json")).save_pretrained(dest)
    return dest


def _t5(gated: bool) -> Callable[[Path], Path]:
    def build(dest: Path) -> Path:
        from ftx_t5.tiny import tiny_t5

        train_t5_spiece(dest)
        return tiny_t5(dest, vocab_size=32128, gated=gated, tie_word_embeddings=not gated, seed=5)

    return build


@dataclass(frozen=True)
class Case:
    family: str
    build: Callable[[Path], Path]
    streaming: bool = True

    @property
    def t5(self) -> bool:
        return self.family == "t5"


CASES = {
    "gptj": Case("gptj", _gptj),
    "kogpt": Case("kogpt", _kogpt),
    "gptneox": Case("gptneox", _gptneox),
    "t5-v1_0": Case("t5", _t5(gated=False)),
    "t5-v1_1": Case("t5", _t5(gated=True), streaming=False),
}

# --------------------------------------------------------------------------- running the scripts


def _workdir(tmp: Path, src: Path, case: Case) -> Path:
    """The scripts' working directory: tools, LAMBADA's files, the T5 tokenizer directory."""
    work = tmp / "work"
    work.mkdir()
    (work / "tools").symlink_to(CLIENTS / "tools")
    for name in ("gpt2-vocab.json", "gpt2-merges.txt"):
        (work / name).symlink_to(CLIENTS / "vocab" / name)
    from ftx_triton.tiny import CORPUS

    sentences = [s.strip() + "." for s in CORPUS.split(".") if len(s.split()) > 3][:12]
    (work / "lambada_test.jsonl").write_text("".join(json.dumps({"text": s}) + "\n" for s in sentences))
    if case.t5:
        from transformers import T5Tokenizer, T5TokenizerFast

        for cls in (T5Tokenizer, T5TokenizerFast):
            cls(vocab_file=str(src / "spiece.model")).save_pretrained(work / "t5-small")
    return work


def _jobs(case: Case, work: Path, records: Path, streaming: bool) -> list[dict[str, Any]]:
    """The scripts to run against one repository: the streaming ones for a --streaming repository,
    every other one over HTTP and gRPC otherwise."""
    tools = CLIENTS / "tools"
    jobs: list[dict[str, Any]] = []

    def add(name: str, script: str, *args: str) -> None:
        jobs.append(
            {
                "name": name,
                "script": str(tools / script),
                "args": list(args),
                "cwd": str(work),
                "env": {"PYTHONPATH": str(work), "PYTHONWARNINGS": "ignore"},
                "record": str(records / f"{name}.pkl"),
                "timeout": 600,
            }
        )

    if streaming:
        stream_file = "sample_request_stream_t5.json" if case.t5 else "sample_request_stream.json"
        add("issue_request-stream", "issue_request.py", str(tools / "requests" / stream_file))
        if not case.t5:
            add("gpt_identity_test-stream", "gpt/identity_test.py", "-i", "grpc", "-d", *IDENTITY_SIZE)
        return jobs
    for protocol in PROTOCOLS:
        params = json.dumps({"config": {"protocol": protocol}})
        for request in T5_FILES if case.t5 else GPT_FILES:
            add(
                f"issue_request-{request}-{protocol}",
                "issue_request.py",
                str(tools / "requests" / request),
                "--params",
                params,
            )
        if case.t5:
            add(
                f"t5_end_to_end_test-{protocol}",
                "t5_utils/t5_end_to_end_test.py",
                "-i",
                protocol,
                "-batch",
                "4",
                "-max_ite",
                "2",
            )
            continue
        add(f"identity_test-{protocol}", "identity_test.py", "-i", protocol, *IDENTITY_SIZE)
        add(f"gpt_identity_test-{protocol}", "gpt/identity_test.py", "-i", protocol, *IDENTITY_SIZE)
        add(f"end_to_end_test-{protocol}", "end_to_end_test.py", "-i", protocol)
        add(f"gpt_end_to_end_test-{protocol}", "gpt/end_to_end_test.py", "-i", protocol)
        if case.family == "gptneox":
            add(f"gptneox_jp_test-{protocol}", "gpt/gptneox_jp_test.py", "-i", protocol)
        add(f"gpt_evaluate_lambada-{protocol}", "gpt/evaluate_lambada.py", "-i", protocol, "--number-of-samples", "8")
    if not case.t5:
        add("gpt_identity_test-beam2", "gpt/identity_test.py", "-i", "http", "-beam", "2", *IDENTITY_SIZE)
    return jobs


@dataclass
class Served:
    """One repository's scripts: each one's exit status and output, and the calls it made."""

    results: dict[str, dict[str, Any]]
    records: Path

    def calls(self, name: str) -> list[dict[str, Any]]:
        path = self.records / f"{name}.pkl"
        return pickle.loads(path.read_bytes()) if path.is_file() else []


@dataclass
class Run:
    case: Case
    ref: Any
    codec: Any
    served: Served
    streamed: Served | None
    greedy: dict[tuple[tuple[int, ...], int, int | None], list[int]] = field(default_factory=dict)

    @property
    def results(self) -> dict[str, dict[str, Any]]:
        return self.served.results

    def calls(self, name: str) -> list[dict[str, Any]]:
        return self.served.calls(name)


@dataclass
class _Namespace:
    process: subprocess.Popen[bytes]
    repository: Path
    results: Path
    records: Path
    log: Path


def _start(case: Case, src: Path, tmp: Path, work: Path, streaming: bool) -> _Namespace:
    """Writes the repository, then serves it and runs its scripts in a network namespace of its own."""
    label = "stream" if streaming else "plain"
    home = tmp / f"home-{label}"
    repository = Path(build_repository(src, home, case.family, 1, streaming=streaming).path)
    records = tmp / f"records-{label}"
    records.mkdir()
    jobs = tmp / f"jobs-{label}.json"
    results = tmp / f"results-{label}.json"
    jobs.write_text(
        json.dumps({"results": str(results), "parallel": PARALLEL, "jobs": _jobs(case, work, records, streaming)})
    )
    plan = tmp / f"plan-{label}.json"
    plan.write_text(
        json.dumps(
            {
                "repository": str(repository),
                "home": str(home),
                "name": f"upstream-{case.family}-{label}",
                "python": str(CLIENT_PYTHON),
                "launcher": str(HERE / "upstream_client_launcher.py"),
                "jobs": str(jobs),
                "timeout": 1200,
            }
        )
    )
    assert NAMESPACE is not None
    log = tmp / f"namespace-{label}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*NAMESPACE, sys.executable, str(HERE / "upstream_namespace_runner.py"), str(plan)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return _Namespace(process, repository, results, records, log)


def _finish(namespace: _Namespace) -> Served:
    namespace.process.wait(timeout=1500)
    assert namespace.process.returncode == 0, namespace.log.read_text(errors="replace")[-4000:]
    results = {r["name"]: r for r in json.loads(namespace.results.read_text())}
    return Served(results, namespace.records)


def _stop(namespace: _Namespace | None) -> None:
    """A namespace left running when the other one failed: its runner stops its server on SIGTERM."""
    if namespace is not None and namespace.process.poll() is None:
        namespace.process.terminate()
        namespace.process.wait(timeout=120)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """The reference generations in this process run beside the servers: one thread each, as there
    (torch's thread per core spins against the other processes)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=sorted(CASES))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> Run:
    """One family: its repository (and its --streaming one) served in network namespaces of their own,
    side by side, every script run against them."""
    from ftx_triton.repository.textproc import load_codec

    case = CASES[request.param]
    tmp = tmp_path_factory.mktemp(f"upstream-{request.param}")
    src = case.build(tmp / "hf")
    work = _workdir(tmp, src, case)
    plain = _start(case, src, tmp, work, streaming=False)
    stream = _start(case, src, tmp, work, streaming=True) if case.streaming else None
    try:
        served = _finish(plain)
        streamed = _finish(stream) if stream is not None else None
    finally:
        _stop(plain)
        _stop(stream)
    return Run(case, reference_model(src), load_codec(plain.repository / "preprocessing" / "1"), served, streamed)


# --------------------------------------------------------------------------- checks


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _column(inputs: dict[str, np.ndarray], name: str, b: int, default: Any) -> Any:
    value = inputs.get(name)
    return default if value is None else value.reshape(value.shape[0], -1)[b, 0].item()


def _rows_without_words(inputs: dict[str, np.ndarray], names: tuple[str, ...]) -> list[int]:
    """Rows whose bad/stop word lists are empty (their ids are transformers' plain greedy ones)."""
    batch = next(iter(inputs.values())).shape[0]
    rows = []
    for b in range(batch):
        empty = True
        for name in names:
            value = inputs.get(name)
            if value is None:
                continue
            row = value[b]
            if value.dtype == np.object_:
                empty &= all(not _text(v).strip() for v in row.reshape(-1))
            else:
                empty &= not (row[1] >= 0).any() or int(row[1].max()) <= 0
        if empty:
            rows.append(b)
    return rows


def _greedy(run: Run, prompt: list[int], n: int, end_id: int | None) -> list[int]:
    """transformers' greedy ids (the scripts repeat their requests: each one is generated once)."""
    vocab = int(run.ref.config.vocab_size)
    eos = end_id if end_id is not None else run.ref.config.eos_token_id
    eos = eos if eos is not None and eos < vocab else None
    key = (tuple(prompt), n, eos)
    if key not in run.greedy:
        run.greedy[key] = hf_greedy(run.ref, prompt, n, eos_token_id=eos)
    return run.greedy[key]


def _greedy_row(inputs: dict[str, np.ndarray], b: int) -> bool:
    """FasterTransformer decodes greedily with top-k 1 (whatever top-p keeps of one token), or with
    neither top-k nor top-p."""
    top_k, top_p = _column(inputs, "runtime_top_k", b, 1), _column(inputs, "runtime_top_p", b, 0.0)
    return (top_k == 1 or (top_k == 0 and top_p == 0.0)) and _column(inputs, "beam_width", b, 1) == 1


def _greedy_rows(inputs: dict[str, np.ndarray], word_lists: tuple[str, ...]) -> list[int]:
    """Rows decoded greedily without word lists: transformers' plain greedy ids are theirs."""
    return [b for b in _rows_without_words(inputs, word_lists) if _greedy_row(inputs, b)]


def check_fastertransformer(run: Run, call: dict[str, Any]) -> int:
    """Raw ids of up to two rows against transformers; returns how many rows were compared."""
    inputs, outputs = call["inputs"], call["outputs"]
    ids = inputs["input_ids"]
    checked = 0
    for b in _greedy_rows(inputs, ("bad_words_list", "stop_words_list"))[:2]:
        if run.case.t5:
            prompt = ids[b, : _column(inputs, "sequence_length", b, ids.shape[1])].tolist()
            n = _column(inputs, "max_output_len", b, 0)
        else:
            prompt = ids[b, : _column(inputs, "input_lengths", b, ids.shape[1])].tolist()
            n = _column(inputs, "request_output_len", b, 0)
        got = outputs["output_ids"][b, 0, : int(outputs["sequence_length"].reshape(ids.shape[0], -1)[b, 0])].tolist()
        assert got == _greedy(run, prompt, n, _column(inputs, "end_id", b, None)), (b, prompt)
        checked += 1
    return checked


def check_preprocessing(run: Run, call: dict[str, Any]) -> None:
    out = call["outputs"]
    for b, query in enumerate(call["inputs"]["QUERY"]):
        n = int(out["REQUEST_INPUT_LEN"][b, 0])
        assert out["INPUT_ID"][b, :n].tolist() == run.codec.encode(_text(query[0]), prompt=True)
    assert out["REQUEST_OUTPUT_LEN"].tolist() == call["inputs"]["REQUEST_OUTPUT_LEN"].tolist()
    assert out["BAD_WORDS_IDS"].dtype == np.int32 and out["BAD_WORDS_IDS"].shape[:2] == (len(out["INPUT_ID"]), 2)


def check_postprocessing(run: Run, call: dict[str, Any]) -> None:
    tokens = call["inputs"]["TOKENS_BATCH"]
    lengths = call["inputs"].get("sequence_length")
    texts = call["outputs"]["OUTPUT"].reshape(tokens.shape[0], -1)
    for b in range(tokens.shape[0]):
        end = tokens.shape[-1] if lengths is None else int(lengths.reshape(tokens.shape[0], -1)[b, 0])
        assert texts[b, 0].decode() == run.codec.decode(tokens[b, 0, :end].tolist()), b


def check_ensemble(run: Run, call: dict[str, Any]) -> int:
    """OUTPUT_0 is the decoded greedy sequence of each prompt without word lists; returns rows checked."""
    inputs, outputs = call["inputs"], call["outputs"]
    rows = _greedy_rows(inputs, ("INPUT_2", "INPUT_3"))
    for b in rows[:3]:
        prompt = run.codec.encode(_text(inputs["INPUT_0"][b, 0]), prompt=True)
        expected = _greedy(run, prompt, _column(inputs, "INPUT_1", b, 0), _column(inputs, "end_id", b, None))
        assert outputs["OUTPUT_0"][b, 0].decode() == run.codec.decode(expected), b
        assert int(outputs["sequence_length"].reshape(len(inputs["INPUT_0"]), -1)[b, 0]) == len(expected)
    return min(len(rows), 3)


CHECKS = {
    "fastertransformer": check_fastertransformer,
    "preprocessing": check_preprocessing,
    "postprocessing": check_postprocessing,
    "ensemble": check_ensemble,
}


def _check_script(run: Run, results: dict[str, dict[str, Any]], records: Path, name: str) -> dict[str, int]:
    result = results[name]
    assert result["rc"] == 0, f"{name}: exit {result['rc']}\n{result['stdout'][-3000:]}\n{result['stderr'][-3000:]}"
    for marker in ("Traceback", "InferenceServerException", "StatusCode."):
        assert marker not in result["stdout"] + result["stderr"], f"{name}:\n{result['stdout'][-3000:]}"
    path = records / f"{name}.pkl"
    calls = pickle.loads(path.read_bytes()) if path.is_file() else []
    seen: dict[str, int] = {}
    for call in calls:
        assert "error" not in call, f"{name}: {call['model']}: {call['error']}"
        if "responses" in call:  # a gRPC stream: every response clean, the last one holds the whole answer
            errors = [r["error"] for r in call["responses"] if "error" in r]
            assert call["responses"] and not errors, f"{name}: {call['model']}: {errors or 'no response'}"
            call = {**call, "outputs": call["responses"][-1]["outputs"]}
        checked = CHECKS[call["model"]](run, call)
        seen[call["model"]] = seen.get(call["model"], 0) + (checked or 0) + (checked is None)
    return seen


def _names(run: Run, prefix: str) -> list[str]:
    names = [n for n in run.results if n.startswith(prefix)]
    assert names, f"no {prefix} runs"
    return names


def test_issue_request_with_every_request_file(run: Run) -> None:
    for name in _names(run, "issue_request-"):
        seen = _check_script(run, run.results, run.served.records, name)
        assert seen, f"{name} made no call"
    if not run.case.t5:
        for protocol in PROTOCOLS:
            seen = _check_script(
                run, run.results, run.served.records, f"issue_request-sample_request_ensemble.json-{protocol}"
            )
            assert seen.get("ensemble", 0) >= 1


def test_identity_tests(run: Run) -> None:
    if run.case.t5:
        pytest.skip("identity_test.py drives GPT models")
    for name in (*_names(run, "identity_test-"), *_names(run, "gpt_identity_test-")):
        seen = _check_script(run, run.results, run.served.records, name)
        assert seen.get("fastertransformer", 0) >= (0 if name.endswith("beam2") else 1), name
    beam = run.calls("gpt_identity_test-beam2")
    assert beam and all(c["outputs"]["output_ids"].shape[1] == 2 for c in beam)


def test_end_to_end_tests_call_each_model_then_the_ensemble(run: Run) -> None:
    if run.case.t5:
        pytest.skip("the GPT end-to-end scripts drive GPT models")
    prefixes = ["end_to_end_test-", "gpt_end_to_end_test-"] + (
        ["gptneox_jp_test-"] if run.case.family == "gptneox" else []
    )
    for prefix in prefixes:
        for name in _names(run, prefix):
            seen = _check_script(run, run.results, run.served.records, name)
            models = [c["model"] for c in run.calls(name)]
            assert models == ["preprocessing", "fastertransformer", "postprocessing", "ensemble"], (name, models)
            assert seen["ensemble"] >= 1 and seen["fastertransformer"] >= 1, (name, seen)


def test_evaluate_lambada(run: Run) -> None:
    if run.case.t5:
        pytest.skip("evaluate_lambada.py drives GPT models")
    for name in _names(run, "gpt_evaluate_lambada-"):
        seen = _check_script(run, run.results, run.served.records, name)
        assert seen.get("fastertransformer", 0) >= 1
        assert "last token accuracy" in run.results[name]["stdout"]


def test_t5_end_to_end_translation(run: Run) -> None:
    if not run.case.t5:
        pytest.skip("t5_end_to_end_test.py drives T5")
    for name in _names(run, "t5_end_to_end_test-"):
        seen = _check_script(run, run.results, run.served.records, name)
        assert seen.get("fastertransformer", 0) >= 1
        assert "BLEU score" in run.results[name]["stdout"]


def test_streaming_scripts(run: Run) -> None:
    """issue_request.py's stream file and gpt/identity_test.py -d against the --streaming repository."""
    if run.streamed is None:
        pytest.skip("one T5 layout streams (the other's stream path is the same code)")
    for name in run.streamed.results:
        seen = _check_script(run, run.streamed.results, run.streamed.records, name)
        assert seen.get("fastertransformer", 0) >= 1, (name, seen)
    assert "issue_request-stream" in run.streamed.results
