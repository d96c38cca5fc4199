"""Read a cluster spec file safely: bounded size, strict UTF-8, YAML or JSON with
duplicate keys refused, YAML aliases budgeted, nesting depth and value count bounded.
Returns plain JSON-like data (dict with str keys, list, str, int, float, bool, None).

Every problem is a BadInput (exit 2) that names the file and, where there is one, the
line. The bounds are checked while the document is read, never after: a YAML alias bomb
("billion laughs") is refused when the expanded count crosses MAX_VALUES, before
anything is built, so it costs milliseconds and kilobytes whether it sits under Tags or
is used as an InstanceCount.

Decisions:
- YAML aliases are allowed (anchors for repeated groups are a reasonable use), but at
  most MAX_ALIASES of them, and every alias counts as the full size of what it refers to
  against MAX_VALUES and MAX_DEPTH. A recursive alias is refused.
- Only JSON's types come out: implicit timestamps stay strings (2024-01-01 is a str),
  and tags that build other types (!!binary, !!set, !!omap, !!pairs, !!timestamp,
  !!python/..., local !tags) are refused. Mapping keys must be strings. NaN and
  infinities are refused (JSON has none, and the spec is stored as JSON).
- Duplicate keys are refused in YAML mappings and JSON objects (the last one used to
  win silently). YAML merge keys (<<: *base) are not duplicates: explicit keys override
  merged ones, as YAML says.
- Files ending in .json are read as JSON, everything else as YAML (which also reads
  JSON, with the same rules).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable
from json.decoder import JSONDecodeError, scanstring
from json.scanner import py_make_scanner
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from ..errors import BadInput

MAX_BYTES = 1024 * 1024  # a real spec is a few KiB; HyperPod's API takes far less per request
MAX_VALUES = 10_000  # scalars, lists and mappings (keys included), after alias expansion
MAX_DEPTH = 32  # a spec is 5 deep; free-form fields (Tags, LifeCycleConfig) get room
MAX_ALIASES = 100  # YAML *alias uses in one document
WHAT = "invalid cluster spec"

_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge")}
_WS = re.compile(r"[ \t\n\r]*")

try:  # libyaml scans (fast, in C); composing stays in Python so the budgets apply
    from yaml._yaml import CParser as _Parser  # type: ignore[import-not-found]

    def _make_parser(self: Any, text: str) -> None:
        _Parser.__init__(self, text)
except ImportError:  # PyYAML without libyaml: the same, in Python (tested by forcing it)
    from yaml.parser import Parser as _YParser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _PyParser(Reader, Scanner, _YParser):  # type: ignore[misc]
        def __init__(self, text: str) -> None:
            Reader.__init__(self, text)
            Scanner.__init__(self)
            _YParser.__init__(self)

    _Parser = _PyParser  # type: ignore[misc]

    def _make_parser(self: Any, text: str) -> None:
        _PyParser.__init__(self, text)


class _Refused(Exception):
    """A bound or rule broken while reading; line is 1-based (0: unknown)."""

    def __init__(self, line: int, message: str):
        self.line = line
        super().__init__(message)


def _line(mark: Any) -> int:
    return (getattr(mark, "line", -1) or 0) + 1 if mark is not None else 0


class _Budget:
    def __init__(self) -> None:
        self.values = 0
        self.aliases = 0

    def add(self, n: int, line: int | Callable[[], int], how: str = "") -> None:
        self.values += n
        if self.values > MAX_VALUES:
            raise _Refused(line() if callable(line) else line, f"the document holds more than {MAX_VALUES} values{how}")


class _Resolver(Resolver):
    """YAML 1.1 implicit types, less timestamps (they stay strings)."""


_Resolver.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != _TAG + "timestamp"] for k, v in Resolver.yaml_implicit_resolvers.items()
}


class _Loader(_Parser, Composer, SafeConstructor, _Resolver):  # type: ignore[misc,valid-type]
    def __init__(self, text: str) -> None:
        _make_parser(self, text)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        _Resolver.__init__(self)
        self.budget = _Budget()
        self.depth = 0
        self.info: dict[int, tuple[int, int]] = {}  # id(node) -> (values, height) once composed

    # Composer's Python methods win over CParser's C ones (they come first in the MRO)
    check_node = Composer.check_node
    get_node = Composer.get_node
    get_single_node = Composer.get_single_node

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(AliasEvent):
            ev = self.peek_event()
            line = _line(ev.start_mark)
            self.budget.aliases += 1
            if self.budget.aliases > MAX_ALIASES:
                raise _Refused(line, f"more than {MAX_ALIASES} YAML aliases (*{ev.anchor})")
            node = self.anchors.get(ev.anchor)
            if node is not None:
                if id(node) not in self.info:
                    raise _Refused(line, f"alias *{ev.anchor} refers to a value that contains it (a recursive alias)")
                size, height = self.info[id(node)]
                self.budget.add(
                    size,
                    line,
                    f" once its aliases are expanded (*{ev.anchor} repeats {size}; a 'billion laughs' alias bomb?)",
                )
                if self.depth + height > MAX_DEPTH:
                    raise _Refused(line, f"values are nested deeper than {MAX_DEPTH} levels (through *{ev.anchor})")
            return super().compose_node(parent, index)  # undefined alias: Composer's own error
        ev = self.peek_event()
        line = _line(ev.start_mark)
        tag = getattr(ev, "tag", None)
        if tag is not None and tag not in ("!", *(_PLAIN_TAGS)):
            raise _Refused(line, f"the YAML tag {tag} is not allowed (only plain YAML/JSON values)")
        self.budget.add(1, line)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(line, f"values are nested deeper than {MAX_DEPTH} levels")
        before = self.budget.values
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if isinstance(node, ScalarNode):
            height = 1
        elif isinstance(node, SequenceNode):
            height = 1 + max((self.info[id(c)][1] for c in node.value), default=0)
        else:
            height = 1 + max((self.info[id(x)][1] for kv in node.value for x in kv), default=0)
        self.info[id(node)] = (self.budget.values - before + 1, height)
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        seen: dict[str, int] = {}
        for k, _ in node.value:
            if k.tag == _TAG + "merge":
                continue
            if not isinstance(k, ScalarNode) or k.tag not in (_TAG + "str",):
                what = (
                    "a list"
                    if isinstance(k, SequenceNode)
                    else "a mapping"
                    if isinstance(k, MappingNode)
                    else repr(k.value)
                )
                raise _Refused(_line(k.start_mark), f"mapping keys must be strings, found {what}")
            if k.value in seen:
                raise _Refused(_line(k.start_mark), f"duplicate key {k.value!r} (first at line {seen[k.value]})")
            seen[k.value] = _line(k.start_mark)
        return node

    def construct_yaml_float(self, node: ScalarNode) -> float:
        v = super().construct_yaml_float(node)
        if not math.isfinite(v):
            raise _Refused(_line(node.start_mark), f"{node.value!r} is not a finite number")
        return v


_Loader.add_constructor(_TAG + "float", _Loader.construct_yaml_float)


class _JsonDecoder(json.JSONDecoder):
    """The standard decoder with its pure-Python scanner, our object and array parsers:
    duplicate keys refused with their line, depth and value count bounded as read."""

    def __init__(self) -> None:
        super().__init__(parse_constant=self._constant, parse_float=self._float, strict=True)
        self.parse_object = self._object
        self.parse_array = self._array
        self.budget = _Budget()
        self.depth = 0
        self.text = ""

        self.scan_once = py_make_scanner(self)

    def _lineno(self, pos: int) -> int:
        return self.text.count("\n", 0, pos) + 1

    def _constant(self, name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    @staticmethod
    def _float(text: str) -> float:
        v = float(text)
        if not math.isfinite(v):
            raise ValueError(f"{text} is not a finite number")
        return v

    def _value(self, s: str, end: int, scan_once: Any) -> tuple[Any, int]:
        self.budget.add(1, lambda: self._lineno(end))
        try:
            return scan_once(s, end)
        except StopIteration as e:
            raise JSONDecodeError("Expecting value", s, e.value) from None

    def _enter(self, s: str, end: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(self._lineno(end), f"values are nested deeper than {MAX_DEPTH} levels")

    @staticmethod
    def _after_item(s: str, end: int, closer: str) -> tuple[bool, int]:
        """After an object's member or an array's item: (closed, where the next one starts)."""
        end = _WS.match(s, end).end()
        c = s[end : end + 1]
        if c == closer:
            return True, end + 1
        if c != ",":
            raise JSONDecodeError("Expecting ',' delimiter", s, end)
        return False, _WS.match(s, end + 1).end()

    def _object(self, s_and_end: tuple[str, int], strict: bool, scan_once: Any, *_: Any) -> tuple[dict, int]:
        s, end = s_and_end
        self._enter(s, end)
        out: dict[str, Any] = {}
        where: dict[str, int] = {}
        end = _WS.match(s, end).end()
        if s[end : end + 1] == "}":
            self.depth -= 1
            return out, end + 1
        while True:
            if s[end : end + 1] != '"':
                raise JSONDecodeError("Expecting property name enclosed in double quotes", s, end)
            kpos = end
            key, end = scanstring(s, end + 1, strict)
            self.budget.add(1, lambda kpos=kpos: self._lineno(kpos))
            if key in out:
                raise _Refused(self._lineno(kpos), f"duplicate key {key!r} (first at line {self._lineno(where[key])})")
            where[key] = kpos
            end = _WS.match(s, end).end()
            if s[end : end + 1] != ":":
                raise JSONDecodeError("Expecting ':' delimiter", s, end)
            end = _WS.match(s, end + 1).end()
            out[key], end = self._value(s, end, scan_once)
            closed, end = self._after_item(s, end, "}")
            if closed:
                break
        self.depth -= 1
        return out, end

    def _array(self, s_and_end: tuple[str, int], scan_once: Any, *_: Any) -> tuple[list, int]:
        s, end = s_and_end
        self._enter(s, end)
        out: list[Any] = []
        end = _WS.match(s, end).end()
        if s[end : end + 1] == "]":
            self.depth -= 1
            return out, end + 1
        while True:
            v, end = self._value(s, end, scan_once)
            out.append(v)
            closed, end = self._after_item(s, end, "]")
            if closed:
                break
        self.depth -= 1
        return out, end

    def load(self, text: str) -> Any:
        self.text = text
        start = _WS.match(text, 0).end()
        value, end = self._value(text, start, self.scan_once)
        end = _WS.match(text, end).end()
        if end != len(text):
            raise JSONDecodeError("Extra data", text, end)
        return value


def read_bytes(path: Path) -> bytes:
    """At most MAX_BYTES (+1, to tell) of a file; a pipe works too (-f /dev/stdin), and
    a named pipe without a writer reads as empty instead of blocking the open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise BadInput(f"cannot read spec file {path}: Is a directory", WHAT)
            os.set_blocking(fd, True)
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise BadInput(f"cannot read spec file {path}: {e.strerror}", WHAT) from None
    if len(data) > MAX_BYTES:
        size = f"{st.st_size} bytes" if stat.S_ISREG(st.st_mode) else f"more than {MAX_BYTES} bytes"
        raise BadInput(f"{path} is {size}; a spec file may be at most {MAX_BYTES} bytes (1 MiB)", WHAT)
    return data


