"""The seeds' models at their published shapes, with random weights, for GPU runs and benchmarks.

No download exists on the GPU machines, so each model is its published configuration filled with
random fp16 weights (``transformers``' own initialisation, made on the GPU) and a small tokenizer
trained on the spot. :func:`random_model` builds one, :func:`greedy_ids` decodes with it the way
FasterTransformer does (greedy, no end token, a fixed number of new tokens) so the two can be
compared on the same GPU, and :func:`random_checkpoint` saves one where ``ftx run`` can read it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from ftx_triton.tiny import END_OF_TEXT

SHAPES: dict[str, dict[str, Any]] = {
    # GPT-J-6B: 28 layers x 4096, 16 heads of 256, rotary 64, vocab 50400
    "gptj": {"family": "gptj", "layers": 28, "hidden": 4096, "heads": 16, "rotary": 64, "vocab": 50400, "inter": 16384},
    # KoGPT-6B (ryan1.5b): GPT-J's shape with a vocabulary of 64512 and [BOS]/[EOS]/[PAD] specials
    "kogpt": {
        "family": "kogpt",
        "layers": 28,
        "hidden": 4096,
        "heads": 16,
        "rotary": 64,
        "vocab": 64512,
        "inter": 16384,
    },
    # GPT-NeoX 6.9B (Pythia-6.9B's shape, which h2oGPT's 6.9B models share): 32 x 4096, 32 heads of 128,
    # rotary 25%, vocab 50432, parallel residual
    "gptneox": {
        "family": "gptneox",
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "rotary_pct": 0.25,
        "vocab": 50432,
        "inter": 16384,
    },
    # GPT-NeoX-20B: 44 x 6144, 64 heads of 96, rotary 25%, vocab 50432, parallel residual
    "gptneox-20b": {
        "family": "gptneox",
        "layers": 44,
        "hidden": 6144,
        "heads": 64,
        "rotary_pct": 0.25,
        "vocab": 50432,
        "inter": 24576,
    },
    # GPT-J's layout at a size a CPU makes in a second (checks of the scripts that use the shapes above)
    "gptj-tiny": {"family": "gptj", "layers": 2, "hidden": 64, "heads": 4, "rotary": 8, "vocab": 1000, "inter": 256},
    # T5-3B (v1.0): 24 + 24 layers, d_model 1024, 32 heads of 128, d_ff 16384 (ReLU), vocab 32128, tied
    "t5-3b": {"family": "t5", "layers": 24, "hidden": 1024, "heads": 32, "d_kv": 128, "vocab": 32128, "inter": 16384},
}


def vocab_characters(count: int) -> list[str]:
    """``count`` distinct characters, one per token of a full-vocabulary tokenizer: the CJK ideographs
    (U+4E00..U+9FFF), then CJK extension B (U+20000..): letters that no normalizer or whitespace rule
    touches, so decoding then re-encoding any id sequence gives the same ids."""
    chars = [chr(c) for c in range(0x4E00, 0xA000)] + [chr(c) for c in range(0x20000, 0x2A6E0)]
    if count > len(chars):
        raise ValueError(f"at most {len(chars)} characters, {count} asked")
    return chars[:count]


def char_tokenizer(dest: Path, vocab: int) -> Any:
    """A tokenizer with one character per id for every id of a ``vocab``-sized model (id 0 the end of
    text): a random model's every generated id then decodes to one character and re-encodes to one
    token, so a serving benchmark counts tokens and first text exactly (a small trained tokenizer decodes
    most of a 50k vocabulary to nothing). Writes tokenizer.json and tokenizer_config.json."""
    import json

    from tokenizers import Tokenizer, decoders, models

    ids = {END_OF_TEXT: 0} | {ch: i + 1 for i, ch in enumerate(vocab_characters(vocab - 1))}
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=[]))
    tokenizer.add_special_tokens([END_OF_TEXT])
    tokenizer.decoder = decoders.Fuse()
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(dest / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 2048}
    config |= {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT}
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _config(name: str, dest: Path, full_vocab: bool = False) -> tuple[Any, Any]:  # noqa: C901 - one branch per family
    """(configuration, model class) of ``SHAPES[name]``; trains and writes its tokenizer into ``dest``
    (``full_vocab``: :func:`char_tokenizer` instead, for GPT-J and GPT-NeoX)."""
    import transformers
    from ftx_triton.tiny import train_bpe_tokenizer

    s = SHAPES[name]
    if s["family"] == "t5":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from python_runtime_support import train_t5_spiece

        train_t5_spiece(dest)
        config: Any = transformers.T5Config(
            vocab_size=s["vocab"],
            d_model=s["hidden"],
            d_kv=s["d_kv"],
            d_ff=s["inter"],
            num_layers=s["layers"],
            num_decoder_layers=s["layers"],
            num_heads=s["heads"],
            feed_forward_proj="relu",
            tie_word_embeddings=True,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
        return config, transformers.T5ForConditionalGeneration
    if s["family"] == "kogpt":
        from ftx_kogpt.tiny import train_kogpt_tokenizer

        tok = train_kogpt_tokenizer(dest)
        ids = {"bos_token_id": tok.token_to_id("[BOS]"), "eos_token_id": tok.token_to_id("[EOS]")}
        ids["pad_token_id"] = tok.token_to_id("[PAD]")
    else:
        tok = char_tokenizer(dest, s["vocab"]) if full_vocab else train_bpe_tokenizer(dest)
        eos = tok.token_to_id(END_OF_TEXT)
        ids = {"bos_token_id": eos, "eos_token_id": eos}
    if s["family"] in ("gptj", "kogpt"):
        config = transformers.GPTJConfig(
            n_layer=s["layers"],
            n_embd=s["hidden"],
            n_head=s["heads"],
            rotary_dim=s["rotary"],
            vocab_size=s["vocab"],
            n_inner=s["inter"],
            n_positions=2048,
            tie_word_embeddings=False,
            **ids,
        )
        return config, transformers.GPTJForCausalLM
    config = transformers.GPTNeoXConfig(
        num_hidden_layers=s["layers"],
        hidden_size=s["hidden"],
        num_attention_heads=s["heads"],
        rotary_pct=s["rotary_pct"],
        vocab_size=s["vocab"],
        intermediate_size=s["inter"],
        max_position_embeddings=2048,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        **ids,
    )
    return config, transformers.GPTNeoXForCausalLM


def random_model(name: str, dest: Path, device: str = "cuda", full_vocab: bool = False) -> Any:
    """``SHAPES[name]`` with random fp16 weights, made on ``device`` (fp16 from the start: GPT-NeoX-20B in
    fp32 would not fit one GPU); its tokenizer is written to ``dest``."""
    import torch

    config, cls = _config(name, dest, full_vocab)
    torch.manual_seed(0)
    started = time.perf_counter()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        with torch.device(device):
            model = cls(config)
    finally:
        torch.set_default_dtype(default)
    say(f"shapes    {name}: random model in {time.perf_counter() - started:.1f} s")
    return model.eval()


def save(model: Any, dest: Path) -> Path:
    """Save ``model`` as safetensors in ``dest`` (beside its tokenizer)."""
    started = time.perf_counter()
    model.save_pretrained(dest, safe_serialization=True)
    say(f"shapes    saved in {time.perf_counter() - started:.1f} s -> {dest}")
    return dest


def random_checkpoint(name: str, dest: Path, full_vocab: bool = False, device: str = "cuda") -> Path:
    """A random fp16 checkpoint of ``SHAPES[name]`` made on ``device``, plus a small trained tokenizer
    (``full_vocab``: one character per id, :func:`char_tokenizer`). A checkpoint this function finished
    in ``dest`` before (its marker file) is reused: a GPU job can make it beside the backend build."""
    import torch

    finished = dest / ".random-checkpoint-complete"
    if finished.is_file() and finished.read_text() == f"{name} full_vocab={full_vocab}":
        say(f"shapes    reusing {dest}")
        return dest
    model = random_model(name, dest, device, full_vocab)
    save(model, dest)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    finished.write_text(f"{name} full_vocab={full_vocab}")
    return dest


def greedy_ids(model: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy decoding of every prompt (one batch of equal-length prompts) for exactly ``new_tokens``
    tokens, never stopping at an end token, as FasterTransformer decodes with an end_id outside the
    vocabulary: the generated ids only (for T5 the decoder's, after its start token)."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor(prompts, device=device)
    generated = []
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            encoded = model.get_encoder()(input_ids=ids)
            step = torch.full((len(prompts), 1), model.config.decoder_start_token_id, device=device)
            past = None
            for _ in range(new_tokens):
                out = model(encoder_outputs=encoded, decoder_input_ids=step, past_key_values=past, use_cache=True)
                past, step = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                generated.append(step)
        else:
            step, past = ids, None
            for _ in range(new_tokens):
                out = model(input_ids=step, past_key_values=past, use_cache=True)
                past, step = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                generated.append(step)
    return torch.cat(generated, dim=1).tolist()
