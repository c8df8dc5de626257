"""Credentials out of everything trainbox prints or writes (runtime-safe: stdlib only).

An index URL may carry `user:password@` or a token as its user (`https://TOKEN@host/simple`). pip masks it in
its own output; trainbox does the same in its error lines, the build's console output and its reports, and
replaces the literal secrets it was given (the --pip-index-url's password or token) wherever they appear, since a
build step's log can hold them without their URL.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

MASK = "****"
# scheme://userinfo@ : the userinfo is whatever precedes the first '@' of the authority (no '/', space or quote)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s:'\"<>]*)"
                       r"(?::(?P<password>[^/@\s'\"<>]*))?@")
# a user name alone is no secret where it names an account, as ssh's and git's do (git@github.com)
_USER_SCHEMES = ("ssh://", "git://", "git+ssh://")


def _mask(m: re.Match) -> str:
    scheme, user, password = m["scheme"], m["user"], m["password"]
    if password is not None:
        return f"{scheme}{user}:{MASK}@"
    return f"{scheme}{user}@" if scheme.lower() in _USER_SCHEMES else f"{scheme}{MASK}@"


def url_secrets(url: str | None) -> list[str]:
    """The secret parts of a URL's userinfo (the password, or a user name that is a token), raw and decoded."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return []
    found = [p for p in (password, user if password is None else None) if p]
    return sorted({s for p in found for s in (p, unquote(p)) if len(s) >= 4}, key=len, reverse=True)


def redact(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """`text` with every URL's credentials masked and each of `secrets` replaced by ****."""
    for s in secrets:
        if s:
            text = text.replace(s, MASK)
    return _USERINFO.sub(_mask, text)


def redact_data(value, secrets: list[str] | tuple[str, ...] = ()):
    """A JSON-like value with every string in it redacted (a report before it is written)."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {redact(k, secrets) if isinstance(k, str) else k: redact_data(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_data(v, secrets) for v in value]
    return value


def printable(text) -> str:
    """`text` for a terminal: control characters (ESC and OSC sequences, newlines, bidi overrides) as escapes,
    so a package name in an untrusted document cannot move the cursor, retitle the window or forge a line."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") if c < "\x80"
                   else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}" for c in text)


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
