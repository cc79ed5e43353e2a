"""LoopSelector answers Thespian's loop as the epoll selector did: readiness per
descriptor and direction, a timeout, and EBADF for a closed descriptor."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from trouper.actors.transport_loop import EVENT_READ, EVENT_WRITE, LoopSelector, install


def test_readable_and_writable_are_reported_per_descriptor():
    a, b = socket.socketpair()
    try:
        sel = LoopSelector()
        sel.register(a.fileno(), EVENT_READ)
        sel.register(b.fileno(), EVENT_WRITE)
        assert [(k.fd, e) for k, e in sel.select(0)] == [(b.fileno(), EVENT_WRITE)]
        b.send(b"x")
        sel = LoopSelector()
        sel.register(a.fileno(), EVENT_READ)
        sel.register(a.fileno(), EVENT_WRITE)  # both ways on one descriptor
        assert [(k.fd, e) for k, e in sel.select(1)] == [(a.fileno(), EVENT_READ | EVENT_WRITE)]
        sel.close()
    finally:
        a.close()
        b.close()


def test_nothing_ready_waits_for_the_timeout_and_returns_nothing():
    r, w = os.pipe()
    try:
        sel = LoopSelector()
        sel.register(r, EVENT_READ)
        assert sel.select(0.01) == []
    finally:
        os.close(r)
        os.close(w)


def test_a_closed_descriptor_raises_ebadf_as_epoll_did():
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    sel = LoopSelector()
    sel.register(r, EVENT_READ)
    with pytest.raises(OSError) as raised:
        sel.select(0)
    assert raised.value.errno == errno.EBADF


def test_a_peer_that_hangs_up_is_readable():
    a, b = socket.socketpair()
    b.close()
    try:
        sel = LoopSelector()
        sel.register(a.fileno(), EVENT_READ)
        assert [e for _, e in sel.select(0)] == [EVENT_READ]
    finally:
        a.close()


def test_install_finds_thespians_loop_and_is_idempotent(monkeypatch):
    from thespian.system.transport import TCPTransport

    monkeypatch.setattr(TCPTransport, "selectors", TCPTransport.selectors)  # restored after
    assert install() and install()
    assert TCPTransport.selectors.DefaultSelector is LoopSelector
