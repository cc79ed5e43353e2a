"""docs/promises.md stays true to the suite: every test it names exists.

The page lists, under each promise (I1-I7), the tests that attack it. A test renamed,
split or removed would leave the page naming nothing; these checks fail instead. Read
statically (``ast``, no import), so they cost milliseconds. They also hold that each
promise has its section and its tests, that links into the page land on a heading, and
that a file citing a promise by number names the page, where the numbers are defined.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "promises.md"
PROMISES = [f"I{n}" for n in range(1, 8)]

CITED = re.compile(r"`(tests/[\w/]+\.py(?:::[^`\s]+)?)`")
"""A test named in backticks: ``tests/test_x.py``, ``...::test_y``, ``...::Class::test_y``,
with or without a parametrised id (``test_y[case]``)."""
NUMBER = re.compile(r"\bI[1-7]\b")
LINK = re.compile(r"promises\.md#([\w-]+)")
OUT_LINK = re.compile(r"\]\(([\w.-]+\.md)(?:#([\w-]+))?\)")
"""A link from the page to another doc, with its fragment if it has one."""


def cited(text: str) -> list[str]:
    """The tests ``text`` names, in order, each once."""
    return list(dict.fromkeys(CITED.findall(text)))


@functools.cache
def _module(path: Path) -> ast.Module | None:
    return ast.parse(path.read_text()) if path.is_file() else None


def _class(module: ast.Module, name: str) -> ast.ClassDef | None:
    return next((node for node in module.body
                 if isinstance(node, ast.ClassDef) and node.name == name), None)


def _imported_from(module: ast.Module, name: str) -> Path | None:
    """The file of the package module ``name`` is imported from (``from trouper.x import``)."""
    for node in module.body:
        if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trouper.")
                and any((alias.asname or alias.name) == name for alias in node.names)):
            return ROOT.joinpath(*node.module.split(".")[1:]).with_suffix(".py")
    return None


def _has_method(module: ast.Module, class_name: str, method: str, depth: int = 0) -> bool:
    """Whether the class defines ``method`` or inherits it from a base defined in the same
    file or imported from the package (a contract suite such as ``SandboxContract``)."""
    found = _class(module, class_name)
    if found is None or depth > 5:
        return False
    if any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == method
           for node in found.body):
        return True
    for base in found.bases:
        if not isinstance(base, ast.Name):
            continue
        home = module if _class(module, base.id) else None
        origin = _imported_from(module, base.id)
        if home is None and origin is not None:
            home = _module(origin)
        if home is not None and _has_method(home, base.id, method, depth + 1):
            return True
    return False


def missing(name: str) -> str | None:
    """Why the cited test ``name`` does not exist, or None when it does."""
    file, *parts = name.split("::")
    module = _module(ROOT / file)
    if module is None:
        return f"{name}: no file {file}"
    if not parts:
        return None
    parts[-1] = parts[-1].split("[")[0]  # a parametrised id names its function
    if len(parts) == 1:
        if any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
               and node.name == parts[0] for node in module.body):
            return None
        return f"{name}: no function {parts[0]} in {file}"
    if len(parts) == 2 and _has_method(module, *parts):
        return None
    return f"{name}: no {'.'.join(parts)} in {file}"


def sections(text: str) -> dict[str, str]:
    """Each ``## `` heading's text -> the section under it."""
    found: dict[str, str] = {}
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        heading, _, body = block.partition("\n")
        found[heading.strip()] = body
    return found


def anchor(heading: str) -> str:
    """The fragment a Markdown renderer gives ``heading`` (GitHub's rule)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The fragments of every heading of a Markdown text."""
    return {anchor(heading) for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                         check=True, timeout=60).stdout.decode()
    return [ROOT / name for name in out.split("\0")
            if name.endswith((".py", ".md")) and (ROOT / name).is_file()]


def test_every_test_the_page_names_exists():
    names = cited(PAGE.read_text())
    assert len(names) >= 40, f"the page names only {len(names)} tests"
    assert [why for why in map(missing, names) if why] == []


def test_each_promise_has_its_section_and_tests():
    found = sections(PAGE.read_text())
    for promise in PROMISES:
        heading = next((h for h in found if h.split()[0] == promise), None)
        assert heading is not None, f"docs/promises.md has no '## {promise} ...' section"
        assert len(cited(found[heading])) >= 3, f"{heading}: fewer than 3 tests named"


def test_links_into_the_page_land_on_a_heading():
    ours = anchors(PAGE.read_text())
    broken = [f"{path.relative_to(ROOT)}: #{fragment}"
              for path in _tracked() for fragment in LINK.findall(path.read_text())
              if fragment not in ours]
    assert broken == []


def test_the_pages_links_land_on_a_file_and_a_heading():
    broken = []
    for target, fragment in OUT_LINK.findall(PAGE.read_text()):
        doc = PAGE.parent / target
        if not doc.is_file() or (fragment and fragment not in anchors(doc.read_text())):
            broken.append(f"{target}#{fragment}" if fragment else target)
    assert broken == []


def test_a_file_that_cites_a_promise_by_number_names_the_page():
    """``(I2)`` in a docstring, a comment or a doc means docs/promises.md: say so there."""
    silent = [str(path.relative_to(ROOT)) for path in _tracked()
              if path != PAGE and NUMBER.search(path.read_text())
              and "promises.md" not in path.read_text()]
    assert silent == [], "name docs/promises.md where these cite a promise by number"


def test_nothing_points_at_a_design_file_outside_the_repository():
    outside = [str(path.relative_to(ROOT)) for path in _tracked()
               if "DESIGN.md" in path.read_text() and path != Path(__file__)]
    assert outside == [], "the promises are in docs/promises.md"


def test_the_checks_catch_a_wrong_name():
    """The checker itself: what exists passes, each kind of wrong name is caught."""
    here = "tests/test_docs_promises.py"
    contract = "tests/test_runtime_contract.py::TestLocalSandboxContract"
    text = (f"`{here}::test_the_checks_catch_a_wrong_name` "
            "`tests/test_sandbox_files.py::test_paths_outside_the_workspace_are_refused[..]` "
            f"`{contract}::test_an_action_id_runs_once` "
            f"`{here}::test_no_such_test` `tests/test_no_such_file.py::test_x` "
            f"`{contract}::test_no_such_method` "
            "`tests/test_runtime_contract.py::NoSuchClass::test_an_action_id_runs_once`")
    problems = [missing(name) for name in cited(text)]
    assert problems[:3] == [None, None, None]
    assert all(problems[3:]) and len(problems) == 7
    assert anchor("I6 Bad input gets a clear error, and nothing is lost") == (
        "i6-bad-input-gets-a-clear-error-and-nothing-is-lost")
    assert NUMBER.search("a fold over its log (I3).") and not NUMBER.search("IDs, I10, AI2")
