"""Package index queries (PEP 691 JSON simple API) and artifact selection per platform (host module)."""

from __future__ import annotations

import functools
import json
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass

from packaging.version import Version

from ..specs.dists import canon, parse_dist, wheel_tags
from ..runtime.errors import TrainboxError
from ..specs.platforms import PLATFORM_MACHINE

ACCEPT = "application/vnd.pypi.simple.v1+json"


class IndexUnreachable(TrainboxError):
    def __init__(self, index_name: str, url: str, reason: str):
        super().__init__(f"index {index_name!r} ({url}) unreachable: {reason}")
        self.index_name, self.url, self.reason = index_name, url, reason


@dataclass(frozen=True)
class Artifact:
    filename: str
    url: str
    sha256: str


SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def ca_bundle() -> str | None:
    """The CA bundle pip trusts: PIP_CERT, then `pip config get global.cert`, then the requests/OpenSSL
    variables, then the system bundle. Index queries, source downloads and image builds all use this one, so
    `stack lock`, `patches verify` and `image build` trust the same certificates (a TLS-intercepting proxy's
    CA included)."""
    from .pipconfig import pip_config

    if os.environ.get("PIP_CERT"):
        return os.environ["PIP_CERT"]
    cert = pip_config().get("cert")  # PIP_CERT, install.cert, global.cert, as pip install takes it
    if cert and cert.value:
        return cert.value
    for var in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(var) and os.path.exists(os.environ[var]):
            return os.environ[var]
    return SYSTEM_CA_BUNDLE if os.path.exists(SYSTEM_CA_BUNDLE) else None


@functools.lru_cache(maxsize=8)
def ssl_context(cafile: str | None = None) -> ssl.SSLContext:
    """An SSL context trusting `cafile`, else ca_bundle()."""
    cafile = cafile or ca_bundle()
    return ssl.create_default_context(cafile=cafile if cafile and os.path.exists(cafile) else None)


def project_files(index_name: str, index_url: str, project: str, timeout: float = 30) -> list[dict]:
    url = f"{index_url.rstrip('/')}/{canon(project)}/"
    req = urllib.request.Request(url, headers={"Accept": ACCEPT, "User-Agent": "trainbox"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ssl_context()) as resp:
            ctype = resp.headers.get("Content-Type", "")
            body = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise TrainboxError(f"index {index_name!r} ({index_url}) has no project {project!r}") from None
        raise IndexUnreachable(index_name, index_url, f"HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise IndexUnreachable(index_name, index_url, str(getattr(exc, "reason", exc))) from None
    if "json" not in ctype:
        raise IndexUnreachable(index_name, index_url, f"answered {ctype or 'no content type'}, not PEP 691 JSON")
    return json.loads(body).get("files", [])


def wheel_fits(filename: str, python: str, platform: str) -> bool:
    machine = PLATFORM_MACHINE[platform]
    tags = wheel_tags(filename)
    major, minor = python.split(".")
    cp = f"cp{major}{minor}"
    for t in tags:
        py_ok = (
            t.interpreter in (cp, f"py{major}", f"py{major}{minor}")
            or (t.abi == "abi3" and t.interpreter.startswith("cp3") and int(t.interpreter[3:]) <= int(minor))
        )
        plat_ok = t.platform == "any" or (
            t.platform.endswith(machine) and (t.platform.startswith("manylinux") or t.platform.startswith("linux"))
        )
        if py_ok and plat_ok:
            return True
    return False


def artifacts_for(files: list[dict], project: str, version: str, python: str, platform: str) -> list[Artifact]:
    """Wheels that fit the platform and Python, else the sdist: the artifacts pip may choose from."""
    want = (canon(project), Version(version))
    wheels, sdists = [], []
    for f in files:
        fn = f["filename"]
        sha = (f.get("hashes") or {}).get("sha256")
        if not sha or f.get("yanked") or parse_dist(fn) != want:
            continue
        if not fn.endswith(".whl"):
            sdists.append(Artifact(fn, f["url"], sha))
        elif wheel_fits(fn, python, platform):
            wheels.append(Artifact(fn, f["url"], sha))
    return sorted(wheels or sdists, key=lambda a: a.filename)


def versions(files: list[dict]) -> list[str]:
    out = {str(parsed[1]) for f in files if (parsed := parse_dist(f["filename"]))}
    return sorted(out, key=Version)
