"""Special-token ids: a family's declared token strings checked against a checkpoint's tokenizer.

A family declares ``special_tokens = {"bos": "[BOS]", "eos": "[EOS]", "pad": "[PAD]"}``. When the
checkpoint ships a ``tokenizer.json``, the ids FasterTransformer will use (``start_id``/``end_id``,
from config.json's ``bos_token_id``/``eos_token_id``) must be the tokenizer's ids of those strings:
FT stops generating at ``end_id`` and the pre/post-processing models speak the tokenizer's ids.

Rule: the tokenizer wins. A config.json id that disagrees is replaced by the tokenizer's id with a
``token_ids.corrected`` warning (config.json ids are often inherited defaults, e.g. GPT-J's 50256;
the tokenizer is what produced the training data). A declared token the tokenizer does not have is
an error: the tokenizer does not belong to this family. Without a ``tokenizer.json`` nothing is
checked. Only ``tokenizer.json`` is read (plain JSON, no ``tokenizers`` import needed).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from ftx_triton.errors import CheckpointError, ConfigError
from ftx_triton.io.jsonfile import read_json_object

log = structlog.get_logger(__name__)

ROLE_KEYS = {
    "bos": "bos_token_id",
    "eos": "eos_token_id",
    "pad": "pad_token_id",
    "unk": "unk_token_id",
    "sep": "sep_token_id",
    "mask": "mask_token_id",
    "decoder_start": "decoder_start_token_id",
}
"""A special-token role -> the config.json key holding its id."""

TOKENIZER_JSON = "tokenizer.json"


def tokenizer_token_ids(path: Path, tokens: Mapping[str, str]) -> dict[str, int] | None:
    """``{role: id}`` of ``tokens`` (role -> token string) in ``path/tokenizer.json``.

    None when the directory has no tokenizer.json. Raises ConfigError naming the tokens that the
    tokenizer does not know.
    """
    file = path / TOKENIZER_JSON
    if not file.is_file():
        return None
    vocab = _vocabulary(file)
    missing = [f"{role} {token!r}" for role, token in tokens.items() if token not in vocab]
    if missing:
        raise ConfigError(
            f"{file} has no token for {', '.join(missing)}",
            hint="this tokenizer does not belong to the chosen family; check --family, or point --tokenizer "
            "at the model's own tokenizer",
        )
    return {role: vocab[token] for role, token in tokens.items()}


def reconcile_token_ids(
    family: str, tokens: Mapping[str, str], path: Path, hf_config: Mapping[str, Any]
) -> dict[str, Any]:
    """``hf_config`` with the ids of ``tokens`` taken from the checkpoint's tokenizer (see module doc)."""
    config = dict(hf_config)
    ids = tokenizer_token_ids(path, tokens) if tokens else None
    if ids is None:
        return config
    for role, token_id in ids.items():
        key = ROLE_KEYS.get(role, f"{role}_token_id")
        stated = config.get(key)
        if stated is not None and stated != token_id:
            log.warning(
                "token_ids.corrected",
                family=family,
                token=tokens[role],
                config_key=key,
                config_id=stated,
                tokenizer_id=token_id,
            )
        config[key] = token_id
    return config


def _vocabulary(file: Path) -> dict[str, int]:
    """Token string -> id: the added (special) tokens, then the model's own vocabulary."""
    data = read_json_object(file, hint="fetch the tokenizer again")
    vocab: dict[str, int] = {}
    try:
        model_vocab = (data.get("model") or {}).get("vocab")
        if isinstance(model_vocab, dict):  # BPE, WordPiece, WordLevel
            vocab.update({str(k): int(v) for k, v in model_vocab.items()})
        elif isinstance(model_vocab, list):  # Unigram: [[piece, score], ...]
            vocab.update({str(entry[0]): i for i, entry in enumerate(model_vocab)})
        for added in data.get("added_tokens") or ():
            vocab[str(added["content"])] = int(added["id"])
    except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{file} does not hold a tokenizer vocabulary ftx can read ({type(exc).__name__}: {exc})",
            hint="fetch the tokenizer again",
        ) from exc
    return vocab
