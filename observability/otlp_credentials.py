"""The OTLP collector's credentials, masked like every secret (``tracing.py``)."""

from __future__ import annotations

import os
from collections.abc import Iterable


def remember_otlp_credentials(endpoint_vars: Iterable[str]) -> None:
    """The collector's credentials (its headers' values, a URL's user and query) are
    masked like every secret: the exporter logs its failures with the URL in them."""
    from urllib.parse import urlsplit

    from ..security.masking import remember_secrets

    found: dict[str, str] = {}
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        for n, pair in enumerate(os.environ.get(name, "").split(",")):
            value = pair.partition("=")[2].strip()
            if value:
                found[f"{name}_{n}"] = value
    for name in endpoint_vars:
        url = urlsplit(os.environ.get(name, ""))
        for n, part in enumerate((url.password, url.username, url.query)):
            if part:
                found[f"{name}_{n}"] = part
    if found:
        remember_secrets(found)
