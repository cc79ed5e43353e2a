"""Hostile requests for every route of a FastAPI app, sent over a raw socket to the real
server: for a server's "no input yields a 500" test.

The routes are read from the app (``app.routes``), so a route added later is walked
without saying so. Each gets, with the right token: hostile path ids (256 characters,
``..``, NUL, a slash, unicode, an encoded lone surrogate, empty); hostile query values
for each of its parameters (2**63, -1, -2**63-1, 1e309, nan, "", repeated, arrays);
hostile header parameters; and, for a route that takes a body, bodies that are not JSON,
not an object, nested 100,000 deep, hold numbers past 64 bits, wrong types, ``\\ud800``
escapes, invalid UTF-8, or one string near the size limit; and requests whose framing is
odd (a Content-Type, a huge header, a bad Content-Length, Transfer-Encoding tricks).
Deterministic: the bodies are drawn from a seeded ``random.Random``.

    failures = fuzz(app, "127.0.0.1", port, auth={"Authorization": "Bearer ..."},
                    valid={"session_id": "s-1"}, health="/v1/health")
    assert failures == []
"""

from __future__ import annotations

import json
import random
import re
import socket
import time
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

HOSTILE_IDS = ["a" * 256, "..", "%2e%2e", "%00", "a%00b", "%2F", "%C3%A9t%C3%A9-%E2%98%83",
               "%ED%A0%80", "%FF%FE", "", "%20", ".", "~", "%5C", "a" * 5000]
"""Path ids, as they go on the request line (already encoded)."""
HOSTILE_NUMBERS = ["9223372036854775808", "9223372036854775807", "-1", "-9223372036854775809",
                   "1e309", "-1e309", "nan", "inf", "", "0x10", "%D9%A1%D9%A2", "1" * 5000,
                   "true", "%00", "%ED%A0%80", "1.5", " 1", "99999999999999999999999999",
                   "x%7C99999999999999999999", "x%7C%D9%A1"]
"""Query and header values, as they go on the request line (already encoded); the last
two are cursor-like (``created|rowid``) with a rowid past 64 bits and an Arabic digit."""
HOSTILE_VALUES: list[Any] = [2**63, -(2**63) - 1, 10**30, 1.5e308, -1, 0, True, None, "",
                             "\ud800", "x\udfffy", [], {}, [1, "a"], {"a": {"b": []}},
                             "a" * 5000, -0.0]
"""Field values in JSON bodies (``\\ud800`` is sent as the escape ``"\\ud800"``)."""
CONTENT_TYPES = ["text/plain", "application/json; charset=utf-16", "multipart/form-data; "
                 "boundary=x", "application/x-www-form-urlencoded", "application/xml",
                 "application/json" + "; x=y" * 200, "", "\x7f"]


@dataclass(frozen=True)
class Probe:
    """One hostile request, as bytes on the wire."""

    what: str
    """What it attacks (for the failure message)."""
    head: bytes
    body: bytes = b""
    answer_needed: bool = True
    """False when the server may close without answering (a body it cut, a framing
    it cannot read): an answer must still not be a 5xx."""


