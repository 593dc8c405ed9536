"""The built-in default model: a tiny GPT-J that knows a few sentences, built offline at first use.

``ensure_demo_checkpoint(home)`` returns ``<home>/builtin/tiny-gptj``: a Hugging Face checkpoint
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json) of about 2 MB. The first
call trains a byte-level BPE tokenizer and a 2-layer GPT-J on :data:`ftx_triton.fetching.tiny.CORPUS` for a fixed
number of steps (a few seconds on one CPU thread), so its greedy continuation of "Once upon a
time" reads as words. Seeds, step count and single-threaded CPU math make the build deterministic
(on a given CPU architecture the bytes are identical every time); it is built in a temporary
directory under a lock and published by one rename, so a killed build leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

DEMO_NAME = "tiny-gptj"
DEMO_VERSION = 1
"""Bump when the recipe changes: an existing build with another version is rebuilt."""
MARKER = "ftx-demo.json"
RECIPE: dict[str, Any] = {
    "vocab_size": 400,
    "n_layer": 2,
    "n_embd": 128,
    "n_head": 4,
    "rotary_dim": 16,
    "n_positions": 256,
    "steps": 60,
    "batch": 16,
    "window": 64,
    "lr": 3e-3,
    "seed": 0,
}


def demo_dir(home: Path) -> Path:
    return Path(home) / "builtin" / DEMO_NAME


def _marker_ok(path: Path) -> bool:
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("version") != DEMO_VERSION or marker.get("recipe") != RECIPE:
        return False
    return all((path / name).is_file() for name in marker.get("files", {}))


DEMO_DISK_BYTES = 16 << 20
"""Room the build needs: the checkpoint (about 2 MB) built beside its final place, with headroom."""


def ensure_demo_checkpoint(home: Path) -> Path:
    """The built-in tiny GPT-J under ``<home>/builtin/tiny-gptj``, built on first use."""
    from ftx_triton.io.atomic import lock_for, publish_dir

    target = demo_dir(home)
    if _marker_ok(target):
        return target
    from ftx_triton.io.atomic import announced
    from ftx_triton.plan.resources import require_disk
    from ftx_triton.terminal.console import status

    require_disk(target.parent, DEMO_DISK_BYTES, f"building the built-in {DEMO_NAME} model")
    with announced(lock_for(target), f"building the built-in {DEMO_NAME} model"):
        if _marker_ok(target):  # another process built it while we waited
            return target
        started = time.perf_counter()
        with (
            status(
                f"building the built-in {DEMO_NAME} model (first use only: trains a tiny GPT-J offline, about 10 s) …"
            ),
            publish_dir(target, replace=True, locked=False) as tmp,
        ):
            build_demo_checkpoint(tmp)
        log.info("demo.built", path=str(target), seconds=round(time.perf_counter() - started, 2))
    return target


@contextlib.contextmanager
def _deterministic_torch() -> Iterator[None]:
    """One CPU thread and deterministic algorithms for the duration of the build."""
    import torch

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def training_ids(tokenizer: Any, eos: int) -> list[int]:
    """The corpus as one token stream: sentences separated by spaces, end-of-text at the end."""
    from ftx_triton.fetching.tiny import CORPUS

    sentences = [s.strip() + "." for s in CORPUS.split(".") if s.strip()]
    ids: list[int] = []
    for sentence in sentences:
        ids += tokenizer.encode(" " + sentence if ids else sentence).ids
    return ids + [eos]


def build_demo_checkpoint(dest: Path) -> Path:
    """Train and save the demo model into ``dest`` (deterministic; offline)."""
    import torch
    from transformers import GPTJConfig, GPTJForCausalLM

    from ftx_triton.fetching.tiny import END_OF_TEXT, train_bpe_tokenizer

    r = RECIPE
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = train_bpe_tokenizer(dest, vocab_size=r["vocab_size"])
    eos = tokenizer.token_to_id(END_OF_TEXT)
    ids = training_ids(tokenizer, eos)
    config = GPTJConfig(
        n_layer=r["n_layer"],
        n_embd=r["n_embd"],
        n_head=r["n_head"],
        rotary_dim=r["rotary_dim"],
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=r["n_positions"],
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    with _deterministic_torch():
        torch.manual_seed(r["seed"])
        model = GPTJForCausalLM(config)
        model.train()
        data = torch.tensor(ids * 3)
        generator = torch.Generator().manual_seed(r["seed"])
        optimizer = torch.optim.AdamW(model.parameters(), lr=r["lr"], weight_decay=0.0)
        window = r["window"]
        loss = None
        for _ in range(r["steps"]):
            starts = torch.randint(0, len(ids), (r["batch"],), generator=generator)
            batch = torch.stack([data[s : s + window] for s in starts.tolist()])
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        if model.generation_config is not None:
            model.generation_config.pad_token_id = eos
        model.save_pretrained(dest, safe_serialization=True)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(dest.iterdir()) if p.is_file()}
    (dest / MARKER).write_text(
        json.dumps(
            {
                "name": DEMO_NAME,
                "version": DEMO_VERSION,
                "recipe": RECIPE,
                "files": files,
                "final_loss": round(loss.item(), 4) if loss is not None else None,
                "description": "tiny GPT-J trained for a few seconds on ftx_triton.fetching.tiny.CORPUS "
                "(built by ftx_triton.fetching.demo)",
            },
            indent=2,
        )
    )
    return dest
