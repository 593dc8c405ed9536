"""aiohttp without CA certificates in the processes whose HTTP is local (``ftx_triton/front/local_aiohttp.py``)."""

from __future__ import annotations

import os

import pytest
from fresh_python import fresh_report

REPORT = """
import json, os, ssl, sys
{setup}
import aiohttp.connector as connector
contexts = (connector._SSL_CONTEXT_VERIFIED, connector._SSL_CONTEXT_UNVERIFIED)
print(json.dumps({{
    "ca": [c.cert_store_stats()["x509_ca"] for c in contexts],
    "verified_requires_a_certificate": contexts[0].verify_mode == ssl.CERT_REQUIRED,
    "env": [os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")],
}}))
"""


def _env(**set_: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    return {**env, **set_}


def _machine_has_certificates() -> bool:
    return any(fresh_report(REPORT.format(setup="import aiohttp"), _env())["ca"])


@pytest.mark.parametrize(
    "setup",
    [
        "from ftx_triton.front.local_aiohttp import import_aiohttp; import_aiohttp()",
        # the OpenAI endpoint's process started ahead, ending as its stdin closes without arguments
        "import io; sys.stdin = io.StringIO(''); from ftx_triton.openai_api.__main__ import warm; warm()",
    ],
)
@pytest.mark.parametrize("user_env", [{}, {"SSL_CERT_FILE": "/etc/ssl/custom.pem", "SSL_CERT_DIR": "/etc/ssl/custom"}])
def test_aiohttp_loads_no_ca_certificate_and_the_environment_is_kept(setup: str, user_env: dict[str, str]) -> None:
    report = fresh_report(REPORT.format(setup=setup), _env(**user_env))
    assert report["ca"] == [0, 0]
    assert report["verified_requires_a_certificate"] is True  # an HTTPS request fails verification, never unverified
    assert report["env"] == [user_env.get("SSL_CERT_FILE"), user_env.get("SSL_CERT_DIR")]


def test_where_aiohttp_came_first_nothing_changes() -> None:
    if not _machine_has_certificates():
        pytest.skip("OpenSSL finds no CA certificate on this machine: nothing to tell apart")
    setup = "import aiohttp\nfrom ftx_triton.front.local_aiohttp import import_aiohttp; import_aiohttp()"
    assert all(fresh_report(REPORT.format(setup=setup), _env())["ca"])
