"""The suite's own accelerators, not part of trouper: a fork server that starts the
suite's ``python -m trouper ...`` processes and pytest's workers from a zygote that
imported trouper, litellm and pytest once (``forkserver``, ``zygote``, ``forked_process``,
``worker_python``). ``conftest.py`` puts this folder's parent on ``sys.path``, so tests
import it as ``accel``; the zygote, started by its file's path, imports itself under that
name too, so that a process it forks finds its socket in the same ``accel.forkserver``."""
