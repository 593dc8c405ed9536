"""The real one-node Slurm cluster of these tests (``slurm_cluster``)."""

from slurm_cluster import slurm_cluster  # noqa: F401 - a session fixture
