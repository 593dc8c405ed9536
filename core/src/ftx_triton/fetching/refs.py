"""Parse what the user typed into a :class:`SourceRef`, and pin it to a revision.

Accepted forms: ``hf://org/name[@revision]``, ``https://…``, ``http://…``, ``file:///…``,
an existing local directory or file (archives and plain files become ``file://`` URLs), or a
preset name.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit

import structlog

from ftx_triton.errors import SourceError
from ftx_triton.fetching.integrity import normalize_sha256
from ftx_triton.fetching.local_keys import local_fingerprint
from ftx_triton.plan.artifacts import SourceRef
from ftx_triton.terminal.redact import redact_url

log = structlog.get_logger(__name__)

_REPO_ID_RE = re.compile(r"^(?:[\w.\-]+/)?[\w.\-]+$")
_HF_WEB_RE = re.compile(r"^https?://(?:www\.)?huggingface\.co/([\w.\-]+/[\w.\-]+)(?:/tree/([^/?#]+))?/?$")
ACCEPTED_FORMS = (
    "hf://ORG/NAME[@REVISION]",
    "https://HOST/PATH (archive or file)",
    "file:///PATH",
    "a local directory or archive",
    "a preset name",
)


def parse_ref(text: str, *, presets: Mapping[str, SourceRef] | None = None, revision: str | None = None) -> SourceRef:
    """Turn a model source as typed by the user into a :class:`SourceRef`.

    ``revision`` (``--revision``) applies to ``hf`` sources and presets; it must agree with
    an ``@revision`` written in the text.
    """
    text = (text or "").strip()
    presets = presets or {}
    if not text:
        raise _unknown(text, presets, "the model source is empty")
    if text.startswith("hf://"):
        return _parse_hf(text[len("hf://") :], revision)
    if web := _HF_WEB_RE.match(text):
        return _parse_hf(web.group(1) + (f"@{web.group(2)}" if web.group(2) else ""), revision)
    parts = _split_url(text)
    if parts.scheme.lower() in ("http", "https"):
        return _with_no_revision(_parse_http(text), revision)
    if parts.scheme.lower() == "file":
        from urllib.request import url2pathname

        return _with_no_revision(_parse_path(Path(url2pathname(parts.path)), text), revision)
    if text in presets and not _looks_like_path(text):
        return _from_preset(text, presets[text], revision)
    if Path(text).expanduser().exists():
        return _with_no_revision(_parse_path(Path(text).expanduser(), text), revision)
    raise _unknown(text, presets, f"{text!r} is not a preset, a URL or an existing path")


def _split_url(text: str) -> SplitResult:
    """``urlsplit(text)``; a malformed URL (an unclosed or invalid IPv6 bracket, a port that is no number
    in 0-65535) is a SourceError."""
    try:
        parts = urlsplit(text)
        _ = parts.port  # parsed lazily: raises here, not in the download
    except ValueError as exc:
        raise SourceError(
            f"invalid URL {redact_url(text)!r}: {exc}",
            hint="write https://HOST[:PORT]/PATH; an IPv6 host goes in brackets, e.g. http://[::1]:8000/model.tar.gz",
        ) from exc
    return parts


def _parse_hf(body: str, revision: str | None) -> SourceRef:
    repo_id, _, inline_rev = body.partition("@")
    repo_id = repo_id.strip("/")
    if not _REPO_ID_RE.match(repo_id) or (why := _hub_rejects(repo_id)):
        raise SourceError(
            f"invalid Hugging Face repository {repo_id!r}" + (f": {why}" if _REPO_ID_RE.match(repo_id) else ""),
            hint="write hf://ORG/NAME or hf://ORG/NAME@REVISION, e.g. hf://EleutherAI/gpt-j-6b@main",
        )
    for given in (inline_rev, revision):
        if given:
            _check_revision(given)
    if inline_rev and revision and inline_rev != revision:
        raise SourceError(
            f"two revisions given for {repo_id}: @{inline_rev} and --revision {revision}", hint="give the revision once"
        )
    return SourceRef(kind="hf", uri=f"hf://{repo_id}", revision=inline_rev or revision or None)


def _check_revision(revision: str) -> None:
    """:func:`ftx_triton.fetching.hub.check_revision`, imported only for a source with a revision (the hub module
    loads huggingface_hub, which a local or preset source does not need)."""
    from ftx_triton.fetching.hub import check_revision

    check_revision(revision)


def _hub_rejects(repo_id: str) -> str | None:
    """Why the Hub would refuse ``repo_id`` (its own validator: ``..``, ``--``, a leading or trailing
    ``.``/``-``, a name over 96 characters), or None."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        return str(exc).split("\n")[0].rstrip(".")
    return None


def _parse_http(text: str) -> SourceRef:
    if not urlsplit(text).hostname:
        raise SourceError(f"invalid URL {redact_url(text)!r}: no host", hint="write https://HOST/PATH")
    download_name(text)  # refused here, before anything is downloaded
    return SourceRef(kind="url", uri=text)


