"""bench/benchdocs.py: the benchmarks' own sections of docs/benchmarks.md (`--write-docs`).

bench/ is a folder of scripts, not a package: the module is loaded from its file (the
recipe of importlib's documentation), without adding bench/ to sys.path."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("benchdocs", ROOT / "bench" / "benchdocs.py")
assert _SPEC is not None and _SPEC.loader is not None
benchdocs = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = benchdocs  # dataclasses look their module up there
_SPEC.loader.exec_module(benchdocs)

MACHINE = benchdocs.Machine(
    cores=2, memory_gib=23.5, os="Debian GNU/Linux 12 (bookworm)", kernel="6.1.0", docker="20.10.24"
)
DOC = """# Benchmarks

Intro that names the markers: `<!-- bench:create -->` in a code span is not a marker.

## create

<!-- bench:create -->
old create figures
<!-- /bench:create -->

## create-accounting

<!-- bench:create-accounting -->
accounting figures
<!-- /bench:create-accounting -->

Text after the sections stays.
"""


def test_replacing_a_section_changes_only_that_section() -> None:
    out = benchdocs.replace_section(DOC, "create", "new create figures")
    assert benchdocs.section_body(out, "create") == "new create figures"
    assert benchdocs.section_body(out, "create-accounting") == "accounting figures"
    assert out == DOC.replace("old create figures", "new create figures")


def test_replacing_is_idempotent() -> None:
    once = benchdocs.replace_section(DOC, "create", "new\nfigures")
    assert benchdocs.replace_section(once, "create", "new\nfigures") == once


def test_an_absent_section_is_appended_under_its_heading_and_then_replaced_in_place() -> None:
    out = benchdocs.replace_section(DOC, "recovery", "kill-to-idle 0.7 s", title="recovery: bench/recovery.py")
    assert out.startswith(DOC.rstrip())
    assert out.endswith(
        "## recovery: bench/recovery.py\n\n<!-- bench:recovery -->\nkill-to-idle 0.7 s\n<!-- /bench:recovery -->\n"
    )
    again = benchdocs.replace_section(out, "recovery", "kill-to-idle 0.6 s")
    assert again == out.replace("0.7 s", "0.6 s")
    assert benchdocs.replace_section("", "ci", "x") == "## ci\n\n<!-- bench:ci -->\nx\n<!-- /bench:ci -->\n"


@pytest.mark.parametrize(
    "text",
    [
        "<!-- bench:create -->\nno end\n",
        "<!-- /bench:create -->\n<!-- bench:create -->\n",
        "<!-- bench:create -->\na\n<!-- /bench:create -->\n<!-- bench:create -->\nb\n<!-- /bench:create -->\n",
    ],
)
def test_broken_markers_are_refused_not_guessed(text: str) -> None:
    with pytest.raises(ValueError, match="create"):
        benchdocs.replace_section(text, "create", "x")


def test_a_section_name_is_a_plain_word() -> None:
    with pytest.raises(ValueError):
        benchdocs.replace_section(DOC, "create -->", "x")


def test_the_header_names_date_commit_machine_and_command() -> None:
    when = datetime.datetime(2026, 12, 3, 9, 5, tzinfo=datetime.UTC)
    head = benchdocs.header(when, "abc1234-dirty", MACHINE, "bench/create.py --sizes 4")
    assert head == (
        "Measured 2026-12-03 09:05 UTC at commit `abc1234-dirty` on 2 cores, 23.5 GiB memory, "
        "Debian GNU/Linux 12 (bookworm) (Linux 6.1.0), Docker 20.10.24, with `bench/create.py --sizes 4`:"
    )
    body = benchdocs.render(head, "N floor hp\n4 5.0 5.6\n\n")
    assert body == f"{head}\n\n```text\nN floor hp\n4 5.0 5.6\n```"
    assert benchdocs.render(head, "").endswith("```text\n(no output)\n```")


def test_machine_facts_come_from_the_system_files_and_no_host_name(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24641536 kB\nMemFree: 1 kB\n")
    osr = tmp_path / "os-release"
    osr.write_text('NAME="Debian GNU/Linux"\nPRETTY_NAME="Debian GNU/Linux 13 (trixie)"\n')
    m = benchdocs.machine(meminfo, osr, lambda: "20.10.24")
    assert m.memory_gib == pytest.approx(23.5, abs=0.01)
    assert m.os == "Debian GNU/Linux 13 (trixie)"
    assert m.docker == "20.10.24"
    assert m.cores >= 1
    assert socket.gethostname() not in str(m)


def test_the_commit_is_heads_short_hash_and_dirty_when_a_tracked_file_changed(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    (tmp_path / "docs").mkdir()
    (tmp_path / "a.txt").write_text("1")
    (tmp_path / "docs" / "benchmarks.md").write_text("x")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    short = git("rev-parse", "--short", "HEAD")
    assert benchdocs.commit(tmp_path) == short
    (tmp_path / "docs" / "benchmarks.md").write_text("a bench wrote its section")
    (tmp_path / "untracked.txt").write_text("new")
    assert benchdocs.commit(tmp_path) == short  # neither the figures nor an untracked file
    (tmp_path / "a.txt").write_text("2")
    assert benchdocs.commit(tmp_path) == f"{short}-dirty"
    assert benchdocs.commit(tmp_path / "docs" / "nowhere") == "unknown"


def test_write_docs_writes_what_the_block_printed_and_only_when_it_ended_well(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOC)
    monkeypatch.setattr(sys, "argv", ["bench/create.py", "--sizes", "4", "--write-docs"])
    monkeypatch.setattr(benchdocs, "commit", lambda: "abc1234")
    ap = argparse.ArgumentParser()
    benchdocs.add_option(ap)
    assert ap.parse_args(["--write-docs"]).write_docs and not ap.parse_args([]).write_docs

    with benchdocs.section("create", False, doc=doc, facts=lambda: MACHINE):
        print("not recorded")
    assert doc.read_text() == DOC

    with benchdocs.section("create", True, doc=doc, facts=lambda: MACHINE):
        print("   4      5.00      5.60    1.12")
    body = benchdocs.section_body(doc.read_text(), "create")
    assert re.fullmatch(
        r"Measured \d{4}-\d\d-\d\d \d\d:\d\d UTC at commit `abc1234` on 2 cores, 23.5 GiB memory, .*Docker 20.10.24, "
        r"with `bench/create.py --sizes 4`:\n\n```text\n   4      5.00      5.60    1.12\n```",
        body or "",
    )
    assert benchdocs.section_body(doc.read_text(), "create-accounting") == "accounting figures"
    assert "   4      5.00      5.60    1.12" in capsys.readouterr().out  # still printed as usual
    written = doc.read_text()

    with pytest.raises(RuntimeError), benchdocs.section("create", True, doc=doc, facts=lambda: MACHINE):
        print("half a run")
        raise RuntimeError("the bench failed")
    with benchdocs.section("create", True, doc=doc, facts=lambda: MACHINE) as rec:
        print("nothing measured here")
        rec.discard()
    assert doc.read_text() == written
    assert sys.stdout is not None and "half a run" in capsys.readouterr().out


def test_every_benchmark_that_prints_figures_can_write_them() -> None:
    scripts = sorted(
        p for p in (ROOT / "bench").glob("*.py") if p.name not in ("benchdocs.py", "common.py", "floorrun.py")
    )
    assert scripts
    lacking = [
        p.name
        for p in scripts
        if "benchdocs.add_option(" not in p.read_text() or "benchdocs.section(" not in p.read_text()
    ]
    assert lacking == []


def test_the_sections_of_docs_benchmarks_md_are_well_formed_and_dated() -> None:
    """Every section has its date and commit, or says it was not measured yet."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    names = re.findall(r"^<!-- bench:([a-z0-9-]+) -->$", text, re.M)
    assert names and len(names) == len(set(names))
    for name in names:
        body = benchdocs.section_body(text, name)
        assert body is not None
        if body.startswith("Not measured yet"):
            continue
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", body), name
        assert re.search(r"commit `[0-9a-f]{7,}(-dirty)?`", body), name
