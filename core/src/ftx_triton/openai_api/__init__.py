"""An OpenAI-compatible endpoint (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``) in
front of a served ensemble, so OpenAI clients reach a Triton deployment unchanged.

It is a small aiohttp application (:mod:`.app`) that turns each request into Triton generate-extension
calls on the ensemble (:class:`ftx_triton.client.text_client.HttpTriton`), counts tokens with the
repository's own tokenizer and renders chat messages with the model's chat template
(``tokenizer_config.json``) where it has one. ``ftx run`` starts it as a process beside the server
(:mod:`.launch`), bound to 127.0.0.1 unless told otherwise.
"""
