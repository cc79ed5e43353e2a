"""``python -m trouper`` is the ``trouper`` command."""

from .cli.main import main

main(prog_name="trouper")
