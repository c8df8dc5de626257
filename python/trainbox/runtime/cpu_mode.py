"""TRAINBOX_DEVICE=cpu: an NPU or CUDA image behaves as a CPU image, in every Python process it starts.

Runtime module: standard library only. The image's venv holds a .pth hook (PTH_NAME, written at build time by
`python -m trainbox.runtime.cpu_mode --write-pth`) that site runs at every interpreter start, whoever started it:
the entrypoint's command, `docker run --entrypoint python`, pytest, a torchrun worker. When TRAINBOX_DEVICE is
not cpu the hook costs one environment lookup and imports nothing.

With TRAINBOX_DEVICE=cpu, install():
- hides the modules that need CANN or a GPU driver to load (HIDDEN): `sys.modules[name] = None`, so
  `importlib.util.find_spec(name)` returns None and `import name` raises ModuleNotFoundError, as where the
  package is not installed. Frameworks test availability with find_spec (transformers' and accelerate's
  is_torch_npu_available), so an env var alone would not do; a meta-path finder also refuses them, with the
  reason, should the None entry be removed (a test fixture that pops sys.modules);
- sets TORCH_DEVICE_BACKEND_AUTOLOAD=0 (torch would otherwise load torch_npu through its entry point and
  fail on the hidden module) and empties CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES, so torch sees no
  accelerator even where one is mounted; TWINKLE_PLATFORM=cpu for the same reason in Twinkle.
"""

from __future__ import annotations

import os
import sys

from trainbox.runtime import npu, nvidia
from trainbox.runtime.deviceonly import DEVICE_ONLY

# What cannot load without CANN (Ascend) or a GPU driver: the one device-only list, plus the PyPI packages whose
# import loads one of those at once (so a framework's `find_spec` must not see them either). The closure check
# requires these two (they install from PyPI); CPU mode hides them. Python packages built on top (MindSpeed, ...)
# then fail to import exactly as they do in a CPU image without these.
HIDDEN = (*DEVICE_ONLY, "torchair", "transformer_engine")
ENV_VAR = "TRAINBOX_DEVICE"
# TWINKLE_PLATFORM: Twinkle picks its platform from the host's tools (npu-smi means NPU even where torch_npu is
# hidden); patches/twinkle-* give it a CPU platform that this names.
FORCED_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", nvidia.VISIBLE_DEVICES_VAR: "", npu.VISIBLE_DEVICES_VAR: "",
              "TWINKLE_PLATFORM": "cpu"}
# After trainbox.pth (which puts the package on sys.path): site reads a directory's .pth files in sorted order.
PTH_NAME = "trainbox_cpu_mode.pth"
# One line: site executes .pth lines that start with `import`. Cheap when the variable is unset or not cpu.
PTH_LINE = (f"import os; os.environ.get({ENV_VAR!r}, '').strip().lower() == 'cpu' and "
            "__import__('trainbox.runtime.cpu_mode', fromlist=['install']).install()\n")


def active(env=None) -> bool:
    return (os.environ if env is None else env).get(ENV_VAR, "").strip().lower() == "cpu"


class _Refuse:
    """Meta-path finder of last resort: a hidden module whose None entry was removed is still refused."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} ({ENV_VAR}=cpu hides what needs CANN or a GPU "
                                      "driver; unset it to use the accelerator)", name=name)
        return None


def install() -> list[str]:
    """Hide HIDDEN and force FORCED_ENV; returns the names hidden here (already-imported ones cannot be)."""
    os.environ.update(FORCED_ENV)
    hidden = []
    for name in HIDDEN:
        if sys.modules.get(name) is not None:
            continue  # imported before the hook ran (an explicit import in sitecustomize): too late to hide
        sys.modules[name] = None
        hidden.append(name)
    if not any(isinstance(f, _Refuse) for f in sys.meta_path):
        sys.meta_path.insert(0, _Refuse())
    return hidden


def write_pth(site_dir: str | None = None) -> str:
    """Write the hook into the venv's site-packages (the image build runs this); returns its path."""
    if site_dir is None:
        import sysconfig

        site_dir = sysconfig.get_paths()["purelib"]
    path = os.path.join(site_dir, PTH_NAME)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(PTH_LINE)
    return path


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["--write-pth"] or len(args) > 2:
        sys.stderr.write("usage: python -m trainbox.runtime.cpu_mode --write-pth [SITE_DIR]\n")
        return 2
    print(write_pth(args[1] if len(args) == 2 else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
