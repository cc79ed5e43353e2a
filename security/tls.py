"""One verifying TLS context per process, for every HTTP client trouper makes.

httpx builds a new ``ssl.SSLContext`` for each client (and for each ``httpx.get``),
loading the whole CA bundle: ~47 ms of CPU each on this machine, against ~0.1 ms for a
client given a ready context. Contexts are safe to share between clients and threads;
this one verifies exactly as httpx's default does (certifi's bundle, or SSL_CERT_FILE /
SSL_CERT_DIR when set when it is first made).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """The process's verifying context, made on first use."""
    import httpx

    return httpx.create_ssl_context()
