"""A plain-torch decoder (:mod:`.torch_decoder`) built from a converted ``<tp>-gpu`` directory, and its decoding.

The model is made on the meta device (no memory, no initialisation) under the compute dtype, then assigned
the tensors of the FT files through the family's inverted table exactly as :mod:`.hf_model` assigns them to
transformers' model (:func:`~.hf_model.tensors_from_files`: memory-mapped where no cast is needed). Nothing
of transformers is imported: loading the python runtime's model costs ``import torch`` and the files.
:class:`TorchDecoder` decodes greedily or by sampling (beam width 1) with transformers' processors
re-implemented in :mod:`.torch_sampling`, through the token loop :func:`~.decode_loop.decode_steps`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ftx_triton.conversion.family import Family
from ftx_triton.runtime.python.decode_loop import decode_steps, prompt_positions
from ftx_triton.runtime.python.hf_model import (
    LoadedModel,
    check_complete,
    default_dtype,
    log_loaded,
    read_ft_ini,
    resolve_device,
    tensors_from_files,
    torch_dtype,
)

if TYPE_CHECKING:
    from ftx_triton.runtime.python.generation import Sampling


def load_torch_model(
    family: Family,
    ft_dir: Path,
    *,
    device: str = "auto",
    data_type: str | None = None,
    max_positions: int | None = None,
) -> LoadedModel | None:
    """``family``'s model in plain torch from the FT files in ``ft_dir``, or None when no plain module covers
    its configuration (:func:`~.torch_decoder.config_of`): the caller then builds transformers' model."""
    started = time.perf_counter()
    ft_dir = Path(ft_dir)
    ini = read_ft_ini(ft_dir)
    import torch

    from ftx_triton.runtime.python.torch_decoder import ARCHITECTURES, config_of

    config = config_of(family.hf_config_from_ini(ini), max_positions)
    if config is None:
        return None
    target = resolve_device(device)
    dtype = torch_dtype(data_type, target)
    imports_s = time.perf_counter() - started
    with default_dtype(dtype), torch.device("meta"):  # as transformers' model is built (see default_dtype)
        model = ARCHITECTURES[config.model_type](config)
    model.eval().requires_grad_(False)
    tensors = tensors_from_files(family, ft_dir, model.state_dict(keep_vars=True), str, type(model).__name__)
    model.load_state_dict(tensors, strict=False, assign=True)
    check_complete(model, model.state_dict(keep_vars=True), set(tensors), ft_dir)
    model.to(target)
    seconds = time.perf_counter() - started
    log_loaded(family, ft_dir, target, dtype, len(tensors), seconds, imports_s, model=f"torch {config.model_type}")
    return LoadedModel(model, config, target, dtype, ini, seconds, imports_s)


@dataclass
class TorchDecoder:
    """Greedy and sampled decoding (beam width 1) of a plain-torch decoder, as ``generate`` decodes."""

    model: Any  # a torch_decoder.CausalDecoder

    def decode(
        self,
        input_ids: Any,
        attention: Any,
        *,
        max_new: int,
        sampling: Sampling,
        processors: Sequence[Any],
        take: Callable[[list[int], list[float] | None], bool],
        log_probs: bool,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Up to ``max_new`` tokens for the left-padded ``input_ids`` [B, S] (``attention`` its mask), with
        ftx's ``processors``; ``take`` as for :func:`~.decode_loop.decode_steps`."""
        import torch

        from ftx_triton.runtime.python.torch_decoder import KVCache
        from ftx_triton.runtime.python.torch_sampling import logits_chain

        cache = KVCache()
        positions = prompt_positions(attention)
        logits = self.model(input_ids, attention, positions, cache)
        mask, position = attention, positions[:, -1:]

        def advance(tokens: Any, done: int) -> Any:
            nonlocal mask, position
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
            position = position + 1
            return self.model(tokens[:, None], mask, position, cache)

        return decode_steps(
            logits,
            input_ids,
            max_new=max_new,
            chain=logits_chain(sampling, processors),
            sample=sampling.do_sample,
            log_probs=log_probs,
            take=take,
            advance=advance,
        )
