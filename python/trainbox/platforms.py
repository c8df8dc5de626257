"""The platforms a stack can target and the one this host is (host module, ground floor: imports no trainbox
module, so that stack, index, image, fetch and bundle can all ask it without a circle)."""

from __future__ import annotations

import platform as _platform
import re

PLATFORM_RE = re.compile(r"^linux/(amd64|arm64)$")
# pip markers for the platforms a stack can target
PLATFORM_MACHINE = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def platform_marker(plats: list[str], all_plats: list[str]) -> str:
    """The requirement marker that limits a line to `plats` ("" when it holds on every platform)."""
    if len(plats) == len(all_plats):
        return ""
    return " ; " + " or ".join(f'platform_machine == "{PLATFORM_MACHINE[p]}"' for p in plats)


def host_platform() -> str:
    m = _platform.machine().lower()
    return "linux/arm64" if m in ("aarch64", "arm64") else "linux/amd64"
