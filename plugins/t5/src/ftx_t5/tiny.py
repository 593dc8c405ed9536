"""Tiny T5 checkpoints built offline for tests (v1.0 relu, or v1.1 gated-gelu with its own LM head). Needs torch
and transformers (imported when built)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftx_triton.plugin_api import tiny


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
    tiny.seeded(seed)
    model = T5ForConditionalGeneration(config).eval()
    if not tie_word_embeddings and model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr():
        _untie_t5_head(model)
    return tiny.save_model(model, dest, dtype, safetensors)


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

    sentences = [s.strip() + "." for s in tiny.CORPUS.split(".") if s.strip()]
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
