"""Triton model repositories: the fastertransformer model's config, the text models, the ensembles."""
