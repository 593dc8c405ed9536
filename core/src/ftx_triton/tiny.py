"""What tiny, deterministic, offline models are made of, for any family: a built-in corpus, tokenizers trained
on it, seeded random weights, a short deterministic training on the corpus, and saving.

Core names no family here: each family plugin builds its own tiny checkpoints (``ftx_gptj.tiny.tiny_gptj`` …)
and its built-in models (a ``Preset`` with a :class:`~ftx_triton.conversion.family.BuiltinModel`) from these
pieces, reached through :mod:`ftx_triton.plugin_api`. Nothing touches the network. Needs the ``torch`` extra
(imported inside the functions: importing this module is free).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

CORPUS = (
    "The quick brown fox jumps over the lazy dog. "
    "FasterTransformer serves large language models on Triton Inference Server. "
    "A tensor parallel model is split across several GPUs, and every rank holds a slice. "
    "Converting a checkpoint writes one binary file per tensor and rank. "
    "Hello world, this is a tiny model that knows very little about anything. "
    "Once upon a time there was a small language model that wanted to grow. "
)
END_OF_TEXT = "<|endoftext|>"


def train_bpe_tokenizer(
    dest: Path,
    vocab_size: int = 200,
    specials: tuple[str, ...] = (END_OF_TEXT,),
    extra_config: Mapping[str, Any] | None = None,
) -> Any:
    """Train a byte-level BPE tokenizer on a built-in corpus; writes tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS] * 4, trainer=trainer)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(dest / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 2048,
        "bos_token": specials[0],
        "eos_token": specials[0],
        "unk_token": specials[0],
    }
    config.update(extra_config or {})
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tokenizer


def end_of_text_id(dest: Path, vocab_size: int, *, tokenizer: bool) -> int:
    """The end-of-text id of a tiny model's tokenizer, trained into ``dest`` (at most 200 ids, never more than the
    model's ``vocab_size``) when ``tokenizer``; 0 for a model shipped without one."""
    if not tokenizer:
        return 0
    return int(train_bpe_tokenizer(dest, vocab_size=min(vocab_size, 200)).token_to_id(END_OF_TEXT))


def save_model(model: Any, dest: Path, dtype: str = "float32", safetensors: bool = True) -> Path:
    """``model`` in ``dtype`` saved with ``save_pretrained`` into ``dest``."""
    import torch

    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    model = model.to(torch_dtype)
    model.save_pretrained(dest, safe_serialization=safetensors)
    return dest


def seeded(seed: int) -> None:
    """Seed torch's default generator (before a model is built, so its init is reproducible)."""
    import torch

    torch.manual_seed(seed)


def randomize(model: Any, seed: int, std: float = 0.2, *, around_init: bool = False) -> Any:
    """Draw every parameter from N(0, std²), or with ``around_init`` add N(0, std²) to its initial value
    (layernorm scales stay near 1). The default init leaves biases at 0 and layernorms at 1/0, which
    would hide a wrong layout or scaling of those tensors from a test."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():  # a tied parameter is one object: drawn once
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
            if around_init:
                param.add_(noise.to(param.dtype))
            else:
                param.copy_(noise)
    return model


@contextlib.contextmanager
def deterministic_torch() -> Iterator[None]:
    """One CPU thread and deterministic algorithms for the duration of a build."""
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
    sentences = [s.strip() + "." for s in CORPUS.split(".") if s.strip()]
    ids: list[int] = []
    for sentence in sentences:
        ids += tokenizer.encode(" " + sentence if ids else sentence).ids
    return ids + [eos]


def train_causal_lm(
    make_model: Callable[[], Any], ids: list[int], dest: Path, recipe: Mapping[str, Any], pad_id: int
) -> float | None:
    """Build a causal LM with ``make_model()`` under ``recipe["seed"]``, train it on ``ids`` for ``recipe["steps"]``
    AdamW steps of ``recipe["batch"]`` random windows of ``recipe["window"]`` tokens (``recipe["lr"]``), on one
    CPU thread with deterministic algorithms, and save it (safetensors) into ``dest``; the final loss.

    On a given CPU architecture the saved bytes are the same every time."""
    import torch

    r = recipe
    with deterministic_torch():
        torch.manual_seed(r["seed"])
        model = make_model()
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
            model.generation_config.pad_token_id = pad_id
        model.save_pretrained(dest, safe_serialization=True)
    return round(loss.item(), 4) if loss is not None else None
