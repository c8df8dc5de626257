"""The one list of modules a check may stand in for: what cannot load without an accelerator's driver or toolkit
(stdlib only). Everything else a recipe's entry imports must be in its image.

A module here is a stand-in in `launch check --args` (when the recipe names it in `check.stub`) and is neither
required nor followed by the import-closure check: its own imports belong to CANN or the GPU driver, which a
CI runner (and a substitute base) does not have. A recipe cannot add to this list; a stack that lacks a package
its entry imports fails the check naming the module.
"""

from __future__ import annotations

# module -> why it needs the device host. A name covers its submodules.
DEVICE_ONLY: dict[str, str] = {
    # Ascend: torch_npu's import loads libascend_hal / CANN runtime libraries (and torch auto-loads torch_npu)
    "torch_npu": "torch_npu loads CANN's runtime and the NPU driver (libascend_hal.so) at import",
    # CANN's own Python packages, from the toolkit's python/site-packages (not on PyPI, absent on a substitute)
    "acl": "pyACL, CANN's runtime binding (toolkit python/site-packages)",
    "tbe": "CANN's TBE operator compiler (toolkit python/site-packages)",
    "te": "CANN's TBE compatibility package (toolkit python/site-packages)",
    "te_fusion": "CANN's operator fusion compiler (toolkit python/site-packages)",
    "hccl": "CANN's HCCL Python package (toolkit python/site-packages)",
    "op_gen": "CANN's operator generator (toolkit python/site-packages)",
    "op_compile_tool": "CANN's operator compile tool (toolkit python/site-packages)",
    "auto_tune": "CANN's auto-tune package (toolkit python/site-packages)",
    "schedule_search": "CANN's schedule search package (toolkit python/site-packages)",
    "llm_datadist": "CANN's LLM-DataDist binding (toolkit python/site-packages)",
    "sgl_kernel_npu": "sgl-kernel-npu's extension is compiled against CANN and loads its libraries",
    # CUDA: extensions that load libcuda / the CUDA runtime at import
    "transformer_engine_torch": "Transformer Engine's PyTorch extension loads libcuda at import",
    "flash_attn_2_cuda": "flash-attn's CUDA extension",
    "amp_C": "Apex's CUDA extension",
    "fused_layer_norm_cuda": "Apex's CUDA extension",
    "sgl_kernel": "sgl-kernel's CUDA extension loads libcuda at import",
    "deep_ep_cpp": "DeepEP's CUDA extension",
}


def device_only(module: str) -> str | None:
    """The entry of DEVICE_ONLY that covers `module` (itself or a parent package), or None."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in DEVICE_ONLY:
            return name
    return None


__all__ = ["DEVICE_ONLY", "device_only"]


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
