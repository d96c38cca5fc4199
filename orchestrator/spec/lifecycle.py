"""LifeCycleConfig, HyperPod's lifecycle scripts, from a local folder: its rules and
where the folder is.

`SourceS3Uri` names a folder on this machine: a path (relative to the spec file's
folder) or a file:// URI. An s3:// URI is refused (hp reaches no S3). `OnCreate` is a
file in that folder, run with bash as root on each node of the group before its Slurm
daemon starts (core/lifecycle.py copies the folder in); `OnCreateTimeout` (hp's own)
bounds it, in seconds.

The folder is resolved when the spec is validated and recorded as an absolute path:
a replaced node later runs the folder as it is then (HyperPod reads S3 again too).
The folder is read whole into every node, so its size is bounded.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

TIMEOUT_DEFAULT = 600  # s: HyperPod gives a lifecycle script minutes; hp bounds it
TIMEOUT_MAX = 3600
MAX_FILES = 1000
MAX_BYTES = 32 * 2**20  # copied into every node of the group


def source_path(uri: str, base: Path) -> tuple[Path | None, str | None]:
    """(the folder's absolute path, or the reason it cannot be one)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        return (
            None,
            "an s3:// URI cannot be read: hp reaches no S3; give a local folder (relative to the spec file) or a file:// URI",
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            return None, f"a file:// URI names a folder on this machine, not on {parts.netloc!r}"
        return Path(unquote(parts.path)), None
    if scheme and len(scheme) > 1:  # (one letter: a Windows drive, not a scheme)
        return None, f"only a local folder or a file:// URI is read, not {scheme}://"
    if not uri:
        return None, "must name a folder"
    return (base / uri), None


def script_problem(script: str) -> str | None:
    """Why OnCreate cannot name a file inside the folder, or None."""
    if not script:
        return "must name a script in the folder"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in script):
        return f"{script!r} holds a control character"
    p = PurePosixPath(script)
    if p.is_absolute() or ".." in p.parts:
        return f"{script!r} must be a path inside SourceS3Uri's folder (no leading / and no ..)"
    return None


def folder_files(folder: Path) -> list[tuple[str, Path]]:
    """(path relative to the folder, file) of every regular file under it (symbolic
    links followed; a link to a folder is not walked); OSError/ValueError when it cannot
    be read or is over the bounds."""
    out: list[tuple[str, Path]] = []
    total = 0
    for root, _dirs, files in os.walk(folder, onerror=_raise):
        for f in sorted(files):
            p = Path(root) / f
            st = p.stat()
            if not stat.S_ISREG(st.st_mode):
                continue
            total += st.st_size
            out.append((p.relative_to(folder).as_posix(), p))
            if len(out) > MAX_FILES:
                raise ValueError(f"holds more than {MAX_FILES} files (it is copied into every node)")
            if total > MAX_BYTES:
                raise ValueError(f"holds more than {MAX_BYTES // 2**20} MiB (it is copied into every node)")
    return out


def _raise(e: OSError) -> None:
    raise e


def resolve(raw_groups: list[Any], base: Path) -> tuple[list[Any], list[str]]:
    """The groups with each LifeCycleConfig's folder made absolute, and every problem of
    their LifeCycleConfigs (each named with its path in the spec)."""
    problems: list[str] = []
    out = []
    for i, g in enumerate(raw_groups):
        lc = g.get("LifeCycleConfig") if isinstance(g, dict) else None
        if not isinstance(lc, dict):
            out.append(g)
            continue
        path = f"InstanceGroups[{i}].LifeCycleConfig"
        lc = dict(lc)
        uri, script, limit = lc.get("SourceS3Uri"), lc.get("OnCreate"), lc.get("OnCreateTimeout")
        folder = None
        if isinstance(uri, str):
            folder, why = source_path(uri, base)
            if why:
                problems.append(f"{path}.SourceS3Uri: {why} (got {uri!r})")
            elif folder is not None:
                folder = Path(os.path.abspath(folder))
                if not folder.is_dir():
                    problems.append(f"{path}.SourceS3Uri: no folder {str(folder)!r}")
                    folder = None
                else:
                    try:
                        folder_files(folder)
                    except (OSError, ValueError) as e:
                        problems.append(f"{path}.SourceS3Uri: the folder {str(folder)!r} {_reason(e)}")
                    lc["SourceS3Uri"] = str(folder)
        if isinstance(script, str):
            if why := script_problem(script):
                problems.append(f"{path}.OnCreate: {why}")
            elif folder is not None:
                f = folder / script
                inside = Path(os.path.realpath(f)).is_relative_to(os.path.realpath(folder))
                if not f.is_file() or not inside:
                    problems.append(f"{path}.OnCreate: {script!r} is not a file in {str(folder)!r}")
        if isinstance(limit, int) and not isinstance(limit, bool) and not 1 <= limit <= TIMEOUT_MAX:
            problems.append(f"{path}.OnCreateTimeout: must be between 1 and {TIMEOUT_MAX} seconds, got {limit}")
        out.append({**g, "LifeCycleConfig": lc})
    return out, problems


def _reason(e: Exception) -> str:
    if isinstance(e, OSError):
        return f"cannot be read: {e.strerror or e}"
    return str(e)
