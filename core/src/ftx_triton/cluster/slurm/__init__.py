"""Slurm: a deployment as one batch job (a prepare step, then the server; tp = GPUs per node, pp = nodes)."""
