"""Cluster launchers: ftx deployments handed to the schedulers platform teams run (Slurm; Kubernetes manifests).

Each is a plugin on ftx's own hooks (``ftx_register_commands``, ``ftx_cluster_deployments``), registered
like core's runtimes; core never imports this package.
"""
