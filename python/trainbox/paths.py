"""Where the project's data lives (stdlib only).

TRAINBOX_ROOT points at a checkout when the package is installed elsewhere; otherwise the checkout
that holds this file is used (editable install, the usual case).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(os.environ.get("TRAINBOX_ROOT") or Path(__file__).resolve().parents[2])
STACKS_DIR = REPO_ROOT / "build" / "stacks"
TEMPLATES_DIR = REPO_ROOT / "build" / "templates"
COMPAT_DIR = REPO_ROOT / "build" / "compat"
PATCHES_DIR = REPO_ROOT / "patches"
LAUNCHERS_DIR = REPO_ROOT / "launchers"
CACHE_DIR = Path(os.environ.get("TRAINBOX_CACHE") or Path.home() / ".cache" / "trainbox")
