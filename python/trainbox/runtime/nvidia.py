"""Facts about the CUDA toolkit and NVIDIA hosts that both sides need (beside trainbox.runtime.npu): the
host's one home of the toolkit (trainbox.image.toolkits.cuda) takes them from here, since runtime code cannot
import a host module. Standard library only (this module ships in every image)."""

from __future__ import annotations

CUDA_HOME = "/usr/local/cuda"
# The toolkit's own record of its version ({"cuda": {"version": "12.8.1"}}), in every CUDA base image.
CUDA_VERSION_FILE = CUDA_HOME + "/version.json"
# What shows a builder holds the toolkit (a devel base), for `needs: cuda-toolkit`.
NVCC = CUDA_HOME + "/bin/nvcc"
# The base images that ship CUDA: their tag states the version (nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04).
BASE_IMAGE = "nvidia/cuda"
VISIBLE_DEVICES_VAR = "CUDA_VISIBLE_DEVICES"
# The driver's control node (one per host) and where the NVIDIA Container Toolkit puts libcuda.so.1.
CTL_NODE = "/dev/nvidiactl"
DRIVER_LIBDIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64")
# Ray rewrites CUDA_VISIBLE_DEVICES unless this is set.
CUDA_NOSET = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
