"""The Python API, one face for every client (``protocol.py``): ``embedded.py``'s
``Trouper`` runs an actor system in your process (``actor_system.py``, supervised by
``root_watch.py``), ``daemon.py``'s ``RemoteTrouper`` talks to a daemon, ``store_reader.py``
reads a home's store with no actor system; ``session.py`` is an embedded session's
handle, ``info.py`` what every client tells of a session, ``checks.py`` what ``Trouper``
checks of its arguments."""
