"""What trouper's two HTTP servers (the daemon, the remote runtime server) share: one door
and bounds on what one client may cost them.

- ``TokenGuard`` (ASGI, outermost): the bearer token, compared in constant time from the
  headers before anything reads the request; a refusal is answered unread with
  ``Connection: close``, in the server's own error shape (it gives the renderer).
- ``HttpLimits``: the numbers (body and header bytes, read deadlines, connections).
- ``RequestLimits`` (ASGI, around the app): a header block or a declared body over the
  limit is refused from the headers alone, unread; a chunked body is counted as it is read
  and cut at the limit.
- ``guarded_protocol`` (uvicorn's h11 protocol, below the app): connections per client
  address and in all, and deadlines on a request's headers and body, so an idle,
  half-open or trickling connection is dropped.
- ``Notes``: each kind of trouble logged at most once a minute per address, with a count.

The sandbox server (``runtimes/sandbox/server.py``) keeps the same rules its own way: it
is stdlib-only.

Import the pieces from their modules (``serving.token_guard``, ``serving.limits``,
``serving.asgi``, ``serving.protocol``): the package itself imports nothing, so a light
importer of ``Notes`` does not load uvicorn.
"""
