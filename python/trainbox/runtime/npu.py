"""Facts about CANN and Ascend NPU hosts that both sides need: the entrypoint sources them, the doctor checks
them in a container, the launcher mounts them on the host, the build bakes them. Each fact is spelled here once:
the host's one home of the toolkit (trainbox.image.toolkits.cann) takes them from here, since runtime code
cannot import a host module. Standard library only (this module ships in every image)."""

from __future__ import annotations

# Where CANN installs its toolkit: the ascend-toolkit layout (its `latest` link), the newer cann layout, and
# versioned homes (cann-8.5.1) that no link names.
TOOLKIT_HOMES = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
VERSIONED_HOMES = "/usr/local/Ascend/cann-*"
# The toolkit's set_env.sh, one per layout (what `needs: cann-toolkit` and the entrypoint look for).
TOOLKIT_SET_ENV = ("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/cann/set_env.sh")
# Under a toolkit home: its install record (`version=8.5.1`), one per architecture directory.
TOOLKIT_INSTALL_INFO = "*-linux/ascend_toolkit_install.info"
NNAL_SET_ENV = "/usr/local/Ascend/nnal/atb/set_env.sh"
# The base images that ship CANN: their tag states the CANN, chip, OS and Python (trainbox.specs.rules parses it).
BASE_IMAGE = "quay.io/ascend/cann"
BASE_TAG_FORM = "<cann>-<chip>-<os><osver>-py<py>"
# Shared objects that come with the Ascend driver (mounted from the host), not with CANN.
DRIVER_LIBS = ("libascend_hal", "libdrvdsmi", "libdcmi", "libascend_dmi", "libc_sec")
NPU_CARD_NODE = "/dev/davinci"  # + the card's number: one node per card
NPU_DEVICE_NODES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
NPU_DOCKER_FLAGS = f"--device {NPU_CARD_NODE}N (each card) " + " ".join(f"--device {n}" for n in NPU_DEVICE_NODES)


def _read_only(path: str) -> str:
    return f"-v {path}:{path}:ro"


# The host's driver, mounted read-only at the same path: {path: the docker run flag}.
DRIVER_LIB64 = "/usr/local/Ascend/driver/lib64"
DRIVER_VERSION_INFO = "/usr/local/Ascend/driver/version.info"
NPU_SMI = "/usr/local/bin/npu-smi"
NPU_DRIVER_MOUNTS = {p: _read_only(p) for p in (DRIVER_LIB64, DRIVER_VERSION_INFO, NPU_SMI, "/usr/local/dcmi",
                                                 "/etc/ascend_install.info")}

VISIBLE_DEVICES_VAR = "ASCEND_RT_VISIBLE_DEVICES"
# Ray rewrites it unless one of these is set (older Ray reads the second name).
NPU_NOSET = ("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_ASCEND_VISIBLE_DEVICES")

# Multi-node NPU containers also need the NIC tool and its configuration (vllm-ascend's multi-node docs).
NPU_MULTINODE_MOUNTS = {p: _read_only(p) for p in ("/usr/local/Ascend/driver/tools/hccn_tool", "/etc/hccn.conf")}

# What the cann base image's own ENTRYPOINT sources besides the toolkit's set_env.sh: BiSheng / AscendNPU-IR
# (triton-ascend needs bishengir-compile on PATH) under the toolkit home, and ATB, told its C++ ABI so that
# its set_env.sh does not import torch to find out at every container start.
ASCENDNPU_IR_SET_ENV = "share/info/ascendnpu-ir/bin/set_env.sh"  # relative to the toolkit home
ATB_SET_ENV_ARGS = ("--cxx_abi=1",)
# Where `trainbox image build` records what those scripts export (see trainbox.runtime.cann_env).
CANN_ENV_FILE = "/etc/trainbox/cann-env.json"
# `trainbox image build` bakes that record as ENV (trainbox.image.toolkits.cann); the entrypoint still applies it and
# names here what the image's ENV lacked, so the doctor can say so (a plain `docker build` image).
CANN_ENV_APPLIED_VAR = "TRAINBOX_CANN_ENV_APPLIED"

# Atlas A2 (910B): the per-job socket port ranges below are not supported with MC2 fused operators (MindSpeed
# --use-ascend-mc2) and must be set on every card of a communicator, so on 910b a job gets its own
# HCCL_IF_BASE_PORT block instead (HCCL takes HCCL_IF_BASE_WIDTH ports from it since CANN 8.3; range
# [1024, 65520]). The blocks lie below Linux's default ephemeral range, clear of the socket ranges.
HCCL_SOCKET_RANGE_CHIPS_EXCLUDED = ("910b",)
HCCL_IF_BASE, HCCL_IF_BASE_WIDTH = 28672, 32
HCCL_IF_BASE_PORT_MIN, HCCL_IF_BASE_PORT_MAX = 1024, 65520

# HCCL socket ports per job: slot = MASTER_PORT % HCCL_SLOTS, HCCL_WIDTH ports per slot. Both blocks
# lie below Linux's default ephemeral range (32768-60999) and clear of HCCL's default NPU port 16666.
HCCL_HOST_BASE, HCCL_NPU_BASE, HCCL_WIDTH, HCCL_SLOTS = 20480, 24576, 32, 128


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
