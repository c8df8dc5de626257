"""What each stack and recipe field may hold (host module).

Stack and recipe strings end up in Dockerfiles, shell scripts and `docker run` argv. The templates quote by
context as well, but the first line of defence is here: every field has a grammar, checked when the file (or a
`--set` value) is validated, so a newline, a quote or `$(...)` in a version, an env key or an image name is
refused with the field named instead of becoming a Dockerfile instruction or a shell command.

Each check_* returns the value or raises ValueError (pydantic turns that into "file: key.path: message").
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from ..runtime.npu import BASE_IMAGE as CANN_BASE_IMAGE
from ..runtime.redact import redact

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# PEP 508 distribution name (and extras)
DIST_NAME_RE = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])\Z")
# stack, recipe, component and series names: lower-case words; also what build/generated/<name>/ is made of
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
# Debian package name (Policy 5.6.1), optionally =version
DEB_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?\Z")
# OCI image reference: [registry[:port]/]path[:tag][@sha256:digest] (distribution/reference grammar)
_OCI_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_OCI_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?"
IMAGE_RE = re.compile(
    rf"^(?:{_OCI_DOMAIN}/)?{_OCI_COMPONENT}(?:/{_OCI_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@sha256:[0-9a-f]{64})?\Z")
# an interpreter command or absolute path: no spaces, no shell syntax
COMMAND_RE = re.compile(r"^(?:/?[A-Za-z0-9_.+-]+)+\Z")
# short identifiers such as CANN versions, chip and OS names
TOKEN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
# git ref (tag or branch): git check-ref-format, minus the exotic
GIT_REF_RE = re.compile(r"^(?![-/.])(?!.*\.\.)(?!.*//)[A-Za-z0-9._/+-]+(?<![./])\Z")
# characters a URL may hold here: RFC 3986 unreserved, reserved and %, without any a shell or a Dockerfile acts
# on: no quotes, $, `, \, spaces or braces, and none of the sub-delimiters ; & ( ) ! * ' (an index URL
# `https://pypi.org/simple;/path/to/script;` ran the script in the builder). Percent-encode them if a URL needs one.
_URL_CHARS_RE = re.compile(r"^[A-Za-z0-9\-._~:/?#\[\]@+,=%]+\Z")
# a glob relative to a tree (install: build's `wheels:`): path characters and the glob's own * ? [ ]
_GLOB_RE = re.compile(r"^[A-Za-z0-9_.+/*?\[\]-]+\Z")
# scp-like git address: git@host:path
_SCP_GIT_RE = re.compile(r"^[A-Za-z0-9_.-]+@[A-Za-z0-9.-]+:[A-Za-z0-9_./~+-]+\Z")

MAX_FIELD = 4096  # no single field needs more; a bound keeps a hostile file from growing outputs


def controls(value: str) -> list[str]:
    """The control and format characters in `value` (newline, tab, NUL, bidi overrides, zero-width ...)."""
    return sorted({f"U+{ord(c):04X}" for c in value if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")})


def check_text(value: str, what: str = "text") -> str:
    """Free text (descriptions, notes): one line, printable, bounded."""
    bad = controls(value)
    if bad:
        raise ValueError(f"{what} {value[:60]!r}: holds control characters ({', '.join(bad)}); write one plain line")
    if len(value) > MAX_FIELD:
        raise ValueError(f"{what}: {len(value)} characters; at most {MAX_FIELD}")
    return value


def _match(regex: re.Pattern, value: str, what: str, expected: str) -> str:
    if not isinstance(value, str) or not regex.match(value) or len(value) > MAX_FIELD:
        raise ValueError(f"{what} {value!r}: expected {expected}")
    return value


def check_env_name(value: str) -> str:
    return _match(ENV_NAME_RE, value, "environment variable name",
                  "letters, digits and _, not starting with a digit ([A-Za-z_][A-Za-z0-9_]*)")


def check_image_text(value: str, what: str) -> str:
    """Free text that lands in the image's Dockerfile (ENV values, LABELs): one line, and no backslash, which
    Dockerfile parsers disagree about before a quote or at a line's end (hadolint cannot read `"a\\"`)."""
    check_text(value, what)
    if "\\" in value:
        raise ValueError(f"{what} {value[:60]!r}: holds a backslash, which the Dockerfile cannot carry reliably")
    return value


