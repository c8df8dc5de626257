"""Whether this process runs under user-mode emulation (qemu-user through binfmt_misc), e.g. an arm64 image on an
x86_64 host. Standard library only: the doctor calls it inside images.

qemu-user answers uname(2) with the emulated machine (aarch64), so platform.machine() cannot tell; the kernel's
own architecture can:
- /proc/sys/kernel/arch (Linux 6.1 and later): the kernel's machine, which qemu does not rewrite;
- else /proc/cpuinfo, which qemu 7.2 (Debian bookworm's) passes through from the host for an aarch64 guest:
  an x86 kernel's lists `vendor_id` and `flags`, an arm64 one's `CPU implementer` and `Features`.
A 32-bit userland on its own 64-bit kernel (i686 on x86_64, armv7l on aarch64) is one family, not emulation.
"""

from __future__ import annotations

import os
import platform as _platform

_FAMILIES = {"x86_64": "x86", "amd64": "x86", "i386": "x86", "i686": "x86", "aarch64": "arm", "arm64": "arm",
             "ppc64le": "ppc", "ppc64": "ppc", "s390x": "s390", "riscv64": "riscv"}


def family(machine: str) -> str | None:
    m = (machine or "").strip().lower()
    if m.startswith("arm"):
        return "arm"
    return _FAMILIES.get(m)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _cpuinfo_family(text: str) -> str | None:
    keys = {line.split(":", 1)[0].strip() for line in text.splitlines() if ":" in line}
    if "vendor_id" in keys and "flags" in keys:
        return "x86"
    if "CPU implementer" in keys or "Features" in keys:
        return "arm"
    return None


def detect(machine: str | None = None, root: str = "/") -> dict | None:
    """None natively (or when nothing tells); else {"machine", "kernel", "how"}: this process's machine, the
    kernel's architecture (family) and the file that told."""
    machine = machine or _platform.machine()
    mine = family(machine)
    if mine is None:
        return None

    def path(p: str) -> str:
        return p if root in ("", "/") else os.path.join(root, p.lstrip("/"))

    arch = (_read(path("/proc/sys/kernel/arch")) or "").strip()
    if arch and family(arch):
        kernel, how = arch, "/proc/sys/kernel/arch"
        theirs = family(arch)
    else:
        text = _read(path("/proc/cpuinfo"))
        theirs = _cpuinfo_family(text) if text else None
        kernel, how = theirs, "/proc/cpuinfo"
    if theirs is None or theirs == mine:
        return None
    return {"machine": machine, "kernel": kernel, "how": how}


def describe(info: dict) -> str:
    return f"emulated: {info['machine']} on a {info['kernel']} kernel (qemu-user; {info['how']})"


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
