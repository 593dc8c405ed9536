"""Triton Inference Server: the local tritonserver manager and model-repository helpers."""
