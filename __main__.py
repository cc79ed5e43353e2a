"""``python -m trouper`` is the ``trouper`` command."""

from .cli import main

main(prog_name="trouper")
