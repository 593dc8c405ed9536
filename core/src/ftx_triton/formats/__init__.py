"""Model file formats: Hugging Face checkpoints read (safetensors, sharded, ``pytorch_model.bin``) and
FasterTransformer's files written and read (``config.ini``, raw ``.bin`` tensors, the converter's background
writer). Safe file handling itself (regular files only, atomic publication, hashes, trees) is ``ftx_triton.io``,
which knows no format; fetching knows none either (import-linter contracts in the root ``pyproject.toml``).
"""
