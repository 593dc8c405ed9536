"""Kubernetes: a deployment as manifests and a Helm chart (`ftx export k8s`), and the entrypoints its pods run."""
