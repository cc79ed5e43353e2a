"""The local daemon: one process per home hosting a ``Trouper`` (the actor system) and an
HTTP gateway (FastAPI + uvicorn) in front of it (docs/daemon.md).

    daemon/files.py     the home's daemon files: token, lock, pid, daemon.json (light)
    daemon/process.py   start, stop, status: the detached process and its lock
    daemon/server.py    what the daemon process runs: lock, socket, Trouper, uvicorn
    daemon/app.py       the FastAPI app: routes and errors
    daemon/service.py   what the routes do with the Trouper (idempotent creates, views)
    daemon/auth.py      the bearer token and the Host/Origin checks, on every route
    daemon/stream.py    the live streams (SSE and WebSocket): replay, follow, limits
    daemon/client.py    the HTTP client: ``Trouper.connect()``
    daemon/sse_reading.py  the client's side of the event stream (parsing, stopping)
    daemon/page/        the web page (plain HTML and JavaScript)

Importing this package imports nothing heavy: the modules above are imported by name.
"""