def check_env_value(value: str) -> str:
    return check_image_text(value, "environment value")


def check_version(value: str) -> str:
    """One exact PEP 440 version (local labels such as +cpu allowed), written the way it was given."""
    if not isinstance(value, str) or controls(value) or value != value.strip():
        raise ValueError(f"version {value!r}: expected one PEP 440 version such as 2.9.0 or 2.9.0+cpu")
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"version {value!r}: expected one PEP 440 version such as 2.9.0 or 2.9.0+cpu") from None
    return value


def check_requirement(value: str, what: str) -> str:
    """A PEP 508 requirement by name and version range (setuptools>=61, wheel): no URL and no marker, so the
    lock resolves it from an index into hash-pinned files."""
    expected = "a requirement such as setuptools>=61.0 or wheel (a name, optional [extras] and version range)"
    _match(re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-\[\], <>=!~*]*\Z"), value, what, expected)
    try:
        Requirement(value)
    except InvalidRequirement:
        raise ValueError(f"{what} {value!r}: expected {expected}") from None
    return value


# One line of a generated hash-checked requirements file, exactly as trainbox writes it: name[extras]==version,
# an optional platform marker, one or more --hash options. Nothing else (no URL, no `@`, no -r/-c/--index-url
# option, no environment variable) can reach pip through these files.
_MACHINE = r'platform_machine == "(?:x86_64|aarch64)"'
_REQ_NAME = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
_REQ_TAIL = rf"(?: ; {_MACHINE}(?: or {_MACHINE})*)?(?: --hash=sha256:[0-9a-f]{{64}})+\Z"
REQUIREMENT_LINE_RE = re.compile(_REQ_NAME + r"==[A-Za-z0-9.+!_-]+" + _REQ_TAIL)
# a `source: url` component's line: its checked URL (stack grammar) as a direct reference
URL_REQUIREMENT_LINE_RE = re.compile(_REQ_NAME + r" @ (?:https?|file)://[A-Za-z0-9\-._~:/?#\[\]@+,=%]+" + _REQ_TAIL)


def check_requirement_line(value: str, what: str, url: bool = False) -> str:
    """A generated requirement line, checked again just before it is written (behind the stack and lock
    grammars): the last guard between a file in the tree and pip running as root. `url`: the line of a
    `source: url` component may name its URL (no lock entry ever does)."""
    ok = isinstance(value, str) and (REQUIREMENT_LINE_RE.match(value) or
                                     (url and URL_REQUIREMENT_LINE_RE.match(value)))
    if not ok:
        raise ValueError(f"{what}: refusing to write the requirement line {str(value)[:120]!r}: expected "
                         "name==version [; platform marker] --hash=sha256:<64 hex digits>"
                         + (" (or name @ URL --hash=...)" if url else ""))
    return value


def check_dist_name(value: str) -> str:
    return _match(DIST_NAME_RE, value, "distribution name", "a PEP 508 name (letters, digits, ., _ and -)")


def check_name(value: str, what: str = "name") -> str:
    return _match(NAME_RE, value, what, "lower-case letters, digits, '.', '_' and '-' (at most 64)")


def check_deb_package(value: str) -> str:
    return _match(DEB_PACKAGE_RE, value, "Debian package", "a Debian package name such as git or libssl3 "
                  "(optionally name=version)")


def check_image(value: str) -> str:
    return _match(IMAGE_RE, value, "image", f"an OCI image reference such as {CANN_BASE_IMAGE}:8.5.1-910b or "
                  "local/debian:bookworm")


def check_command(value: str) -> str:
    return _match(COMMAND_RE, value, "command", "a command name or absolute path without spaces or shell syntax")


def check_token(value: str, what: str) -> str:
    return _match(TOKEN_RE, value, what, "letters, digits, '.', '_', '+' and '-'")


def check_git_ref(value: str) -> str:
    return _match(GIT_REF_RE, value, "ref", "a tag or branch name (no spaces, no '..', not starting with '-')")


def check_relpath(value: str, what: str) -> str:
    """A relative path inside a tree: no absolute path, no `..`, no shell syntax."""
    _match(re.compile(r"^[A-Za-z0-9_.+/-]+\Z"), value, what, "a relative path of letters, digits and ._+-/")
    if value.startswith("/") or ".." in value.split("/"):
        raise ValueError(f"{what} {value!r}: must stay inside the tree (no leading '/', no '..')")
    return value


