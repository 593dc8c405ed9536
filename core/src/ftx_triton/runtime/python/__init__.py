"""The python runtime: a real tritonserver (nvidia-pytriton wheel) whose ``fastertransformer`` model
is a Python-backend stand-in with FasterTransformer's inputs and outputs, generating with
``transformers`` from the converted ``<tp>-gpu`` files (CPU, or one GPU when present).

``repository`` writes that model, ``triton_model`` is it, ``hf_model`` rebuilds the transformers
model from FT files, ``generation`` maps FT requests to ``generate``, ``serve`` starts the server.
"""
