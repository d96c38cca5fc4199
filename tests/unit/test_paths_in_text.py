"""No comment names a file that does not exist: the repository paths named in the
comments and docstrings of orchestrator/, tests/, bench/ and scripts/, and in docs/*.md,
are checked against the tree."""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("orchestrator", "tests", "bench", "scripts")
TOP = ("orchestrator", "tests", "bench", "scripts", "docs", "schemas", "images", "slurm-conf", "healthchecks")
SUFFIXES = (".py", ".md", ".c", ".sh", ".yaml", ".tmpl", ".json")
BARE_SUFFIXES = (".py", ".c", ".tmpl")  # a bare name of hp's source: some file of the tree has it
# Where a relative path is looked for: the tree's root, the package (`slurm/model.py`), the
# package's data folder (`images/node/...`), the tests, and the folder of the text naming it.
BASES = (ROOT, ROOT / "orchestrator", ROOT / "orchestrator" / "data", ROOT / "tests")
# Paths named on purpose that are not the tree's, each with its reason.
NOT_OURS = {
    "orchestrator/_resources/": "where an installed wheel holds images/, slurm-conf/, healthchecks/ (hatchling's force-include)",
    "src/": "Slurm's source tree (what gpu/gres.py follows)",
    "../shared/": "the lab's folder beside the checkout (notes on the lent GPU host)",
    "./on_create.sh": "the command a node runs in its copy of a user's lifecycle folder",
    "record.py": "the one-off script that recorded the Docker fixtures (not kept)",
    "tests/fixtures/gpu-h200-device/": "where a bundle captured on a GPU host is to be kept (docs/gpu.md)",
}
CANDIDATE = re.compile(r"(?<![\w:/.~$<{@-])[\w.*-]+(?:/[\w.*-]+)*/?(?::\d+(?:-\d+)?)?")


def candidates(text: str, prose: bool = True) -> list[str]:
    """The words of `text` that look like paths of the tree: with a / and a top folder; in
    prose (not a code example, whose files are a user's) also with a / and a file suffix,
    or a bare name of hp's source."""
    out = []
    for m in CANDIDATE.finditer(text):
        word = re.sub(r":\d+(-\d+)?$", "", m.group(0)).rstrip(".-")
        if m.end() < len(text) and text[m.end()] in "<{$":
            continue  # a pattern: clusters/<name>/..., {home}/...
        top = word.split("/", 1)[0]
        if "/" in word and (top in TOP or (prose and word.endswith(SUFFIXES))):
            out.append(word)
        elif prose and "/" not in word and word.endswith(BARE_SUFFIXES) and not word.startswith("."):
            out.append(word)
    return out


def exists(word: str, where: Path) -> bool:
    if word.startswith(tuple(NOT_OURS)):
        return True
    if word.startswith("../"):  # beside the text's folder
        return (where / word).exists()
    if "/" not in word:
        return word in tree_names()
    bases = (*BASES, where)
    if "*" in word:
        return any(any(b.glob(word.rstrip("/"))) for b in bases)
    return any((b / word.rstrip("/")).exists() for b in bases)


@functools.cache
def tree_names() -> frozenset[str]:
    """The file names of the tree (not of the virtual environment, caches, builds)."""
    names = set()
    for _, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__" and not d.endswith(".egg-info")]
        names |= set(files)
    return frozenset(names)


def python_text(p: Path) -> list[tuple[int, str]]:
    """(line, text) of the comments and docstrings (and other bare string statements)."""
    src = p.read_text()
    out = [
        (t.start[0], t.string)
        for t in tokenize.generate_tokens(io.StringIO(src).readline)
        if t.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.append((node.lineno, node.value.value))
    return out


def shell_text(p: Path) -> list[tuple[int, str]]:
    return [(i, ln[ln.index("#") :]) for i, ln in enumerate(p.read_text().splitlines(), 1) if "#" in ln]


def texts() -> list[tuple[Path, int, str, bool]]:
    """(file, line, text, prose) of every comment, docstring and document line scanned."""
    out: list[tuple[Path, int, str, bool]] = []
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*")):
            if "__pycache__" in p.parts or not p.is_file():
                continue
            if p.suffix == ".py":
                out += [(p, i, t, True) for i, t in python_text(p)]
            elif p.suffix == ".sh":
                out += [(p, i, t, True) for i, t in shell_text(p)]
    for p in sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "tests").rglob("*.md")):
        out += markdown_text(p)
    return out


def markdown_text(p: Path) -> list[tuple[Path, int, str, bool]]:
    """Each line, and whether it is prose (not inside a ``` example)."""
    out, prose = [], True
    for i, ln in enumerate(p.read_text().splitlines(), 1):
        if ln.lstrip().startswith("```"):
            prose = not prose
            continue
        out.append((p, i, ln, prose))
    return out


def strip_urls(text: str) -> str:
    return re.sub(r"\w+://\S+", " ", text)


def test_paths_named_in_comments_and_docs_exist() -> None:
    named = [(p, line, word) for p, line, text, prose in texts() for word in candidates(strip_urls(text), prose)]
    missing = [f"{p.relative_to(ROOT)}:{line}: {word}" for p, line, word in named if not exists(word, p.parent)]
    stale = [k for k in NOT_OURS if not any(word.startswith(k) for _, _, word in named)]
    assert missing == [] and stale == []


def test_the_scanner_finds_paths_and_leaves_other_words() -> None:
    assert candidates("see orchestrator/spec/loader.py:5-6 and slurm/model.py, `x.py`.") == [
        "orchestrator/spec/loader.py",
        "slurm/model.py",
        "x.py",
    ]
    assert candidates("a/b, and/or, 1/2 s, clusters/<name>/agent.log, e.g. and i.e., lab.yaml") == []
    assert candidates("/etc/slurm/slurm.conf ~/.hp/x.py") == []  # absolute: not the tree's
    assert candidates("hp create -f train.py", prose=False) == []
    assert not exists("orchestrator/nowhere.py", ROOT) and not exists("nowhere_at_all.py", ROOT)
    assert exists("tests/unit/test_*.py", ROOT) and exists("slurm/model.py", ROOT / "docs")
