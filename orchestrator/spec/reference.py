"""Docker image references, judged as the engine judges them (pure functions).

A group's `Image` goes to the engine at the first node's create. A string the engine
cannot parse fails there with "invalid reference format" after the controller was
started (issue 24); the spec check refuses it instead, with the engine's own rule:
the grammar of github.com/distribution/reference (vendored by Docker 20.10), with
ParseAnyReference's forms: a name (optionally [domain[:port]/]path[:tag][@digest],
path components lower case) or an image id (64 hex digits, or sha256:<64 hex>); a
digest is checked as go-digest's Parse checks it.
"""

from __future__ import annotations

import re

NAME_TOTAL_MAX = 255  # distribution/reference NameTotalLengthMax

_ALNUM = r"[a-z0-9]+"
_SEP = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEP}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
REFERENCE_RE = re.compile(rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII)
IDENTIFIER_RE = re.compile(r"[a-f0-9]{64}", re.ASCII)
DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
"""The algorithms go-digest knows, and their lower-case hex lengths (digest.Parse)."""


def _digest_ok(digest: str) -> bool:
    algorithm, _, hexpart = digest.partition(":")
    n = DIGEST_HEX.get(algorithm)
    return n is not None and len(hexpart) == n and re.fullmatch(r"[a-f0-9]+", hexpart, re.ASCII) is not None


def _remote(name: str) -> str:
    """The repository path of a name, as Docker 20.10's splitDockerDomain splits it: the
    first component is a registry only when it has a dot or a port or is localhost."""
    first, sep, rest = name.partition("/")
    return rest if sep and (any(c in first for c in ".:") or first == "localhost") else name


def reference_problem(ref: str) -> str | None:
    """Why the engine would refuse `ref` as an image reference, or None."""
    if IDENTIFIER_RE.fullmatch(ref) or _digest_ok(ref):
        return None  # an image id
    if ref == "":
        return "is not an image reference: it is empty"
    m = REFERENCE_RE.fullmatch(ref)
    if m is None:
        if REFERENCE_RE.fullmatch(ref.lower()) and ref.lower() != ref:
            return "is not a valid image reference: the repository name must be lower case"
        return (
            "is not a valid image reference ([registry[:port]/]name[:tag][@digest]; name: lower-case letters, "
            "digits and . _ - separators; tag: at most 128 of letters, digits, . _ -)"
        )
    if m.group("digest") and not _digest_ok(m.group("digest")):
        return f"is not a valid image reference: digest {m.group('digest')!r} is not sha256:<64 hex>, sha384 or sha512"
    name = m.group("name")
    if len(name) > NAME_TOTAL_MAX:
        return f"is not a valid image reference: the repository name is longer than {NAME_TOTAL_MAX} characters"
    if _remote(name).lower() != _remote(name):  # "Foo/bar": Foo is no registry, so a path in upper case
        return "is not a valid image reference: the repository name must be lower case"
    return None
