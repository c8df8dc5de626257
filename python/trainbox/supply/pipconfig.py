"""pip's own configuration, read as pip reads it (host module).

`pip config list` reports every file pip reads (global, user, site, PIP_CONFIG_FILE) and the PIP_* variables
(`:env:`); for `pip install` a `:env:` value wins over an `install.` one, which wins over a `global.` one. trainbox
takes from it what decides where wheels come from: `find-links` (local wheel directories: the default wheelhouse
of `image build`, and where `fetch`, `fetch --bundle` and `image wheelhouse` look for a pinned artifact before an
index), `index-url` (the default index, and `image build`'s default `--pip-index-url`), `extra-index-url` (local
`file://` ones are searched like find-links) and `cert` (trainbox.supply.index.ca_bundle). Each value keeps where it came
from, so that a command can say in one line where a wheel came from.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from ..specs.dists import canon, is_dist_of, sha256_file

_LINE = re.compile(r"^(?P<section>[^.=]*)\.(?P<key>[A-Za-z0-9_-]+)='(?P<value>.*)'$")
#: pip's precedence for `pip install`: later wins
_ORDER = {"global": 0, "install": 1, ":env:": 2}


@dataclass(frozen=True)
class Setting:
    value: str
    origin: str  # e.g. "pip config global.find-links", "PIP_FIND_LINKS"

    def words(self) -> list[str]:
        return self.value.split()


@dataclass(frozen=True)
class PipConfig:
    settings: dict[str, Setting] = field(default_factory=dict)

    def get(self, key: str) -> Setting | None:
        return self.settings.get(key)

    def link_dirs(self) -> list[tuple[Path, str]]:
        """pip's find-links that are local directories, in pip's order, with where each came from."""
        s = self.get("find-links")
        return [(d, s.origin) for d in (_local_dir(w) for w in (s.words() if s else [])) if d is not None]

    def local_indexes(self) -> list[tuple[Path, str]]:
        """pip's index-url and extra-index-url that are local PEP 503 directories (file://)."""
        out = []
        for key in ("index-url", "extra-index-url"):
            s = self.get(key)
            for w in s.words() if s else []:
                d = _local_dir(w) if w.startswith("file:") else None
                if d is not None:
                    out.append((d, s.origin))
        return out

    def index_url(self) -> Setting | None:
        """pip's index-url when it is a remote index (a local file:// one cannot reach a build)."""
        s = self.get("index-url")
        return s if s and s.value.startswith(("https://", "http://")) else None

    def wheelhouse(self) -> tuple[Path, str] | None:
        """The default wheelhouse of a build: pip's first find-links directory that holds a wheel."""
        for d, origin in self.link_dirs():
            if any(d.glob("*.whl")):
                return d, origin
        return None


def _local_dir(word: str) -> Path | None:
    path = urllib.parse.unquote(urllib.parse.urlsplit(word).path) if word.startswith("file:") else word
    if "://" in path:
        return None
    p = Path(path)
    return p if p.is_dir() else None


def _origin(section: str, key: str) -> str:
    if section == ":env:":
        var = "PIP_" + key.upper().replace("-", "_")
        return var if var in os.environ else f"pip config (PIP_CONFIG_FILE) {key}"
    return f"pip config {section}.{key}"


def parse(text: str) -> PipConfig:
    """`pip config list` output -> the setting pip install uses for each key."""
    best: dict[str, tuple[int, Setting]] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m or m["section"] not in _ORDER:
            continue
        rank = _ORDER[m["section"]]
        if m["key"] not in best or rank >= best[m["key"]][0]:
            best[m["key"]] = (rank, Setting(m["value"], _origin(m["section"], m["key"])))
    return PipConfig({k: s for k, (_, s) in best.items()})


@functools.lru_cache(maxsize=1)
def pip_config() -> PipConfig:
    """This user's pip configuration (`pip config list`, once per process, and run again only when what it reads
    changed: see _inputs); empty when pip cannot say."""
    key = hashlib.sha256(json.dumps(_inputs(), sort_keys=True).encode()).hexdigest()
    memo = paths.cache_dir() / "pip-config.json"
    try:
        kept = json.loads(memo.read_text(encoding="utf-8"))
        if kept.get("key") == key and isinstance(kept.get("list"), str):
            return parse(kept["list"])
    except (OSError, ValueError, AttributeError):
        pass
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return PipConfig()
    if proc.returncode != 0:
        return PipConfig()
    try:  # a memo only: a cache that cannot be written costs the next command the same 0.5 s again
        memo.parent.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(memo, json.dumps({"key": key, "list": proc.stdout}))
    except OSError:
        pass
    return parse(proc.stdout)


def _inputs() -> dict:
    """What `pip config list`'s answer depends on. pip's start-up alone is ~0.5 s of CPU, most of a dry-run build:
    its answer is kept (pip-config.json in the cache) under a key of the interpreter, pip's own files, the
    environment pip reads (PIP_*, the XDG directories, HOME) and the state of every file pip 23-25 reads its
    configuration from on Linux (pip._internal.configuration.get_configuration_files): each XDG_CONFIG_DIRS
    entry's pip/pip.conf and /etc/pip.conf, sys.prefix's pip.conf, ~/.pip/pip.conf, the XDG_CONFIG_HOME one and
    PIP_CONFIG_FILE. Editing any of them, or moving pip, asks pip again."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("PIP_", "XDG_")) or k == "HOME"}
    xdg_dirs = (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    xdg_home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    files = [os.path.join(d, "pip", "pip.conf") for d in xdg_dirs] + ["/etc/pip.conf"]
    files += [os.path.join(sys.prefix, "pip.conf"), os.path.expanduser("~/.pip/pip.conf"),
              os.path.join(xdg_home, "pip", "pip.conf")]
    files += [os.environ["PIP_CONFIG_FILE"]] if os.environ.get("PIP_CONFIG_FILE") else []
    spec = importlib.util.find_spec("pip")
    files += [spec.origin] if spec is not None and spec.origin else []
    return {"python": sys.executable, "env": env, "files": {f: _state(f) for f in files}}


def _state(path: str) -> list | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev]


def find_local(name: str, version: str, sha256s, config: PipConfig | None = None) -> tuple[Path, str] | None:
    """A file of `name==version` whose sha256 a pin names, in pip's local find-links directories or local
    indexes (as pip would find it there), with where it came from; None when there is none."""
    cfg = config or pip_config()
    places = [(d, o) for d, o in cfg.link_dirs()] + [(d / canon(name), o) for d, o in cfg.local_indexes()]
    for d, origin in places:
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.is_file() and is_dist_of(p.name, name, version) and sha256_file(p, remember=True) in sha256s:
                return p, f"{d} ({origin})"
    return None
