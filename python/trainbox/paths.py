"""Where the project's data lives (stdlib only).

TRAINBOX_ROOT points at a checkout when the package is installed elsewhere; otherwise the checkout
that holds this file is used (editable install, the usual case).
"""

from __future__ import annotations

import os
from pathlib import Path

from .runtime.errors import cache_root  # the default's one spelling, the runtime's (the image has no paths.py)

REPO_ROOT = Path(os.environ.get("TRAINBOX_ROOT") or Path(__file__).resolve().parents[2])
STACKS_DIR = REPO_ROOT / "build" / "stacks"
TEMPLATES_DIR = REPO_ROOT / "build" / "templates"
COMPAT_DIR = REPO_ROOT / "build" / "compat"
PATCHES_DIR = REPO_ROOT / "patches"
LAUNCHERS_DIR = REPO_ROOT / "launchers"
# What `image build` writes: build reports (read by push and by the launchers' image choice), the smoke's records.
# Modules read it as `paths.REPORTS_DIR` when they run, so a test that moves it moves it for all of them.
REPORTS_DIR = REPO_ROOT / "build" / "reports"
# Where the rendered Dockerfiles and their files live, relative to the checkout (and to a build context).
GENERATED_DIR = "build/generated"


def cache_dir() -> Path:
    """trainbox's cache (TRAINBOX_CACHE, default ~/.cache/trainbox), read when asked: a test or a wrapper that sets
    the variable in the process moves it for every module, as a new process would."""
    return Path(cache_root())


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> Path:
    """Write `path` whole or not at all: a temporary file beside it, renamed over it when complete. A full disk
    or Ctrl-C leaves the old file (or none) and no temporary one; the OSError goes on to the caller."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
        if mode is not None:
            tmp.chmod(mode)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
