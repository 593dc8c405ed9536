"""A CPU reference of FasterTransformer's own math, reading converted files as FT's loaders do.

It shares nothing with a family plugin's tensor table: ``files`` reads FT file names, shapes and
tp shards; one module per FT model type (``gpt``, ``gptj``, ``gptneox``, ``t5``) computes the
logits FT would; ``verify`` compares them with transformers on the original checkpoint. A
conversion that puts a tensor where FT does not look for it (q and k swapped, a wrong split,
a wrong rotary layout) fails here, on CPU, whatever the python runtime makes of it.
"""

from ftx_triton.oracle.verify import Verdict, reference_logits, verify

__all__ = ["Verdict", "reference_logits", "verify"]
