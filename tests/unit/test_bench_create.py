"""bench/create.py's options: every combination its --help offers runs each part it asks
for at least once, or is refused at once with every problem named (exit 2). Issue 46
item 4: `--sizes 180 --first-runs 0` measured, then crashed on a median of no runs.

bench/ is a folder of scripts: the module is loaded from its file with bench/ on sys.path
(its own imports, `benchdocs` and `common`, are its neighbours); nothing runs at import."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def create(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_create", ROOT / "bench" / "create.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(create: ModuleType, monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> list[tuple[str, Any]]:
    """main() with each part replaced by a recorder that holds it to at least one run."""
    calls: list[tuple[str, Any]] = []

    def part(name: str, *counted: int) -> Any:
        def record(*args: Any) -> None:
            for i in counted:
                assert args[i] >= 1 if isinstance(args[i], int) else args[i], (name, args)
            calls.append((name, args))

        return record

    monkeypatch.setattr(create, "lifecycle_cost", part("lifecycle", 0, 1))
    monkeypatch.setattr(create, "sizes_vs_floor", part("sizes", 0, 1))
    monkeypatch.setattr(create, "first_job", part("first_job", 0))
    monkeypatch.setattr(create, "accounting_cost", part("accounting", 0))
    monkeypatch.setattr(create, "overhead", part("overhead", 0))
    monkeypatch.setattr(sys, "argv", ["bench/create.py", *argv])
    create.main()
    return calls


def test_the_issues_command_skips_the_first_job_and_runs_the_rest(create, monkeypatch) -> None:
    calls = run(create, monkeypatch, ["--sizes", "180", "--first-runs", "0", "--acct-runs", "0"])
    assert [c[0] for c in calls] == ["sizes", "overhead"] and calls[0][1] == ([180], 2)
    calls = run(create, monkeypatch, ["--sizes", "none", "--acct-runs", "0", "--overhead-runs", "0"])
    assert calls == [("first_job", (3,))]  # the first job no longer needs --sizes


def test_every_combination_runs_or_is_refused_at_once(create, monkeypatch, capsys) -> None:
    grid = itertools.product(
        ("4", "4,16", "none", "0", "x", ""),  # --sizes
        (-1, 0, 1),  # --repeat
        (-1, 0, 2),  # --first-runs
        (0, 1),  # --acct-runs
        (0, 1),  # --overhead-runs
        (0, 2),  # --lifecycle
        (0, 1),  # --lifecycle-runs
        ("cpu.small", ""),  # --lifecycle-types
    )
    ran = refused = 0
    for sizes, repeat, first, acct, over, lc, lc_runs, lc_types in grid:
        argv = [f"--sizes={sizes}", f"--repeat={repeat}", f"--first-runs={first}", f"--acct-runs={acct}"]
        argv += [f"--overhead-runs={over}", f"--lifecycle={lc}", f"--lifecycle-runs={lc_runs}"]
        argv += [f"--lifecycle-types={lc_types}"]
        bad = {
            "--sizes": sizes in ("0", "x", ""),
            "--repeat": repeat < 1,
            "--first-runs": first < 0,
            "--lifecycle-runs": lc > 0 and lc_runs < 1,
            "--lifecycle-types": lc > 0 and not lc_types,
        }
        capsys.readouterr()
        try:
            calls = run(create, monkeypatch, argv)
        except SystemExit as e:
            err = capsys.readouterr().err
            assert e.code == 2 and any(bad.values()), (argv, err)
            assert all(opt in err for opt, b in bad.items() if b), (argv, err)  # every problem named
            refused += 1
            continue
        assert not any(bad.values()), argv
        want = (["lifecycle"] if lc else []) + (["sizes"] if sizes != "none" else [])
        want += (["first_job"] if first else []) + (["accounting"] if acct else []) + (["overhead"] if over else [])
        assert [c[0] for c in calls] == want, argv
        ran += 1
    assert ran and refused
