"""One home per toolkit (issue 38, in hpccm's manner: a building block owns a toolkit's install facts and its
runtime half): `cann` for Ascend NPU stacks, `cuda` for NVIDIA ones. Each module has the same names (NAME,
DEVICE, NEEDS, ENV_RECORD, ENV_RECORD_FILE, VISIBLE_DEVICES_VAR, RULES, DOCTOR_MODULES,
DOCTOR_FAILS_WITHOUT_CARDS, DOCTOR_FAILS_ON_SUBSTITUTE, HOST_NEEDS, base_facts, declared_version, image_labels,
doctor_checks, host_mounts, docker_args, host_has_cards, launch_env; `cann` also `bake`), so the build, the
SBOM, smoke and the launchers ask `for_device(stack.device)` instead of knowing a toolkit's paths. The facts the
image's runtime code needs too live in trainbox.runtime.npu / trainbox.runtime.nvidia (runtime cannot import the
host side) and are taken from there.
"""

from __future__ import annotations

from types import ModuleType

from . import cann, cuda

TOOLKITS: dict[str, ModuleType] = {m.DEVICE: m for m in (cann, cuda)}


def for_device(device: str) -> ModuleType | None:
    """The toolkit a device's stacks are built on (None for cpu: no toolkit)."""
    return TOOLKITS.get(device)
