"""HS256 JSON Web Tokens as Slurm's auth/jwt makes and checks them (pure): `scontrol
token` signs {"exp", "iat", "sun"} with the cluster's jwt.key. hp's REST front checks
a token before slurmrestd sees it, because slurmrestd 24.11 never answers 401 for a bad
one (511 or 502, or a ping that says DOWN after 11 s)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time

MAX_TOKEN = 8192  # longer is refused unread


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def sign(key: bytes, user: str, lifespan: float, now: float | None = None) -> str:
    """A token for `user` valid `lifespan` seconds (what `scontrol token` makes)."""
    t = int(now if now is not None else time.time())
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64(json.dumps({"exp": t + int(lifespan), "iat": t, "sun": user}, separators=(",", ":")).encode())
    sig = _b64(hmac.new(key, head + b"." + body, hashlib.sha256).digest())
    return (head + b"." + body + b"." + sig).decode()


def verify(key: bytes, token: str, now: float | None = None) -> str | None:
    """None when `token` is an HS256 JWT signed with `key` and not expired; else why not:
    'malformed token', 'invalid signature' or 'token expired'."""
    if not token or len(token) > MAX_TOKEN or not token.isascii():
        return "malformed token"
    parts = token.split(".")
    if len(parts) != 3:
        return "malformed token"
    try:
        header = json.loads(_unb64(parts[0]))
        body = json.loads(_unb64(parts[1]))
        sig = _unb64(parts[2])
    except (ValueError, binascii.Error):  # bad base64, bad JSON (UnicodeDecodeError is a ValueError)
        return "malformed token"
    if not isinstance(header, dict) or not isinstance(body, dict):
        return "malformed token"
    if header.get("alg") != "HS256":  # never "none", never another algorithm
        return "invalid signature"
    good = hmac.new(key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(good, sig):
        return "invalid signature"
    exp = body.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return "malformed token"
    if exp <= (now if now is not None else time.time()):
        return "token expired"
    return None


def user_of(token: str) -> str | None:
    """The user a (verified) token was made for (Slurm's "sun" claim)."""
    try:
        body = json.loads(_unb64(token.split(".")[1]))
    except (ValueError, IndexError, binascii.Error):
        return None
    user = body.get("sun") if isinstance(body, dict) else None
    return user if isinstance(user, str) else None
