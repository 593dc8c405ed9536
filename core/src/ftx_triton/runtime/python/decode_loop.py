"""A lean decode loop for the python runtime on a GPU: one prefill, then one-token forwards on a static KV cache.

``transformers``' ``generate`` spends host time on every step (stopping criteria, cache bookkeeping and a
read of ``unfinished_sequences.max()`` that waits for the GPU), so a 6B model on an H100 decodes at about
half its memory-bandwidth bound. This loop keeps the GPU fed:

* the prompt (left-padded) runs once through the model's forward with a ``StaticCache`` of
  ``prompt + new tokens`` rounded up to :data:`CACHE_ROUND` positions;
* each step then feeds the new token with its position (``attention_mask.cumsum() - 1``, as ``generate``
  computes it) and cache position, applies transformers' own logits processors for the request's settings
  (``_get_logits_processor`` of a ``GenerationConfig`` built like ``generate``'s, plus ftx's presence penalty
  and bad words) to the float32 logits, and picks the token (argmax, or ``multinomial`` of the softmax), all
  on the device: sampled ids are the ones ``generate`` draws for the same seed;
* the host reads the new tokens only every few steps (1, 2, 4 … up to :data:`CHECK_EVERY`), hands them to
  the streamer step by step (a sink still gets one call per step, with every token) and stops once every
  row has finished (end id, stop word or its own length); tokens a row generated after its end are cut by
  the same finishing rules as ``generate``'s output.

How the one-token forward runs is the mode (``FTX_PYTHON_COMPILE``, CUDA only; see :func:`decode_mode`):
``lean`` calls it eagerly; ``graph`` captures it once per batch size and cache length in a
``torch.cuda.CUDAGraph`` with static input buffers (eager's aten kernels, replayed without launch costs);
``cudagraphs`` and ``inductor`` hand it to ``torch.compile`` (its ``cudagraphs`` backend, or inductor's
``reduce-overhead`` mode, whose fused kernels round fp16 differently from eager's). These attend over the
whole static cache with a mask, where ``generate`` attends over the tokens so far, without a mask when
nothing is padded: transformers' SDPA path may then pick another kernel, with other fp16 rounding.
``exact`` (the default on CUDA) keeps ``generate``'s attention: a ``DynamicCache`` whose layers are views of fixed buffers, as
long as the tokens cached so far, and one CUDA graph per (cached tokens, batch padded or not), captured the
first time that length comes (the mask decision ``generate`` makes by reading the mask is the host's during
a capture). A capture or compile that fails is logged (``runtime.decode_step_fallback``) and that batch
shape decodes eagerly.

Beam search, encoder-decoder models (T5) and models without a static cache keep using ``generate``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from ftx_triton.errors import ConfigError

log = structlog.get_logger(__name__)

COMPILE_ENV = "FTX_PYTHON_COMPILE"
EAGER = "eager"
"""``generate`` with a dynamic cache, every kernel eager (always on CPU)."""
TRANSFORMERS_STATIC = "transformers"
"""``generate`` with ``cache_implementation="static"``: transformers compiles the forward (inductor)."""
LEAN = "lean"
GRAPH = "graph"
EXACT = "exact"
CUDA_DEFAULT = EXACT
"""The mode on a CUDA device when ``FTX_PYTHON_COMPILE`` is unset: eager's ids, greedy and sampled, at 4-5x its
tokens/s (GPT-J-6B shape on one H100)."""
CUDAGRAPHS = "cudagraphs"
INDUCTOR = "inductor"
LOOP_MODES = (LEAN, GRAPH, EXACT, CUDAGRAPHS, INDUCTOR)
"""Modes that decode with :class:`LeanDecoder`."""
MODES = (EAGER, TRANSFORMERS_STATIC, *LOOP_MODES)
ALIASES = {"0": EAGER, "1": TRANSFORMERS_STATIC}

CHECK_EVERY = 16
"""Most steps between two reads of the new tokens on the host."""
CACHE_ROUND = 64
"""Static caches hold a multiple of this many positions, so requests of similar lengths share a graph."""
GRAPHS_KEPT = 2
"""Captured (batch, cache length) shapes kept at once; each holds its own KV cache."""


def decode_mode(device: Any) -> str:
    """How decoding runs on ``device``: ``FTX_PYTHON_COMPILE`` (one of :data:`MODES`; ``0`` = eager, ``1`` =
    transformers; unset = :data:`CUDA_DEFAULT`) on a CUDA device, eager elsewhere (compiling costs more on a CPU
    than it saves). The value is checked on every device, so a typo is refused at start."""
    import os

    raw = os.environ.get(COMPILE_ENV, "").strip().lower()
    mode = ALIASES.get(raw, raw) or CUDA_DEFAULT
    if mode not in MODES:
        raise ConfigError(
            f"{COMPILE_ENV}={raw!r} is not a decoding mode",
            hint=f"set {COMPILE_ENV} to one of {', '.join(MODES)} (0 = eager, 1 = transformers), or unset it",
        )
    return mode if getattr(device, "type", str(device)) == "cuda" else EAGER


def cache_length(prompt: int, new_tokens: int) -> int:
    """Positions of the static cache for a prompt of ``prompt`` tokens and ``new_tokens`` to generate."""
    total = prompt + new_tokens
    return -(-total // CACHE_ROUND) * CACHE_ROUND


@dataclass
class _Shape:
    """A static KV cache and the one-token step's input buffers for one (batch, cache length)."""

    cache: Any
    ids: Any  # int64 [B, 1]
    positions: Any  # int64 [B, 1]
    cache_position: Any  # int64 [1]
    mask: Any  # int64 [B, cache_len]
    step: Callable[[], Any] | None = None  # → float logits [B, V] of the buffers' token
    graph: Any = None
    logits: Any = None  # the captured graph's output
    lengths: dict[tuple[int, bool], Any] = field(default_factory=dict)
    """``exact``: a graph per (cached tokens, batch without padding), each writing its logits to ``logits``."""
    pool: Any = None  # ``exact``: the memory pool its graphs share (they run one at a time)
    eager_only: bool = False  # ``exact``: a capture failed, this shape decodes eagerly


