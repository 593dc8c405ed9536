"""Clients of a running deployment, shared by the CLI, the OpenAI endpoint and ``benchmarks/``.

- :mod:`~ftx_triton.client.text_client`: the ensemble's text interface over Triton's HTTP generate extension;
- :mod:`~ftx_triton.client.generate`: one generation (:class:`~ftx_triton.client.generate.TextRequest`) over
  HTTP, gRPC or a streaming repository's token route, streamed or whole;
- :mod:`~ftx_triton.client.token_stream`: the token route (ids from the fastertransformer model, text made here);
- :mod:`~ftx_triton.client.load`: the closed-loop load generator with pluggable senders (``ftx bench``);
- :mod:`~ftx_triton.client.chat`: a conversation through the OpenAI endpoint.

It imports nothing from the CLI (an import-linter contract); modules that need tritonclient or numpy import them
where they are used, so importing this package stays light.
"""
