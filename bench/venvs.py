"""The bench's own virtual environments, built from the package index on first use.

- ``.venv-openhands``: the OpenHands SDK and its tools. They require Python >= 3.12, so
  this needs a 3.12 (or newer) interpreter on the machine: ``python3.12`` on the PATH,
  a pyenv version, or Debian's. Versions are pinned by ``openhands-constraints.txt``.
- ``.venv-tools``: py-spy, for ``bench/profile_step.py``; any Python.

A venv is reused while its stamp (a hash of what it was built from) still matches.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common import BENCH_DIR, RESULTS_DIR

OPENHANDS_VENV = BENCH_DIR / ".venv-openhands"
OPENHANDS_REQUIREMENTS = ("openhands-sdk==1.58.0", "openhands-tools==1.58.0")
OPENHANDS_CONSTRAINTS = BENCH_DIR / "openhands-constraints.txt"
TOOLS_VENV = BENCH_DIR / ".venv-tools"
TOOLS_REQUIREMENTS = ("py-spy==0.4.3",)
STAMP = "bench-stamp"
INSTALL_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Venv:
    """A ready environment, or why there is none."""

    python: Path | None
    note: str
    """What was done ("reused", "built in 81 s") or why it is missing."""

    @property
    def ready(self) -> bool:
        return self.python is not None


def find_python(minimum: tuple[int, int] = (3, 12)) -> Path | None:
    """An interpreter of at least ``minimum`` that can make venvs, or None."""
    for candidate in _python_candidates(minimum):
        try:
            out = subprocess.run(
                [str(candidate), "-c", "import sys, venv; print(*sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and tuple(map(int, out.stdout.split())) >= minimum:
            return candidate
    return None


def _python_candidates(minimum: tuple[int, int]) -> list[Path]:
    names = [f"python3.{minor}" for minor in range(minimum[1], minimum[1] + 3)]
    found: list[Path] = []
    for name in names:
        path = shutil.which(name)
        if path:
            found.append(Path(path))  # a pyenv shim may refuse: each one is tried
        for folder in ("/usr/bin", "/usr/local/bin"):
            found.append(Path(folder) / name)
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for name in names:
        version = name.removeprefix("python")
        found.extend(
            sorted((pyenv_root / "versions").glob(f"{version}.*/bin/{name}"), reverse=True)
        )
    return [p for p in found if p.exists()]


def _stamp_of(python: Path, requirements: tuple[str, ...], constraints: Path | None) -> str:
    digest = hashlib.sha256(str(python).encode())
    digest.update("\n".join(requirements).encode())
    if constraints is not None:
        digest.update(constraints.read_bytes())
    return digest.hexdigest()[:16]


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(
    venv: Path,
    python: Path,
    requirements: tuple[str, ...],
    constraints: Path | None,
    create: bool,
) -> Venv:
    """The venv at ``venv``, built with ``python`` when missing or stale and ``create``."""
    stamp = _stamp_of(python, requirements, constraints)
    stamp_file = venv / STAMP
    if stamp_file.exists() and stamp_file.read_text().strip() == stamp:
        if _venv_python(venv).exists():
            return Venv(_venv_python(venv), "reused")
    if not create:
        return Venv(None, f"{venv.name} is not built (run without --quick to build it)")
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    log_path = RESULTS_DIR / f"{venv.name.lstrip('.')}-install.log"
    print(f"  building {venv} with {python} (log: {log_path}) ...", flush=True)
    with open(log_path, "w") as log:
        steps = [
            [str(python), "-m", "venv", str(venv)],
            [
                str(_venv_python(venv)),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                *(["-c", str(constraints)] if constraints else []),
                *requirements,
            ],
        ]
        for command in steps:
            code = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S
            ).returncode
            if code != 0:
                return Venv(None, f"`{' '.join(command[:4])} ...` failed ({code}); see {log_path}")
    stamp_file.write_text(stamp + "\n")
    return Venv(_venv_python(venv), f"built in {time.monotonic() - started:.0f} s")


def openhands(create: bool) -> Venv:
    """The OpenHands environment; ``python`` None with the reason when it cannot be had."""
    python = find_python((3, 12))
    if python is None:
        return Venv(
            None,
            "blocked: openhands-sdk requires Python >= 3.12 and this machine has "
            "no Python 3.12+ interpreter (looked for python3.12/3.13/3.14 on the "
            "PATH, in /usr/bin, /usr/local/bin and pyenv's versions)",
        )
    return ensure_venv(
        OPENHANDS_VENV, python, OPENHANDS_REQUIREMENTS, OPENHANDS_CONSTRAINTS, create
    )


def tools(create: bool = True) -> Venv:
    """The venv holding py-spy."""
    return ensure_venv(
        TOOLS_VENV, Path(sys.base_prefix) / "bin" / "python3", TOOLS_REQUIREMENTS, None, create
    )
