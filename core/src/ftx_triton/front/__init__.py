"""The asynchronous HTTP front (aiohttp) between strangers and what ftx serves.

:mod:`.server` holds what every listener shares: the limits (decoded body size, content encodings,
header/body/idle timeouts, a connection cap) and the body reader; :mod:`.shield` is the application
that guards tritonserver's HTTP port. The OpenAI-compatible endpoint (:mod:`ftx_triton.openai_api`) is served
by the same :class:`~.server.Front` in its own process.
"""

SERVER_PID_HEADER = "X-Ftx-Server-Pid"
"""Every answer of the shield names the process it runs in (the server's supervisor): ftx knows its own server
from another deployment's that took the same port between the free-port check and the bind."""
