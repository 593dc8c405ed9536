#!/usr/bin/env python
"""What the text path costs: tokens/s through ``text`` (generate extension) vs the raw model.

Builds a synthetic GPT-J (random weights, a small trained tokenizer), runs ftx's pipeline on it with
the python runtime and serves it. Then, for each repeat, alternates the same requests two ways:

- ``raw``:  the prompts' token ids to ``fastertransformer`` over HTTP (``/v2/models/fastertransformer/infer``),
  greedy, the model's own end id;
- ``text``: the same prompts as text to ``POST /v2/models/text/generate`` (preprocessing → the same
  model → postprocessing), greedy.

Both send ``--concurrency`` requests at a time, one prompt each, ``--requests`` in all. Tokens are
counted from the raw answers (greedy: the text path generates the same ones, which is checked by
decoding them). Prints the median tokens/s of both and the ratio text/raw.

    python benchmarks/bench_text_path.py                 # CPU, a few-MB model
    python benchmarks/bench_text_path.py --layers 8 --hidden 1024 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

PROMPTS = (
    "The quick brown fox jumps over",
    "Once upon a time there was",
    "A tensor parallel model is",
    "Hello world, this is",
    "The house is",
    "In the beginning the",
)


def build(tmp: Path, args: argparse.Namespace) -> Path:
    from ftx_gptj.tiny import tiny_gptj
    from ftx_triton.engine.pipeline import Pipeline
    from ftx_triton.plan.settings import RunSettings
    from ftx_triton.plugins import load_host
    from ftx_triton.store.artifact_store import ArtifactStore

    src = tiny_gptj(
        tmp / "src",
        n_layer=args.layers,
        n_embd=args.hidden,
        n_head=args.heads,
        rotary_dim=8,
        vocab_size=args.vocab,
        random_init=True,
        seed=1,
    )
    run = RunSettings.of(str(src), family="gptj", tp=1, runtime="python", until="configure", accept_license=True)
    result = Pipeline(load_host(), ArtifactStore(tmp / "home"), run).run()
    assert result.repository is not None
    return Path(result.repository.path)


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` POSTed to ``url`` through ftx's HTTP client of Triton; the JSON it answers."""
    from urllib.parse import urlsplit

    from ftx_triton.client.text_client import HttpTriton

    parts = urlsplit(url)
    return dict(HttpTriton(f"{parts.scheme}://{parts.netloc}").post_json(parts.path, body))


def raw_request(http: str, ids: list[int], new_tokens: int) -> list[int]:
    """Greedy ids from the raw model (KServe v2 JSON over HTTP): the generated part."""
    inputs = [
        {"name": "input_ids", "datatype": "UINT32", "shape": [1, len(ids)], "data": ids},
        {"name": "input_lengths", "datatype": "UINT32", "shape": [1, 1], "data": [len(ids)]},
        {"name": "request_output_len", "datatype": "UINT32", "shape": [1, 1], "data": [new_tokens]},
    ]
    answer = post(
        f"http://{http}/v2/models/fastertransformer/infer",
        {"inputs": inputs, "outputs": [{"name": "output_ids"}, {"name": "sequence_length"}]},
    )
    out = {o["name"]: o for o in answer["outputs"]}
    length = int(out["sequence_length"]["data"][0])
    return [int(t) for t in out["output_ids"]["data"][len(ids) : length]]


def text_request(http: str, prompt: str, new_tokens: int) -> str:
    return post(f"http://{http}/v2/models/text/generate", {"text_input": prompt, "max_tokens": new_tokens})[
        "text_output"
    ]


def timed(fn: Any, items: list[Any], concurrency: int) -> tuple[float, list[Any]]:
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(fn, items))
    return time.perf_counter() - started, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    from ftx_triton.repository.textproc import load_codec
    from ftx_triton.server.tritonserver import TritonServer

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        repository = build(tmp, args)
        codec = load_codec(repository / "preprocessing" / "1")
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
        ids = [codec.encode(p, prompt=True) for p in prompts]
        with TritonServer(repository, home=tmp / "home", env={"FTX_DEVICE": args.device}, name="bench-text") as server:
            http = server.http_url
            raw_rates, text_rates = [], []
            for repeat in range(args.repeats + 1):  # the first round warms both paths up
                raw_s, generated = timed(lambda i: raw_request(http, i, args.new_tokens), ids, args.concurrency)
                text_s, texts = timed(lambda p: text_request(http, p, args.new_tokens), prompts, args.concurrency)
                tokens = sum(len(g) for g in generated)
                end = codec.token_id("<|endoftext|>")
                expected = [codec.decode(g[: g.index(end)] if end in g else g) for g in generated]
                if texts != expected:
                    sys.exit("the text path generated other text than the raw ids decode to")
                if repeat:
                    raw_rates.append(tokens / raw_s)
                    text_rates.append(tokens / text_s)
    raw, text = statistics.median(raw_rates), statistics.median(text_rates)
    print(
        f"model: GPT-J {args.layers} layers x {args.hidden}, vocab {args.vocab}, device {args.device}; "
        f"{args.requests} requests of {args.new_tokens} new tokens, {args.concurrency} at a time, "
        f"{args.repeats} repeats"
    )
    print(f"raw  fastertransformer  median {raw:9.1f} tokens/s  (runs: {', '.join(f'{r:.1f}' for r in raw_rates)})")
    print(f"text generate           median {text:9.1f} tokens/s  (runs: {', '.join(f'{r:.1f}' for r in text_rates)})")
    print(f"ratio text/raw: {text / raw:.3f}")


if __name__ == "__main__":
    main()
