"""``os.path.realpath`` for the many paths a confinement denies, at one ``lstat`` a path."""

from __future__ import annotations

import os
import stat
from typing import Iterable


class Resolver:
    """``os.path.realpath`` of many paths, and whether each exists, at one ``lstat`` a
    path: a folder shared by several (the home of ``~/.ssh``, ``~/.aws``...) is resolved
    once, where ``realpath`` checks every component of every path. Answers are kept for
    the resolver's life: use a new one for each prepare (files change between two)."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, bool]] = {"/": ("/", True)}

    def real(self, path: str) -> str:
        """``os.path.realpath(path)``."""
        return self.resolve(path)[0]

    def existing(self, paths: Iterable[str]) -> list[str]:
        """The real paths of ``paths`` that exist (a dangling symlink does not), sorted."""
        return sorted({real for real, exists in map(self.resolve, paths) if exists})

    def resolve(self, path: str) -> tuple[str, bool]:
        """``(os.path.realpath(path), os.path.lexists(of that))``."""
        known = self._known.get(path)
        if known is not None:
            return known
        head, _, tail = path.rpartition("/")
        if (path[:1] != "/" or tail in ("", ".", "..") or "//" in path or "/./" in path
                or "/../" in path):  # not in normal form: realpath itself
            real = os.path.realpath(path)
            found = (real, os.path.lexists(real))
        else:
            base, exists = self.resolve(head or "/")
            found = ((base if base != "/" else "") + "/" + tail, False)
            if exists:  # else neither is anything beneath it
                try:
                    mode = os.lstat(found[0]).st_mode
                except OSError:
                    pass
                else:
                    if stat.S_ISLNK(mode):
                        real = os.path.realpath(path)
                        found = (real, os.path.lexists(real))
                    else:
                        found = (found[0], True)
        self._known[path] = found
        return found