def download_name(url: str) -> str:
    """The file name a downloaded ``url`` is kept under: its last path segment, which must name an archive.

    Raises :class:`SourceError` for a segment that is empty, ``.``, ``..``, holds a slash, is over 255
    bytes (no file system takes it) or does not end in an archive suffix (only archives are extracted).
    """
    from ftx_triton.fetching.archive import archive_format, supported_suffixes  # tarfile, zstandard: not for a path

    raw = urlsplit(url).path.rsplit("/", 1)[-1]
    name = unquote(raw)
    hint = f"give the URL of an archive whose last path segment ends in {', '.join(supported_suffixes())}"
    shown = redact_url(url)
    if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise SourceError(f"the URL {shown!r} names no file (its last path segment is {name!r})", hint=hint)
    if len(os.fsencode(raw)) > 255:
        raise SourceError(
            f"the URL {shown[:120]!r}… has a last path segment of {len(os.fsencode(raw))} bytes, "
            "longer than a file name may be (255)",
            hint=hint,
        )
    if archive_format(Path(raw)) is None:
        raise SourceError(f"the URL {shown!r} does not name an archive ({name!r})", hint=hint)
    return raw


def _parse_path(path: Path, text: str) -> SourceRef:
    """A directory is a ``local`` source; a file (archive or plain) a ``file://`` URL."""
    if path.is_dir():
        return SourceRef(kind="local", uri=str(path.resolve()))
    if path.is_file():
        return SourceRef(kind="url", uri=path.resolve().as_uri())
    raise SourceError(f"{text!r} does not exist", hint="check the path")


def _from_preset(name: str, preset: SourceRef, revision: str | None) -> SourceRef:
    if revision:
        _check_revision(revision)
    if revision and preset.kind != "hf":
        raise SourceError(
            f"preset {name!r} downloads {preset.uri}, which has no revisions",
            hint="drop --revision, or give hf://ORG/NAME@REVISION instead of the preset",
        )
    return dataclasses.replace(preset, revision=revision or preset.revision, preset=preset.preset or name)


def _with_no_revision(ref: SourceRef, revision: str | None) -> SourceRef:
    if revision:
        raise SourceError(
            f"--revision {revision} only applies to hf:// sources, not {redact_url(ref.uri)}",
            hint="pin a URL or file with --sha256 instead",
        )
    return ref


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "~", os.sep)) or os.sep in text


def _unknown(text: str, presets: Mapping[str, SourceRef], why: str) -> SourceError:
    forms = "; ".join(ACCEPTED_FORMS)
    names = ", ".join(sorted(presets)) or "none installed"
    hint = f"use a preset ({names}) or one of: {forms}"
    if text.startswith(("./", "../", "~", os.sep)) or text in (".", ".."):
        # Written as a path: it is one, and it is missing (never a Hub id).
        return SourceError(
            f"unknown model source: {text!r} does not exist",
            hint="check the path (a checkpoint directory with config.json, or an archive)",
        )
    close = difflib.get_close_matches(text, list(presets), n=3, cutoff=0.6)
    if close:
        hint = f"did you mean {' or '.join(close)}? (`ftx models` lists the presets)"
    elif _REPO_ID_RE.match(text) and "/" in text:
        hint = f"did you mean hf://{text} ? Otherwise {hint}"
    return SourceError(f"unknown model source: {why}", hint=hint)


# --- revisions ----------------------------------------------------------------------------


def resolve_revision(ref: SourceRef) -> str:
    """Pin ``ref``: a 40-hex commit (hf), the sha256 or ``url-…`` key (url), ``local-…`` (local)."""
    if ref.kind == "hf":
        from ftx_triton.fetching.hub import resolve_commit

        return resolve_commit(ref.uri.removeprefix("hf://"), ref.revision)
    if ref.kind == "url":
        return normalize_sha256(ref.sha256) or _url_key(ref.uri)
    if ref.kind == "local":
        return local_fingerprint(Path(ref.uri))
    raise SourceError(f"unknown source kind {ref.kind!r} for {ref.uri}", hint="kind is one of local, hf, url")


def _url_key(url: str) -> str:
    """A key from the URL and, when the server gives them, its ETag and Last-Modified."""
    validators = _file_validators(url) if urlsplit(url).scheme == "file" else _http_validators(url)
    digest = hashlib.sha256("\n".join([url, *validators]).encode()).hexdigest()
    return f"url-{digest[:40]}"


def _file_validators(url: str) -> list[str]:
    from urllib.request import url2pathname

    path = Path(url2pathname(urlsplit(url).path))
    try:
        st = path.stat()
    except FileNotFoundError as exc:
        raise SourceError(f"{url} does not exist", hint="check the path") from exc
    return [f"size={st.st_size}", f"mtime_ns={st.st_mtime_ns}"]


def _http_validators(url: str, timeout_s: float = 10) -> list[str]:
    """ETag / Last-Modified from a HEAD; none when the server is unreachable or says nothing."""
    from urllib.error import URLError
    from urllib.request import Request, urlopen  # http.client and ssl: only for a URL

    try:
        with urlopen(Request(url, method="HEAD", headers={"User-Agent": "ftx"}), timeout=timeout_s) as resp:  # noqa: S310
            headers = resp.headers
    except (URLError, OSError, ValueError) as exc:
        log.warning("source.head_failed", url=redact_url(url), error=str(exc))
        return []
    return [f"{name}={headers[name]}" for name in ("ETag", "Last-Modified") if headers.get(name)]
