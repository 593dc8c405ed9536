"""The asynchronous HTTP front (aiohttp) between strangers and what ftx serves.

:mod:`.server` holds what every listener shares: the limits (decoded body size, content encodings,
header/body/idle timeouts, a connection cap) and the body reader; :mod:`.shield` is the application
that guards tritonserver's HTTP port. The OpenAI-compatible endpoint (:mod:`ftx_triton.openai_api`) is served
by the same :class:`~.server.Front` in its own process.
"""
