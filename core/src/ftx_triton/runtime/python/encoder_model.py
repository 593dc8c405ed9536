"""The python runtime's ``encoder`` model: an encoder-decoder checkpoint's encoder alone (``--embeddings``).

The same inputs and output as FasterTransformer's ``T5-Encoder`` model type (``input_ids`` [B, S] right-padded,
``sequence_length`` [B]; ``output_hidden_state`` [B, S, d_model]), computed by transformers' encoder rebuilt
from the deployment's converted files, in float32 whatever the compute type (the reference of the same
math). Positions past a row's length hold what the padded row gives; a reader pools over the length only.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ftx_triton.repository.io import ENCODER_HIDDEN
from ftx_triton.runtime.python.triton_model import (
    DEVICE_ENV,
    FAMILY_PARAMETER,
    numpy_to_tensor,
    parameters_of,
    stub_utils,
    tensor_to_numpy,
)


class EncoderModel:
    """Hidden states for padded id rows (no Triton types here)."""

    def __init__(self, encoder: Any, vocab_size: int, device: Any) -> None:
        self.encoder, self.vocab_size, self.device = encoder, vocab_size, device
        self.lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> EncoderModel:
        from ftx_triton.plugins import load_host
        from ftx_triton.runtime.python.hf_model import load_model

        params = parameters_of(config)
        path, family_name = params.get("model_checkpoint_path"), params.get(FAMILY_PARAMETER)
        if not path or not family_name:
            raise ValueError(f"config.pbtxt of {config.get('name')} lacks model_checkpoint_path or {FAMILY_PARAMETER}")
        loaded = load_model(
            load_host(families_only=True).family(family_name),
            Path(path),
            device=os.environ.get(DEVICE_ENV) or "auto",
            data_type=params.get("data_type"),
        )
        return cls(loaded.model.get_encoder(), int(loaded.config.vocab_size), loaded.device)

    def hidden_states(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """[B, S, d_model] float32 for ``ids`` [B, S] whose row b holds ``lengths[b]`` real tokens; a ValueError
        names what is wrong with a request."""
        import torch

        ids, lengths = np.asarray(ids).reshape(len(ids), -1), np.asarray(lengths).reshape(-1)
        if len(lengths) != len(ids):
            raise ValueError(f"sequence_length has {len(lengths)} rows for {len(ids)} rows of input_ids")
        if np.any(lengths < 1) or np.any(lengths > ids.shape[1]):
            raise ValueError(f"every sequence_length must lie in [1, {ids.shape[1]}] (the padded width)")
        if np.any(ids >= self.vocab_size):
            raise ValueError(f"input_ids hold ids outside the vocabulary [0, {self.vocab_size})")
        mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]
        with self.lock, torch.inference_mode():
            hidden = self.encoder(
                input_ids=torch.from_numpy(ids.astype(np.int64)).to(self.device),
                attention_mask=torch.from_numpy(mask.astype(np.int64)).to(self.device),
            ).last_hidden_state
        return hidden.float().cpu().numpy()


class TritonPythonModel:
    """The Python-backend entry point (``initialize`` / ``execute`` / ``finalize``)."""

    def __init__(self, pb_utils: Any = None) -> None:
        self.pb = pb_utils

    def initialize(self, args: Mapping[str, Any]) -> None:
        self.pb = self.pb or stub_utils()
        self.model = EncoderModel.from_config(json.loads(args["model_config"]))

    def _answer(self, request: Any) -> Any:
        pb = self.pb
        try:
            ids = tensor_to_numpy(pb.get_input_tensor_by_name(request, "input_ids"))
            lengths = tensor_to_numpy(pb.get_input_tensor_by_name(request, "sequence_length"))
            hidden = self.model.hidden_states(ids, lengths)
        except ValueError as exc:
            code = getattr(pb.TritonError, "INVALID_ARG", None)
            error = pb.TritonError(str(exc)) if code is None else pb.TritonError(str(exc), code)
            return pb.InferenceResponse(output_tensors=[], error=error)
        return pb.InferenceResponse(output_tensors=[numpy_to_tensor(pb, ENCODER_HIDDEN, hidden)])

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._answer(request) for request in requests]

    def finalize(self) -> None:
        self.model = None  # type: ignore[assignment]  # released: Triton calls nothing after finalize
