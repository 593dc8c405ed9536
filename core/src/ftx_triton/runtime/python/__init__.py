"""The python runtime: a real tritonserver (nvidia-pytriton wheel) whose ``fastertransformer`` model
is a Python-backend stand-in with FasterTransformer's inputs and outputs, generating from the converted
``<tp>-gpu`` files (CPU, or one GPU when present).

``repository`` writes that model, ``triton_model`` is it, ``torch_model`` builds GPT-J/GPT-NeoX in plain torch
(``torch_decoder``, ``torch_sampling``: no transformers import), ``hf_model`` rebuilds the transformers model
(T5, beam search), ``generation`` maps FT requests to either, ``serve`` starts the server.
"""

import sys

if "ftx_triton.cli" not in sys.modules:  # a stub (never the `ftx` command, which loads runtimes from its CLI)
    from ftx_triton.plain_structlog import import_structlog

    import_structlog()  # before this package's modules import it: structlog without rich (0.1-0.2 s)
