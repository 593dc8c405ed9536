"""Secrets kept out of everything ftx prints or stores, and out of the servers it starts.

One rule for logs, provenance (``ftx-artifact.json``), deployment records (``ftx-deployment.json``)
and image labels: a URL loses its user-info and its query string (presigned URLs carry their
signature there), and a Hugging Face token (``hf_…``) is masked wherever it appears.
:func:`strip_secrets` removes token-like variables from a child process's environment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDACTED = "<redacted>"
_URL_RE = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>]+")
_HF_TOKEN_RE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
_SECRET_ENV_RE = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|API_?KEY|ACCESS_KEY)(_|$)", re.IGNORECASE)
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "HF_API_TOKEN")
"""Named explicitly; any other variable with a ``TOKEN``, ``SECRET``, ``PASSWORD``, ``API_KEY`` … word goes too."""


def redact_url(url: str) -> str:
    """The URL without credentials or query string; unchanged when it has neither."""
    try:
        parts = urlsplit(url)
    except ValueError:  # malformed (e.g. an unclosed IPv6 bracket): cut the same parts by hand
        head, query, _ = url.partition("?")
        scheme, sep, rest = head.partition("://")
        authority, slash, path = rest.partition("/")
        return f"{scheme}{sep}{authority.rsplit('@', 1)[-1]}{slash}{path}" + (f"?{REDACTED}" if query else "")
    if not parts.query and "@" not in parts.netloc:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, REDACTED if parts.query else "", ""))


def redact(text: str) -> str:
    """``text`` with every URL passed through :func:`redact_url` and Hugging Face tokens masked."""
    if "://" in text:
        text = _URL_RE.sub(lambda m: redact_url(m.group(0)), text)
    if "hf_" in text:
        text = _HF_TOKEN_RE.sub(REDACTED, text)
    return text


def redact_data(value: Any) -> Any:
    """A copy of JSON-like data (dicts, lists, tuples, strings) with every string redacted; keys too."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {redact(k) if isinstance(k, str) else k: redact_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_data(v) for v in value)
    return value


def redact_log_event(logger: object, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor: every value of every event redacted."""
    return {key: redact_data(value) for key, value in event.items()}


def is_secret_env(name: str) -> bool:
    """True for environment variables that hold credentials."""
    return name.upper() in SECRET_ENV or bool(_SECRET_ENV_RE.search(name))


def strip_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without credential variables: what a server process may inherit."""
    return {name: value for name, value in env.items() if not is_secret_env(name)}