def decode(data: bytes, path: Path | str) -> str:
    """Strict UTF-8 (a leading BOM is dropped); a bad byte is named with its offset."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        hint = " (UTF-16?)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else " (Latin-1 or another legacy encoding?)"
        raise BadInput(
            f"{path} is not UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} (line {line}, "
            f"column {col}) is not valid UTF-8{hint}; save the file as UTF-8",
            WHAT,
        ) from None


def parse(text: str, path: Path | str, *, as_json: bool = False) -> Any:
    """Plain data from spec text (YAML, or JSON with as_json)."""
    kind = "JSON" if as_json else "YAML"
    try:
        if as_json:
            return _JsonDecoder().load(text)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                raise BadInput(f"{path} is empty", WHAT)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except _Refused as e:
        at = f" line {e.line}:" if e.line else ""
        raise BadInput(f"{path}:{at} {e}", WHAT) from None
    except JSONDecodeError as e:
        raise BadInput(f"{path}: line {e.lineno} column {e.colno}: not valid JSON: {e.msg}", WHAT) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" line {mark.line + 1} column {mark.column + 1}:" if mark else ""
        msg = " ".join(x for x in (e.context, e.problem) if x)
        raise BadInput(f"{path}:{at} not valid YAML: {msg}", WHAT) from None
    except yaml.YAMLError as e:
        raise BadInput(f"{path}: not valid YAML: {str(e)[:300]}", WHAT) from None
    except (ValueError, TypeError, RecursionError) as e:  # e.g. an integer of more than 4300 digits
        raise BadInput(f"{path}: cannot read the {kind} document: {str(e)[:300]}", WHAT) from None


def load_spec_file(path: str | Path) -> Any:
    """Read a spec file (YAML, or JSON when it ends in .json) into plain data, or raise
    BadInput naming the file and the problem."""
    p = Path(path)
    text = decode(read_bytes(p), p)
    return parse(text, p, as_json=p.suffix.lower() == ".json")
