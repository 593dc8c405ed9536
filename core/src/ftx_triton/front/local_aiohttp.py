"""aiohttp without its CA certificates, for the processes whose HTTP goes to this machine only: the supervisor's
HTTP front and the OpenAI endpoint (plain HTTP to tritonserver on 127.0.0.1; neither makes an HTTPS request).

At import, aiohttp builds its two default TLS contexts (``aiohttp.connector``), each loading OpenSSL's default CA
file and directory: about 0.09 s of CPU in every such process, spent while a model loads on the same cores. Imported
through :func:`import_aiohttp`, those contexts get no CA certificate: a verified HTTPS request through them fails
verification (it is never made unverified), and an explicit ``ssl=`` context is used as given. Nothing else about
aiohttp changes, and the environment is as it was once the import is done.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

NO_CERTIFICATES = {"SSL_CERT_FILE": os.devnull, "SSL_CERT_DIR": os.devnull}
"""OpenSSL's variables for its default CA file and directory, pointed at nothing while aiohttp imports."""


def import_aiohttp() -> ModuleType:
    """``import aiohttp``, its default TLS contexts without CA certificates when it is not imported yet (else as
    it is)."""
    if "aiohttp" in sys.modules:
        import aiohttp

        return aiohttp
    saved = {name: os.environ.get(name) for name in NO_CERTIFICATES}
    os.environ.update(NO_CERTIFICATES)
    try:
        import aiohttp
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return aiohttp


__all__ = ["NO_CERTIFICATES", "import_aiohttp"]
