"""Tiny, deterministic, offline checkpoints and tokenizers (tests, the built-in demo, plugin kits).

Models come from ``transformers`` config classes with seeded random weights; tokenizers are
trained here with ``tokenizers``. Nothing touches the network. Needs the ``torch`` extra.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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


def _save(model: Any, dest: Path, dtype: str, safetensors: bool) -> Path:
    import torch

    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    model = model.to(torch_dtype)
    model.save_pretrained(dest, safe_serialization=safetensors)
    return dest


def _seeded(seed: int) -> None:
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


def tiny_gptj(
    dest: Path,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    rotary_dim: int | None = 8,
    vocab_size: int = 256,
    n_inner: int | None = None,
    dtype: str = "float32",
    safetensors: bool = True,
    tokenizer: bool = True,
    token_ids: Mapping[str, int] | None = None,
    random_init: bool = False,
    seed: int = 0,
) -> Path:
    """A random GPTJForCausalLM saved with save_pretrained (and a trained tokenizer).

    ``token_ids`` overrides config.json ids (``{"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3}``);
    by default bos and eos are the tokenizer's end-of-text id (0 without a tokenizer). ``random_init``
    draws every parameter (biases and layernorms too) at random.
    """
    from transformers import GPTJConfig, GPTJForCausalLM

    eos = 0
    if tokenizer:
        tok = train_bpe_tokenizer(dest, vocab_size=min(vocab_size, 200))
        eos = tok.token_to_id(END_OF_TEXT)
    ids = {"bos_token_id": eos, "eos_token_id": eos, **(token_ids or {})}
    config = GPTJConfig(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        rotary_dim=rotary_dim,
        vocab_size=vocab_size,
        n_inner=n_inner,
        n_positions=256,
        tie_word_embeddings=False,
        **ids,
    )
    _seeded(seed)
    model = GPTJForCausalLM(config).eval()
    return _save(randomize(model, seed) if random_init else model, dest, dtype, safetensors)


def tiny_gptneox(
    dest: Path,
    *,
    num_hidden_layers: int = 2,
    hidden_size: int = 64,
    num_attention_heads: int = 4,
    rotary_pct: float = 0.25,
    use_parallel_residual: bool = True,
    vocab_size: int = 256,
    intermediate_size: int = 256,
    dtype: str = "float32",
    safetensors: bool = True,
    tokenizer: bool = True,
    random_init: bool = False,
    seed: int = 0,
) -> Path:
    """A random GPTNeoXForCausalLM saved with save_pretrained (and a trained tokenizer).

    ``random_init`` draws every parameter (biases and layernorms too) at random.
    """
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    eos = 0
    if tokenizer:
        tok = train_bpe_tokenizer(dest, vocab_size=min(vocab_size, 200))
        eos = tok.token_to_id(END_OF_TEXT)
    config = GPTNeoXConfig(
        num_hidden_layers=num_hidden_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        rotary_pct=rotary_pct,
        use_parallel_residual=use_parallel_residual,
        vocab_size=vocab_size,
        intermediate_size=intermediate_size,
        max_position_embeddings=256,
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    _seeded(seed)
    model = GPTNeoXForCausalLM(config).eval()
    return _save(randomize(model, seed) if random_init else model, dest, dtype, safetensors)


def tiny_t5(
    dest: Path,
    *,
    d_model: int = 64,
    d_kv: int = 16,
    num_heads: int = 4,
    d_ff: int = 128,
    num_layers: int = 2,
    num_decoder_layers: int | None = None,
    gated: bool = False,
    tie_word_embeddings: bool = True,
    vocab_size: int = 256,
    dtype: str = "float32",
    safetensors: bool = True,
    seed: int = 0,
) -> Path:
    """A random T5ForConditionalGeneration (v1.0 relu, or v1.1 gated-gelu)."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        d_model=d_model,
        d_kv=d_kv,
        num_heads=num_heads,
        d_ff=d_ff,
        num_layers=num_layers,
        num_decoder_layers=num_decoder_layers,
        vocab_size=vocab_size,
        feed_forward_proj="gated-gelu" if gated else "relu",
        tie_word_embeddings=tie_word_embeddings,
        relative_attention_num_buckets=32,
        decoder_start_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    _seeded(seed)
    model = T5ForConditionalGeneration(config).eval()
    if not tie_word_embeddings and model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr():
        _untie_t5_head(model)
    return _save(model, dest, dtype, safetensors)


def _untie_t5_head(model: Any) -> None:
    """Give a T5 its own LM head, as T5 v1.1 checkpoints have. transformers 5 builds every T5 tied
    (its config forces ``tie_word_embeddings``, keeping the flag only to choose decoder-output scaling)
    yet loads a checkpoint whose head differs from ``shared`` untied; this writes such a checkpoint."""
    import torch

    head = model.lm_head.weight
    model.lm_head.weight = torch.nn.Parameter(torch.randn(head.shape, dtype=head.dtype) * float(head.detach().std()))
    model.config.tie_word_embeddings = False
    if hasattr(model.config, "scale_decoder_outputs"):
        model.config.scale_decoder_outputs = False  # untied T5 (v1.1) does not scale the decoder output


def train_sentencepiece_tokenizer(dest: Path, vocab_size: int = 120, model_type: str = "unigram") -> Any:
    """Train a T5-style sentencepiece model on the built-in corpus; writes spiece.model + tokenizer_config.json.

    Ids follow T5: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, no ``<s>``. Returns the loaded processor.
    """
    import io

    import sentencepiece

    sentences = [s.strip() + "." for s in CORPUS.split(".") if s.strip()]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences * 8),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        pad_piece="<pad>",
        eos_piece="</s>",
        unk_piece="<unk>",
        hard_vocab_limit=False,
        character_coverage=1.0,
        minloglevel=2,
    )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "spiece.model").write_bytes(model.getvalue())
    config = {
        "tokenizer_class": "T5Tokenizer",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "model_max_length": 512,
        "extra_ids": 0,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(model.getvalue())
    return processor
