"""The platforms a stack can target and the one this host is (host module, ground floor: imports no trainbox
module, so that stack, index, image, fetch and bundle can all ask it without a circle)."""

from __future__ import annotations

import platform as _platform
import re

PLATFORM_RE = re.compile(r"^linux/(amd64|arm64)\Z")
# pip markers for the platforms a stack can target
PLATFORM_MACHINE = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def platform_marker(plats: list[str], all_plats: list[str]) -> str:
    """The requirement marker that limits a line to `plats` ("" when it holds on every platform)."""
    if len(plats) == len(all_plats):
        return ""
    return " ; " + " or ".join(f'platform_machine == "{PLATFORM_MACHINE[p]}"' for p in plats)


_MARKER_RE = re.compile(r' ; (platform_machine == "[^"]+"(?: or platform_machine == "[^"]+")*)(?= |\Z)')


def requirements_for(text: str, plat: str) -> str:
    """A generated requirement file narrowed to the machine `plat` names: the lines whose platform marker (the only
    marker trainbox writes, platform_marker's) holds there, without it. pip evaluates markers for the machine it
    runs on, so a cross build's native pip (`--platform`) needs the target's lines spelled out."""
    machine = PLATFORM_MACHINE[plat]
    out = []
    for line in text.splitlines():
        m = _MARKER_RE.search(line)
        if m is None:
            out.append(line)
        elif f'platform_machine == "{machine}"' in m.group(1).split(" or "):
            out.append(line[:m.start()] + line[m.end():])
    return "".join(f"{ln}\n" for ln in out)


def host_platform() -> str:
    m = _platform.machine().lower()
    return "linux/arm64" if m in ("aarch64", "arm64") else "linux/amd64"


# -- naming: what a tag says about its platform ----------------------------------------------------------
#: linux/amd64 keeps the names it always had (trainbox/cpu:HASH, :latest, local/debian:bookworm); every other
#: platform's image gets its architecture as a tag suffix (trainbox/cpu:HASH-arm64, :latest-arm64,
#: local/debian:bookworm-arm64). The engine (docker 20.10) keeps one image per name, so an arm64 build must not
#: take over the name `trainbox run` looks up on an x86_64 host, nor the other way round.
DEFAULT_PLATFORM = "linux/amd64"
#: the image config's Architecture for each platform (what `docker image inspect` reports)
PLATFORM_ARCH = {"linux/amd64": "amd64", "linux/arm64": "arm64"}


def tag_suffix(plat: str) -> str:
    """"" for linux/amd64, "-arm64" for linux/arm64: appended to a content-hash or latest tag."""
    return "" if plat == DEFAULT_PLATFORM else "-" + PLATFORM_ARCH[plat]


def platform_of(info: dict | None) -> str | None:
    """The platform an image's `docker image inspect` record says it is for (None: no record or an unknown one)."""
    info = info or {}
    if info.get("Os", "linux") != "linux":
        return None
    return next((p for p, a in PLATFORM_ARCH.items() if a == info.get("Architecture")), None)


def local_base_for(tag: str, plat: str) -> str:
    """trainbox's own base tag (local/debian:SUITE) for `plat`: local/debian:bookworm-arm64 for linux/arm64."""
    suffix = tag_suffix(plat)
    return tag if not suffix or tag.endswith(suffix) else tag + suffix


# -- running another architecture's binaries here --------------------------------------------------------
BINFMT_DIR = "/proc/sys/fs/binfmt_misc"
EMULATE_HINT = "run `bash ci/ensure-docker.sh --emulate arm64` as root (Debian's qemu-user-static and binfmt-support)"


def emulation_problem(plat: str, binfmt_dir: str = BINFMT_DIR) -> str | None:
    """None when this host can run `plat`'s binaries in a build (it is that platform, or qemu is registered in
    binfmt_misc with the F flag, which lets BuildKit's containers use it); otherwise why not, in one line."""
    if plat == host_platform():
        return None
    machine = PLATFORM_MACHINE[plat]
    entry = f"{binfmt_dir}/qemu-{machine}"
    try:
        text = open(entry, encoding="utf-8").read()
    except FileNotFoundError:
        if not _mounted(binfmt_dir):
            return f"{binfmt_dir} is not mounted, so no emulator for {machine} is registered"
        return f"no qemu-{machine} emulator is registered in {binfmt_dir}"
    except OSError as exc:
        return f"cannot read {entry}: {exc.strerror}"
    lines = text.splitlines()
    if not lines or lines[0].strip() != "enabled":
        return f"qemu-{machine} is registered in {binfmt_dir} but disabled"
    flags = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("flags:")), "")
    if "F" not in flags:
        # without F the kernel looks the interpreter up inside each container, where it is missing
        return f"qemu-{machine} is registered without the F (fix-binary) flag (flags {flags or 'none'}), so " \
               "containers cannot use it"
    return None


def _mounted(binfmt_dir: str) -> bool:
    try:
        return any(line.split()[1] == binfmt_dir for line in open("/proc/mounts", encoding="utf-8"))
    except (OSError, IndexError):
        return False
