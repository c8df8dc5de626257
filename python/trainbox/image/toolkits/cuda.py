"""The CUDA toolkit's one home on the host (NVIDIA stacks), beside the NPU one and with its interface
(trainbox.image.toolkits): the facts (trainbox.runtime.nvidia, spelled there once for the image's own code),
the base (what an nvidia/cuda tag states), the launch half (`--gpus`, the visible-devices variable, Ray's flag)
and the doctor's half (trainbox.runtime.doctor.cuda). CUDA has no environment record and nothing to bake: its
base image sets its ENV itself, and the NVIDIA Container Toolkit mounts the driver.
"""

from __future__ import annotations

import re
import shutil

from ...runtime import nvidia as facts
from ...runtime.doctor import cuda as doctor_cuda

NAME = "cuda"
DEVICE = "cuda"
NEEDS = "cuda-toolkit"  # what a component's `needs:` names for it (trainbox.runtime.install_source checks it)
ENV_RECORD = None  # nothing recorded in the build, nothing baked after it
ENV_RECORD_FILE = None
VISIBLE_DEVICES_VAR = facts.VISIBLE_DEVICES_VAR
RULES: tuple[str, ...] = ()
DOCTOR_MODULES = (doctor_cuda,)
DOCTOR_FAILS_WITHOUT_CARDS = ("cuda.driver", "cuda.visible_devices")
DOCTOR_FAILS_ON_SUBSTITUTE: tuple[str, ...] = ()
HOST_NEEDS = "NVIDIA driver and the NVIDIA container toolkit (`--gpus`)"
# nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04 (any registry or mirror in front of the repository)
BASE_TAG_RE = re.compile(r"(?:.*/)?" + re.escape(facts.BASE_IMAGE.rsplit("/", 1)[-1]) + r":(\d+\.\d+(?:\.\d+)?)")


def base_facts(image: str) -> dict[str, str] | None:
    """What a CUDA base image's tag states ({"cuda": version}), or None for another image."""
    m = BASE_TAG_RE.match(image or "")
    return {"cuda": m.group(1)} if m else None


def declared_version(manifest: dict) -> str | None:
    """The CUDA a built image's manifest declares: its base's tag, on a CUDA stack."""
    facts_ = base_facts((manifest.get("base") or {}).get("image") or "")
    return facts_["cuda"] if facts_ and manifest.get("device") == DEVICE else None


def image_labels(version: str | None, substituted: bool) -> dict[str, str]:
    return {}


def doctor_checks() -> tuple[str, ...]:
    from ...runtime.doctor.core import CHECKS

    mods = {m.__name__ for m in DOCTOR_MODULES}
    return tuple(c.id for c in CHECKS if c.func.__module__ in mods)


def host_mounts(nodes: int) -> list[str]:
    return []  # the NVIDIA Container Toolkit mounts the driver


def docker_args(cards: list[int], nodes: int, mount_arg) -> list[str]:
    return ["--gpus", '"device=' + ",".join(str(c) for c in cards) + '"']


def host_has_cards() -> bool:
    """Whether this host has NVIDIA GPUs (the driver's nvidia-smi is installed)."""
    return shutil.which("nvidia-smi") is not None


def launch_env() -> dict[str, str]:
    return {}  # Ray keeps CUDA_VISIBLE_DEVICES as given when the job sets facts.CUDA_NOSET itself
