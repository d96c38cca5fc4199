"""The scripting contract without Docker: every --json command has a valid JSON Schema,
exit codes are documented, no colour when NO_COLOR or not a TTY; and the pure parts of
ci.py (manifest checks, key, auth-key redaction, dpkg parsing)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer

from orchestrator.ci.images_io import read_manifest
from orchestrator.ci.logs import LogWriter
from orchestrator.cli.main import app
from orchestrator.docker.images import parse_dpkg_version
from orchestrator.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
INPUT_SCHEMAS = {"cluster-spec"}  # what hp reads (hp create -f), not a command's --json output


def json_commands() -> Iterator[tuple[str, bool]]:
    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[str, bool]]:
        if hasattr(cmd, "commands"):
            for n, c in cmd.commands.items():
                yield from walk(c, path + [n])
        else:
            yield "-".join(path), any("--json" in p.opts for p in cmd.params)

    return walk(typer.main.get_command(app), [])


def test_every_json_command_has_a_schema_and_every_schema_a_command() -> None:
    with_json = {n for n, j in json_commands() if j}
    files = {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")} - INPUT_SCHEMAS
    assert with_json - files == set(), "commands with --json but no schemas/<command>.schema.json"
    assert files - with_json == set(), "schemas for commands that do not exist (or lost --json)"
    assert {
        "create",
        "list",
        "describe",
        "nodes",
        "delete",
        "version",
        "submit",
        "logs",
        "images-save",
        "images-load",
        "images-key",
    } <= files


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.schema.json")), ids=lambda p: p.name)
def test_schema_is_valid_draft_2020_12(path: Path) -> None:
    doc = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["$schema"].endswith("2020-12/schema") and doc["title"] and doc["type"] == "object"


def test_exit_codes_documented_in_help() -> None:
    assert "0 success, 1 operation failed, 2 bad input, 3 timeout" in (app.info.help or "")


def test_no_colour_without_tty_or_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import output

    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdout", Tty())
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert output.is_tty()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not output.is_tty()
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr(sys, "stdout", open(__file__))  # a file: not a TTY
    assert not output.is_tty()


def _manifest(d: Path, **over: Any) -> None:
    doc = {"Format": 1, "Key": "0" * 24, "File": "hp-images-x.tar", "Sha256": "0" * 64, "Size": 3, "Images": []}
    doc.update(over)
    (d / "manifest.json").write_text(json.dumps(doc))


def test_manifest_problems_are_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="not a directory"):
        read_manifest(tmp_path / "nope")
    with pytest.raises(BadInput, match="manifest.json is missing"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("[1")
    with pytest.raises(BadInput, match="corrupt"):
        read_manifest(tmp_path)
    _manifest(tmp_path, Format=7, Size="big")
    with pytest.raises(BadInput) as e:
        read_manifest(tmp_path)
    assert len(e.value.problems) == 3  # format, Size, missing file: all at once
    _manifest(tmp_path, File="../../etc/passwd")
    with pytest.raises(BadInput, match="missing"):
        read_manifest(tmp_path)
    (tmp_path / "hp-images-x.tar").write_bytes(b"abc")
    _manifest(tmp_path)
    assert read_manifest(tmp_path)["Size"] == 3


def test_log_writer_never_writes_the_auth_key(tmp_path: Path) -> None:
    key = bytes(range(64))
    w = LogWriter(tmp_path, key)
    w.write("a/x.log", b"before " + key + b" after")
    w.json("b.json", {"text": "plain"})
    assert key not in (tmp_path / "a" / "x.log").read_bytes()
    assert b"before" in (tmp_path / "a" / "x.log").read_bytes()
    assert w.files == ["a/x.log", "b.json"]


def test_parse_dpkg_version() -> None:
    status = (
        "Package: slurm-client\nStatus: install ok installed\nVersion: 24.11.5-4\n\n"
        "Package: slurmd\nStatus: install ok installed\nDescription: x\n more\nVersion: 24.11.5-4+deb13u1\n\n"
        "Package: old\nStatus: deinstall ok config-files\nVersion: 1\n"
    )
    assert parse_dpkg_version(status, "slurmd") == "24.11.5-4+deb13u1"
    assert parse_dpkg_version(status, "old") is None
    assert parse_dpkg_version(status, "absent") is None


def test_images_key_needs_no_docker_and_tracks_inputs(tmp_path: Path) -> None:
    import shutil

    from orchestrator import resources
    from orchestrator.ci.images_io import images_key
    from orchestrator.docker.images import Images
    from orchestrator.releases import SlurmRelease

    class E:  # images_key reads only the build contexts
        def __init__(self, root: Path):
            self.root = root

        def images(self, release: SlurmRelease) -> Images:
            return Images(provider=None, release=release, root=self.root)  # type: ignore[arg-type]

    for folder in ("images", "healthchecks"):
        shutil.copytree(resources.root() / folder, tmp_path / folder)
    k1 = images_key(E(tmp_path), SlurmRelease.V24_11)  # type: ignore[arg-type]
    assert k1 == images_key(E(resources.root()), SlurmRelease.V24_11)  # type: ignore[arg-type]
    assert k1.startswith("24.11-") and len(k1) == 6 + 24
    k2 = images_key(E(tmp_path), SlurmRelease.V26_05)  # type: ignore[arg-type]
    assert k2.startswith("26.05-") and k2[6:] != k1[6:]  # the release is in the hash, not only its name
    (tmp_path / "images" / "node" / "hp-entry").write_text("changed")
    assert images_key(E(tmp_path), SlurmRelease.V24_11) != k1  # type: ignore[arg-type]


def test_image_tags_ignore_permission_bits_but_not_the_executable_bit(tmp_path: Path) -> None:
    """A tree unpacked with another umask (git archive: 0664) hashes the same."""
    import shutil

    from orchestrator import resources
    from orchestrator.docker.images import context_hash

    ctx = tmp_path / "node"
    shutil.copytree(resources.images() / "node", ctx)
    before = context_hash(ctx)
    (ctx / "Dockerfile").chmod(0o664)
    (ctx / "hp-entry").chmod(0o775)
    assert context_hash(ctx) == before
    (ctx / "hp-entry").chmod(0o664)  # no longer executable: a different image
    assert context_hash(ctx) != before