@dataclass
class LeanDecoder:
    """Decodes left-padded decoder prompts step by step on a static cache (see the module docstring)."""

    model: Any
    mode: str = LEAN
    shapes: OrderedDict[tuple[int, int], _Shape] = field(default_factory=OrderedDict)
    fallbacks: list[str] = field(default_factory=list)
    """Why a shape decodes eagerly in a graph or compile mode (capture or compile failed), for the benchmark."""
    names: frozenset[str] = field(default=frozenset(), init=False)
    """The forward's parameter names (read once: ``torch.compile`` cannot trace ``inspect``)."""

    def __post_init__(self) -> None:
        self.names = frozenset(_parameters(self.model))

    def _forward(self, shape: _Shape, *, cache_position: Any, **inputs: Any) -> Any:
        """The model's forward on the shape's cache, with the keywords this transformers takes: ``cache``
        (5.x) or ``past_key_values``; ``cache_position`` where the forward takes it (else the cache counts
        its own length); ``logits_to_keep=1`` where ``generate`` passes it (it changes the head's matmul)."""
        names = self.names
        extra: dict[str, Any] = {"cache" if "cache" in names else "past_key_values": shape.cache}
        if "cache_position" in names:
            extra["cache_position"] = cache_position
        if "logits_to_keep" in names:
            extra["logits_to_keep"] = 1
        if _attention_of(self.model) == "eager" and inputs["input_ids"].shape[1] == 1:  # a step, not the prompt
            inputs["attention_mask"] = additive_step_mask(inputs["attention_mask"], cache_position, self.model.dtype)
        out = self.model(use_cache=True, return_dict=True, **inputs, **extra)
        return out.logits[:, -1, :]

    def _shape(self, batch: int, length: int, device: Any) -> _Shape:
        import torch
        from transformers import StaticCache

        key = (batch, length)
        shape = self.shapes.pop(key, None)
        if shape is None:
            while len(self.shapes) >= GRAPHS_KEPT:
                self.shapes.popitem(last=False)
            shape = _Shape(
                cache=_views_cache(self.model, length)
                if self.mode == EXACT
                else StaticCache(config=self.model.config, max_cache_len=length),
                ids=torch.zeros((batch, 1), dtype=torch.long, device=device),
                positions=torch.zeros((batch, 1), dtype=torch.long, device=device),
                cache_position=torch.zeros(1, dtype=torch.long, device=device),
                mask=torch.ones((batch, length), dtype=torch.long, device=device),
            )
        elif self.mode == EXACT:
            shape.cache.set_length(0)
        else:
            shape.cache.reset()
        self.shapes[key] = shape
        return shape

    def _exact_step(self, shape: _Shape, cached: int, unpadded: bool) -> Any:
        """``exact``: the step as ``generate`` runs it on a dynamic cache of ``cached`` tokens (attention over
        exactly those, the same mask or none), eager on a CPU, else from a graph per (``cached``, ``unpadded``)."""
        import torch

        key = (cached, unpadded)
        if key in shape.lengths:
            shape.lengths[key].replay()
            return shape.logits
        shape.cache.set_length(cached)
        mask = shape.mask[:, : cached + 1]

        def eager() -> Any:
            return self._forward(
                shape,
                input_ids=shape.ids,
                attention_mask=mask,
                position_ids=shape.positions,
                cache_position=shape.cache_position,
            )

        if shape.ids.device.type != "cuda" or shape.eager_only:
            return eager()
        try:
            if shape.pool is None:  # the first capture at this batch size: warm up on a side stream
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    shape.logits = torch.empty_like(eager())  # one output for all its graphs
                torch.cuda.current_stream().wait_stream(stream)
                shape.cache.set_length(cached)
                shape.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            # the graphs share one memory pool (they run one at a time): nothing they make outlives them
            with _causal_skip(unpadded), torch.cuda.graph(graph, pool=shape.pool):
                shape.logits.copy_(eager())
        except Exception as error:  # noqa: BLE001 - any capture failure leaves eager decoding
            reason = f"{self.mode} at batch {shape.ids.shape[0]}: {type(error).__name__}: {error}"
            self.fallbacks.append(reason)
            log.warning("runtime.decode_step_fallback", reason=reason[:500])
            shape.eager_only = True
            shape.cache.set_length(cached)
            return eager()
        shape.lengths[key] = graph
        graph.replay()
        return shape.logits

    def _step(self, shape: _Shape) -> Any:
        """The buffers' one-token forward, captured or compiled on first use in those modes."""

        def eager() -> Any:
            return self._forward(
                shape,
                input_ids=shape.ids,
                attention_mask=shape.mask,
                position_ids=shape.positions,
                cache_position=shape.cache_position,
            )

        if shape.step is not None:
            return shape.step()
        shape.step = eager
        if self.mode == LEAN:
            return eager()
        counters = _counters(shape.cache)
        before = [counter.clone() for counter in counters]
        try:
            if self.mode == GRAPH:
                shape.step = self._captured(shape, eager, counters, before)
                return shape.step()
            shape.step, logits = self._compiled(shape)
            return logits  # compiling ran this step
        except Exception as error:  # noqa: BLE001 - any capture failure leaves eager decoding
            reason = f"{self.mode} at batch {shape.ids.shape[0]}: {type(error).__name__}: {error}"
            self.fallbacks.append(reason)
            log.warning("runtime.decode_step_fallback", reason=reason[:500])
            shape.step = eager
            _restore(counters, before)
            return eager()

    def _captured(
        self, shape: _Shape, eager: Callable[[], Any], counters: list[Any], before: list[Any]
    ) -> Callable[[], Any]:
        """``eager`` recorded in a CUDA graph (warmed up on a side stream first, as CUDA graphs need). The
        warm-ups run the real step for the buffers' token: they write that position's keys and values, which
        the replay writes again with the same values; a cache that counts its own length is set back."""
        import torch

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                eager()
                _restore(counters, before)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            shape.logits = eager()
        shape.graph = graph

        def replay() -> Any:
            graph.replay()
            return shape.logits

        return replay

    def _compiled(self, shape: _Shape) -> tuple[Callable[[], Any], Any]:
        """The step through ``torch.compile`` and the logits of its first (compiling) run."""
        import torch

        def forward(ids: Any, positions: Any, cache_position: Any, mask: Any) -> Any:
            return self._forward(
                shape, input_ids=ids, attention_mask=mask, position_ids=positions, cache_position=cache_position
            )

        options: dict[str, Any] = (
            {"backend": "cudagraphs"} if self.mode == CUDAGRAPHS else {"mode": "reduce-overhead", "fullgraph": True}
        )
        compiled = torch.compile(forward, dynamic=False, **options)

        def call() -> Any:
            # cudagraph trees reuse their output memory on the next call: copy what is read after it
            return compiled(shape.ids, shape.positions, shape.cache_position, shape.mask).clone()

        return call, call()  # compiled now, so that a failure falls back before this step has run

    def decode(
        self,
        input_ids: Any,
        attention: Any,
        *,
        max_new: int,
        config: Any,
        processors: Sequence[Any],
        take: Callable[[list[int], list[float] | None], bool],
        log_probs: bool,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Generate up to ``max_new`` tokens for the left-padded ``input_ids`` [B, S] (``attention`` its mask).

        ``config`` is the ``GenerationConfig`` ``generate`` would get (it picks transformers' processors),
        ``processors`` ftx's own; ``take(tokens, log_probs)`` receives each step's tokens (one per row) and
        answers whether every row has finished. Returns the generated ids [B, n] (n ≤ ``max_new``: at least
        every row's tokens up to its end) and, when asked, each token's log-softmax [B, n].
        """
        import torch
        from transformers import LogitsProcessorList

        batch, prompt = input_ids.shape
        device = input_ids.device
        chain = self.model._get_logits_processor(
            generation_config=config,
            input_ids_seq_length=prompt,
            encoder_input_ids=input_ids,
            prefix_allowed_tokens_fn=None,
            logits_processor=LogitsProcessorList(processors),
            device=device,
            model_kwargs={"attention_mask": attention},
        )
        shape = self._shape(batch, cache_length(prompt, max_new), device)
        shape.mask.fill_(1)
        shape.mask[:, :prompt] = attention
        positions = prompt_positions(attention)
        logits = self._forward(  # the prompt's own mask, as generate passes it (it picks the attention kernel)
            shape,
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            cache_position=torch.arange(prompt, device=device),
        )
        shape.positions.copy_(positions[:, -1:])
        shape.cache_position.fill_(prompt - 1)
        unpadded = bool(attention.all()) if self.mode == EXACT else False

        def advance(tokens: Any, done: int) -> Any:
            shape.ids.copy_(tokens[:, None])
            shape.positions.add_(1)
            shape.cache_position.add_(1)
            if self.mode == EXACT:
                return self._exact_step(shape, prompt + done - 1, unpadded)
            return self._step(shape)

        return decode_steps(
            logits,
            input_ids,
            max_new=max_new,
            chain=chain,
            sample=bool(config.do_sample),
            log_probs=log_probs,
            take=take,
            advance=advance,
        )


def prompt_positions(attention: Any) -> Any:
    """Each prompt token's position (``attention.cumsum() - 1``, 1 on padding), as ``generate`` computes it."""
    positions = attention.long().cumsum(-1) - 1
    positions.masked_fill_(attention == 0, 1)
    return positions


def _hand_over(tokens: Any, chosen: Any, start: int, take: Callable[[list[int], list[float] | None], bool]) -> bool:
    """The steps since the last read, one ``take`` call each; whether every row has finished."""
    rows = tokens.cpu().numpy()
    probs = None if chosen is None else chosen[:, start : start + rows.shape[1]].cpu().numpy()
    finished = False
    for column in range(rows.shape[1]):
        finished = take(
            [int(t) for t in rows[:, column]], None if probs is None else [float(p) for p in probs[:, column]]
        )
    return finished


def decode_steps(
    logits: Any,
    input_ids: Any,
    *,
    max_new: int,
    chain: Callable[[Any, Any], Any],
    sample: bool,
    log_probs: bool,
    take: Callable[[list[int], list[float] | None], bool],
    advance: Callable[[Any, int], Any],
) -> tuple[np.ndarray, np.ndarray | None]:
    """The token loop shared by :class:`LeanDecoder` and the plain-torch decoder: from the prompt's last
    ``logits`` [B, V], each step processes a float32 copy of the logits (``chain(ids so far, scores)``), picks
    the tokens as ``generate`` does (argmax, or ``multinomial`` of the softmax), keeps their log-softmax when
    asked, hands them to ``take`` every 1, 2, 4 ... :data:`CHECK_EVERY` steps and stops once it answers that every
    row has finished; ``advance(tokens, steps done)`` runs the model on the new tokens and gives their logits.
    Returns the generated ids [B, n] and, when asked, their log probabilities [B, n]."""
    import torch

    batch, prompt = input_ids.shape
    device = input_ids.device
    sequence = torch.empty((batch, prompt + max_new), dtype=torch.long, device=device)
    sequence[:, :prompt] = input_ids
    chosen = torch.zeros((batch, max_new), dtype=torch.float32, device=device) if log_probs else None
    done = read = 0
    group = 1
    while done < max_new:
        scores = chain(sequence[:, : prompt + done], logits.to(copy=True, dtype=torch.float32))
        tokens = (
            torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            if sample
            else torch.argmax(scores, dim=-1)
        )
        sequence[:, prompt + done] = tokens
        if chosen is not None:
            chosen[:, done] = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        done += 1
        if done - read >= group or done == max_new:
            if _hand_over(sequence[:, prompt + read : prompt + done], chosen, read, take):
                break
            read, group = done, min(2 * group, CHECK_EVERY)
        if done < max_new:
            logits = advance(tokens, done)
    generated = sequence[:, prompt : prompt + done].cpu().numpy().astype(np.int64)
    return generated, None if chosen is None else chosen[:, :done].cpu().numpy()


_VIEWS_CLASS: list[Any] = []


def _views_cache(model: Any, length: int) -> Any:
    """A ``DynamicCache`` (so the model masks and attends exactly as with ``generate``'s) whose layers hold
    views of fixed buffers of ``length`` positions instead of growing by concatenation: a step's graph
    writes its keys and values in place, and the views are as long as the tokens cached so far."""
    if not _VIEWS_CLASS:
        from transformers import DynamicCache

        class ViewsCache(DynamicCache):
            ftx_buffers: list[tuple[Any, Any]]
            ftx_length: int

            def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
                buffers: list[tuple[Any, Any]] = self.ftx_buffers
                if layer_idx >= len(buffers):  # the first prefill: transformers sets the layer up
                    super().update(key_states, value_states, layer_idx, *args, **kwargs)
                    batch, heads, _n, dim = key_states.shape
                    shape = (batch, heads, self.ftx_length, dim)
                    buffers.append((key_states.new_zeros(shape), value_states.new_zeros(shape)))
                    start = 0
                else:
                    start = self.layers[layer_idx].keys.shape[-2]  # type: ignore[union-attr]
                end = start + key_states.shape[-2]
                keys, values = buffers[layer_idx]
                keys[:, :, start:end].copy_(key_states)
                values[:, :, start:end].copy_(value_states)
                layer = self.layers[layer_idx]
                layer.keys, layer.values = keys[:, :, :end], values[:, :, :end]
                return layer.keys, layer.values

            def set_length(self, cached: int) -> None:
                """The layers' views cut to the first ``cached`` positions (what a step then attends)."""
                for layer, (keys, values) in zip(self.layers, self.ftx_buffers, strict=False):
                    layer.keys, layer.values = keys[:, :, :cached], values[:, :, :cached]

        _VIEWS_CLASS.append(ViewsCache)
    cache = _VIEWS_CLASS[0](config=model.config)
    cache.ftx_buffers = []
    cache.ftx_length = length
    return cache


def _attention_of(model: Any) -> str | None:
    """The attention implementation transformers loaded ``model`` with (``eager``, ``sdpa`` …)."""
    return getattr(model.config, "_attn_implementation", None)


def additive_step_mask(mask: Any, cache_position: Any, dtype: Any) -> Any:
    """The 4D mask transformers' eager attention adds for one query token at ``cache_position``: 0 where the
    2D ``mask`` keeps a cached position at or before it, the dtype's minimum elsewhere — what its ``eager_mask``
    builds, but from device operations only: transformers makes its 0 with ``torch.tensor(0.0, device=…)``, a
    host-to-device copy that a CUDA graph capture refuses (measured on an H100: every capture of GPT-J's step
    failed so)."""
    import torch

    positions = torch.arange(mask.shape[-1], device=mask.device)
    keep = mask.bool() & (positions <= cache_position.reshape(-1)[-1:])
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)[:, None, None, :]


class _causal_skip:  # noqa: N801 - used as a context manager, like contextlib's
    """While a step is captured, transformers cannot look at the mask (a CUDA graph allows no host reads),
    so it would build one where ``generate`` builds none; the host's answer stands in: a one-token step of a
    batch without padding needs no mask (what ``generate`` finds by reading the mask), else it does."""

    def __init__(self, unpadded: bool) -> None:
        self.unpadded = unpadded
        self.saved: Any = None

    def __enter__(self) -> None:
        from transformers import masking_utils

        self.saved = getattr(masking_utils, "_ignore_causal_mask_sdpa", None)
        if self.saved is not None:
            masking_utils._ignore_causal_mask_sdpa = lambda *args, **kwargs: self.unpadded

    def __exit__(self, *exc: object) -> None:
        from transformers import masking_utils

        if self.saved is not None:
            masking_utils._ignore_causal_mask_sdpa = self.saved


def _parameters(model: Any) -> Any:
    import inspect

    return inspect.signature(model.forward).parameters


def _counters(cache: Any) -> list[Any]:
    """The length counters of a cache that counts what it holds on the device (transformers 5's static
    layers); running a step advances them."""
    import torch

    layers = getattr(cache, "layers", None) or ()
    return [
        layer.cumulative_length
        for layer in layers
        if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)
    ]


def _restore(counters: list[Any], values: list[Any]) -> None:
    for counter, value in zip(counters, values, strict=True):
        counter.copy_(value)


def supports_loop(model: Any) -> bool:
    """Whether ``model`` can decode with :class:`LeanDecoder`: a decoder-only model whose forward takes a
    static cache's positions, and a transformers that still builds ``generate``'s processors the same way."""
    config = getattr(model, "config", None)
    return (
        config is not None
        and not getattr(config, "is_encoder_decoder", False)
        and hasattr(model, "_get_logits_processor")
        and "position_ids" in _parameters(model)
        and bool({"cache", "past_key_values"} & set(_parameters(model)))
    )
