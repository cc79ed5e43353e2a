"""A cluster of daemons over a shared PostgreSQL store (docs/cluster.md): membership and
heartbeats (``registry``, ``member``), calls between daemons (``calls``), the cluster key
(``key``), and what a daemon records when it takes a session over (``takeover``)."""
