"""Model licences: shown before anything is fetched, and accepted explicitly when non-commercial.

A family or preset declares its licence (an SPDX id such as ``CC-BY-NC-ND-4.0``); the rule is
core's: any licence whose id carries ``NC`` (Creative Commons NonCommercial) restricts use, so a
run needs ``--accept-license`` (or ``FTX_ACCEPT_LICENSE=1``) before it fetches such a model.
"""

from __future__ import annotations

import re

from ftx_triton.errors import LicenseError

ACCEPT_FLAG = "--accept-license"
ACCEPT_ENV = "FTX_ACCEPT_LICENSE"
_NONCOMMERCIAL = re.compile(r"(?:^|[-_ ])NC(?:[-_ ]|$)", re.IGNORECASE)
_NO_DERIVATIVES = re.compile(r"(?:^|[-_ ])ND(?:[-_ ]|$)", re.IGNORECASE)


def is_noncommercial(license_id: str | None) -> bool:
    """True for licences that forbid commercial use (``CC-BY-NC-4.0``, ``CC-BY-NC-ND-4.0`` …)."""
    return bool(license_id and _NONCOMMERCIAL.search(license_id))


def notice(model: str, license_id: str) -> str:
    """The line shown on the terminal before a licensed model is fetched."""
    terms = []
    if is_noncommercial(license_id):
        terms.append("non-commercial use only")
    if _NO_DERIVATIVES.search(license_id):
        terms.append("no distribution of modified versions")
    extra = f" ({'; '.join(terms)})" if terms else ""
    return f"licence   {model} is licensed {license_id}{extra}"


def check(model: str, license_id: str | None, accepted: bool) -> None:
    """Refuse a non-commercial licence unless it was accepted explicitly."""
    if is_noncommercial(license_id) and not accepted:
        raise LicenseError(
            f"{model} is licensed {license_id}, which does not allow commercial use",
            hint=f"read the licence; if your use complies, pass {ACCEPT_FLAG} (or set {ACCEPT_ENV}=1)",
        )


__all__ = ["ACCEPT_ENV", "ACCEPT_FLAG", "check", "is_noncommercial", "notice"]