@dataclass
class Fuzzer:
    """The probes for one app; see the module docstring."""

    app: Any
    valid: Mapping[str, str]
    """A good value for each path parameter (an existing session's id...)."""
    auth: Mapping[str, str]
    host: str = "127.0.0.1:1"
    """The Host header (a server that checks it needs its own)."""
    seed: int = 1
    big_body_bytes: int = 900 * 1024
    """Size of the one body near the limit (keep it under the server's limit)."""
    body_fields: Iterable[str] = ()
    """Field names to put hostile values in, beside those a route's body model names."""
    bodies_per_route: int = 12
    before_route: Callable[[], None] | None = None
    """Called before each route's probes (to start again what the last one stopped)."""
    _random: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def probes(self) -> Iterator[Probe]:
        for route in self.app.routes:
            methods = sorted(getattr(route, "methods", None) or ["WS"])
            for method in methods:
                if method != "HEAD":
                    if self.before_route is not None:
                        self.before_route()
                    yield from self._route(route, method)

    def _route(self, route: Any, method: str) -> Iterator[Probe]:
        path, names = route.path, re.findall(r"{(\w+)(?::\w+)?}", route.path)
        good = self._fill(path, {})
        for name in names:
            for hostile in HOSTILE_IDS:
                yield self._probe(f"{method} {path} with {name}={hostile[:20]!r}", method,
                                  self._fill(path, {name: hostile}))
        dependant = getattr(route, "dependant", None)
        for param in getattr(dependant, "query_params", []):
            yield from self._queries(method, good, param.alias)
        for param in getattr(dependant, "header_params", []):
            for value in HOSTILE_NUMBERS[:12]:
                yield self._probe(f"{method} {good} with {param.alias}: {value[:20]!r}",
                                  method, good, {param.alias: value})
        if method in ("POST", "PUT", "PATCH"):
            yield from self._bodies(method, good, route)
            yield from self._framing(method, good)

    def _queries(self, method: str, target: str, name: str) -> Iterator[Probe]:
        for value in HOSTILE_NUMBERS:
            yield self._probe(f"{method} {target}?{name}={value[:20]!r}", method,
                              f"{target}?{name}={value}")
        for query in (f"{name}=1&{name}=2", f"{name}[]=1", f"{name}", f"{name}=&{name}=x",
                      f"{name}={'9' * 30}&{name}=-5", "&".join([f"{name}=1"] * 300)):
            yield self._probe(f"{method} {target}?{query[:40]}", method, f"{target}?{query}")

    def _bodies(self, method: str, target: str, route: Any) -> Iterator[Probe]:
        fixed = [b"{", b"[]", b"null", b'"x"', b"1", b"[" * 100_000 + b"]" * 100_000,
                 b'{"a":' * 10_000 + b"1" + b"}" * 10_000, b'{"a": ' + b"1" * 5000 + b"}",
                 b'{"a": 1e999}', b'{"a": NaN}', b'{"a": "\xff\xfe"}', b"\xef\xbb\xbf{}",
                 b'{"a": "\\ud800"}', b"{}" + b" " * 1000 + b"x",
                 json.dumps({"a": "x" * self.big_body_bytes}).encode()]
        for body in fixed:
            yield self._probe(f"{method} {target} body {body[:30]!r}", method, target,
                              {"Content-Type": "application/json"}, body)
        names = sorted({*self.body_fields, *_model_fields(route)})
        for _ in range(self.bodies_per_route if names else 0):
            chosen = {n: self._random.choice(HOSTILE_VALUES) for n in names
                      if self._random.random() < 0.7}
            body = json.dumps(chosen).encode()  # lone surrogates go as \\ud800 escapes
            yield self._probe(f"{method} {target} body {body[:80]!r}", method, target,
                              {"Content-Type": "application/json"}, body)

    def _framing(self, method: str, target: str) -> Iterator[Probe]:
        body = b'{"a": 1}'
        for kind in CONTENT_TYPES:
            yield self._probe(f"{method} {target} Content-Type {kind[:30]!r}", method, target,
                              {"Content-Type": kind}, body)
        yield self._probe(f"{method} {target} a 64 KiB header", method, target,
                          {"X-Pad": "a" * 65536}, body, answer_needed=False)
        for length in ("abc", "-1", "1, 2", " 8", "+8", "99999999999999999999999", "0x8"):
            yield self._probe(f"{method} {target} Content-Length {length!r}", method, target,
                              {"Content-Length": length}, body, answer_needed=False)
        yield self._probe(f"{method} {target} two Content-Lengths", method, target,
                          {"Content-Length": "8", "content-length": "9"}, body,
                          answer_needed=False)
        chunked = b"8\r\n" + body + b"\r\n0\r\n\r\n"
        for te in ("chunked", "gzip, chunked", "chunked, gzip", " chunked", "Chunked",
                   "identity", "chunked\x00"):
            yield self._probe(f"{method} {target} Transfer-Encoding {te!r}", method, target,
                              {"Transfer-Encoding": te}, chunked, answer_needed=False)
        yield self._probe(f"{method} {target} chunked with a Content-Length", method, target,
                          {"Transfer-Encoding": "chunked", "Content-Length": "3"}, chunked,
                          answer_needed=False)
        for size in (b"zz", b"ffffffffffffffffffffffff", b"-1", b"8;" + b"x" * 70000):
            yield self._probe(f"{method} {target} chunk size {size[:20]!r}", method, target,
                              {"Transfer-Encoding": "chunked"}, size + b"\r\n" + body,
                              answer_needed=False)
        yield self._probe(f"{method} {target} Expect: 100-continue", method, target,
                          {"Expect": "100-continue", "Content-Type": "application/json"}, body)

    def _fill(self, path: str, given: Mapping[str, str]) -> str:
        def value(match: re.Match[str]) -> str:
            name = match.group(1)
            return given[name] if name in given else quote(self.valid.get(name, "x1"), safe="")
        return re.sub(r"{(\w+)(?::\w+)?}", value, path)

    def _probe(self, what: str, method: str, target: str,
               headers: Mapping[str, str] | None = None, body: bytes = b"",
               answer_needed: bool = True) -> Probe:
        headers = headers or {}
        lines = [f"{'GET' if method == 'WS' else method} {target} HTTP/1.1",
                 f"Host: {self.host}", *(f"{k}: {v}" for k, v in self.auth.items())]
        if method == "WS":
            lines += ["Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
                      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        framed = {k.lower() for k in headers} & {"content-length", "transfer-encoding"}
        if body and not framed:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        return Probe(what, head, body, answer_needed)


def _model_fields(route: Any) -> set[str]:
    """The field names of the pydantic model a route's body is (or may be)."""
    body = getattr(route, "body_field", None)
    if body is None:
        return set()
    found, todo = set(), [body.field_info.annotation]
    while todo:
        kind = todo.pop()
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            found.update(kind.model_fields)
        todo.extend(typing.get_args(kind))
    return found


def send(address: tuple[str, int], probe: Probe, timeout_s: float = 20.0) -> int | None:
    """Send the probe on a new connection; the answer's status, or None when the server
    closed (or reset) the connection without one. TimeoutError when nothing comes."""
    with socket.create_connection(address, timeout=timeout_s) as sock:
        try:
            sock.sendall(probe.head + probe.body)
            if not probe.answer_needed:  # a framing the server may wait on: end it here
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # closed on us mid-body (a refusal): its answer may be waiting
        return _status(sock, time.monotonic() + timeout_s)


def _status(sock: socket.socket, deadline: float) -> int | None:
    data = b""
    while b"\r\n" not in data:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return None
        except TimeoutError as exc:
            raise TimeoutError(f"no answer (got {data[:100]!r})") from exc
        if not chunk:
            return None
        data += chunk
    match = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    if match is None:
        raise ValueError(f"not an HTTP answer: {data[:100]!r}")
    return int(match.group(1))


def fuzz(app: Any, address: tuple[str, int], *, auth: Mapping[str, str],
         valid: Mapping[str, str], health: str, host: str | None = None,
         **options: Any) -> list[str]:
    """Send every probe; the failures (a 5xx, no answer where one is due, a hang), and the
    health check's if the server does not answer 200 to it afterwards."""
    fuzzer = Fuzzer(app, valid, auth, host or f"{address[0]}:{address[1]}", **options)
    failures = []
    for probe in fuzzer.probes():
        try:
            status = send(address, probe)
        except (TimeoutError, ValueError, OSError) as exc:
            failures.append(f"{probe.what}: {type(exc).__name__}: {exc}")
            continue
        if (status is None and probe.answer_needed) or (status or 0) >= 500:
            failures.append(f"{probe.what}: {status}")
    check = fuzzer._probe("health afterwards", "GET", health)
    if send(address, check) != 200:
        failures.append(f"GET {health} does not answer 200 after the fuzz")
    return failures


__all__ = ["Fuzzer", "Probe", "fuzz", "send"]
