"""What trouper tells about itself in production: Prometheus metrics and OpenTelemetry
traces (``tracing.py``: on only when an OTLP endpoint is set).

``metrics.py`` records them where things happen (the actor processes), ``folder.py``
keeps the shared folder they are written to, ``exposition.py`` renders the text any
program may serve (the daemon's ``GET /metrics``). docs/operations.md, "Metrics", lists
every metric and says why they travel through files.
"""
