"""The ``trouper`` command line (docs/cli.md): ``main.py`` declares the group and the
session commands, ``drive.py`` streams one session, ``clients.py`` picks the client a
command talks to, ``reading.py`` the read-only commands, ``daemon.py`` the daemon's,
``runtime_server.py`` the runtime server's, ``scripted.py`` scripted models, ``render.py``
events as terminal lines, ``support.py`` what every command shares (exit codes, errors)."""
