"""Facts about Ascend NPU hosts that both sides need: the doctor checks them in a container, the launcher
mounts them on the host. Standard library only (this module ships in every image)."""

from __future__ import annotations

# The CANN environment scripts the entrypoint sources and the doctor looks for.
TOOLKIT_HOMES = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
NNAL_SET_ENV = "/usr/local/Ascend/nnal/atb/set_env.sh"
NPU_DEVICE_NODES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
NPU_DOCKER_FLAGS = (
    "--device /dev/davinciN (each card) --device /dev/davinci_manager --device /dev/devmm_svm "
    "--device /dev/hisi_hdc"
)
NPU_DRIVER_MOUNTS = {
    "/usr/local/Ascend/driver/lib64": "-v /usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64:ro",
    "/usr/local/Ascend/driver/version.info":
        "-v /usr/local/Ascend/driver/version.info:/usr/local/Ascend/driver/version.info:ro",
    "/usr/local/bin/npu-smi": "-v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro",
    "/usr/local/dcmi": "-v /usr/local/dcmi:/usr/local/dcmi:ro",
    "/etc/ascend_install.info": "-v /etc/ascend_install.info:/etc/ascend_install.info:ro",
}

# Ray rewrites ASCEND_RT_VISIBLE_DEVICES unless one of these is set (older Ray reads the second name).
NPU_NOSET = ("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_ASCEND_VISIBLE_DEVICES")
CUDA_NOSET = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"

# HCCL socket ports per job: slot = MASTER_PORT % HCCL_SLOTS, HCCL_WIDTH ports per slot. Both blocks
# lie below Linux's default ephemeral range (32768-60999) and clear of HCCL's default NPU port 16666.
HCCL_HOST_BASE, HCCL_NPU_BASE, HCCL_WIDTH, HCCL_SLOTS = 20480, 24576, 32, 128