def check_glob(value: str, what: str) -> str:
    """A file glob inside a tree (dist/*.whl): path characters and * ? [ ], no '..', not absolute."""
    if value.startswith("/") or ".." in value.split("/"):
        raise ValueError(f"{what} {value!r} must be a glob relative to the tree (no leading '/', no '..')")
    _match(_GLOB_RE, value, what, "a glob relative to the tree of letters, digits, ._+-/ and * ? [ ]")
    return value


def check_url(value: str, schemes: tuple[str, ...], what: str = "url") -> str:
    """An absolute URL with one of `schemes`, without characters a shell or Dockerfile would act on, and without
    credentials: what a stack or lock says is written into the Dockerfile (and so the image's history)."""
    shown = redact(value) if isinstance(value, str) else value
    if not isinstance(value, str) or not _URL_CHARS_RE.match(value) or len(value) > MAX_FIELD:
        raise ValueError(f"{what} {shown!r}: expected a URL without spaces, quotes, $, `, \\, braces or any of "
                         ";&()!* (percent-encode such a character)")
    try:
        parts = urlsplit(value)
        port = parts.port  # noqa: F841 - a port that is no number is refused here, not by pip in the build
    except ValueError:
        raise ValueError(f"{what} {shown!r}: expected a URL (host[:port] with a numeric port)") from None
    if parts.scheme not in schemes or not (parts.netloc or parts.scheme == "file"):
        raise ValueError(f"{what} {shown!r}: expected a {' or '.join(s + '://' for s in schemes)} URL")
    if parts.password is not None or (parts.username is not None and parts.scheme not in ("ssh", "git")):
        raise ValueError(f"{what} {shown!r}: holds credentials (user:password@ or a token@), which would be "
                         "written into the Dockerfile and the image's history; remove them: give a private PyPI "
                         "index with `trainbox image build --pip-index-url URL` (a build secret), and git hosts "
                         "their credentials through git's own config on the host")
    return value


def check_git_url(value: str) -> str:
    """A repository address git may fetch: https/ssh/git/file URL or scp-like user@host:path; never one
    that starts with '-' (git would read it as an option)."""
    if isinstance(value, str) and _SCP_GIT_RE.match(value) and not value.startswith("-"):
        return value
    return check_url(value, ("https", "ssh", "git", "file", "http"), "git")


# A card index must exist on the largest supported chip: an Atlas A3 node has 16 NPUs.
MAX_DEVICE_INDEX = 15
# Nodes a recipe may be rendered for: the script lists each node's command, so this bounds its size too.
MAX_NODES = 1024
MAX_DEVICES_PER_NODE = 16


def parse_devices(spec: str | None) -> list[int]:
    """'0-3' / '0,2,4-5' -> sorted card numbers, each 0..MAX_DEVICE_INDEX and given once.

    Empty or blank is an error (it used to mean "the default cards" silently), so is a card named twice."""
    usage = "expected card numbers like 0-3 or 0,1,4-5"
    if spec is None or not spec.strip():
        raise ValueError(f"--devices {spec!r}: empty; {usage} (leave --devices out for the recipe's default)")
    if len(spec) > 256:
        raise ValueError(f"--devices: {len(spec)} characters; {usage}")
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"([0-9]{1,3})(?:-([0-9]{1,3}))?", part)
        if not m:
            raise ValueError(f"--devices {spec!r}: {part!r}: {usage}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if lo > hi:
            raise ValueError(f"--devices {spec!r}: {part!r} runs backwards; {usage}")
        if hi > MAX_DEVICE_INDEX:
            raise ValueError(f"--devices {spec!r}: card {hi} does not exist; cards are numbered 0-{MAX_DEVICE_INDEX} "
                             f"(an Atlas A3 node, the largest supported, has {MAX_DEVICE_INDEX + 1})")
        for card in range(lo, hi + 1):
            if card in out:
                raise ValueError(f"--devices {spec!r}: card {card} is given twice")
            out.append(card)
    return sorted(out)


def check_indexes(v: dict[str, str]) -> dict[str, str]:
    """A stack's or a lock's `indexes:` (name -> URL): the same grammar in both files."""
    for name, url in v.items():
        check_name(name, "index name")
        check_url(url, ("https", "http", "file"), f"indexes.{name}")
    return v
