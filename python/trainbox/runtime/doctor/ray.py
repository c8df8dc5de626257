"""Doctor checks: ray."""

from __future__ import annotations

import os
import re
import sys

from .. import npu, nvidia
from ..npu import NPU_NOSET
from ..nvidia import CUDA_NOSET
from .core import (
    PASS,
    SKIP,
    WARN,
    Context,
    Result,
    check,
    parse_ids,
)

# ---------------------------------------------------------------------------------------------------
# checks: distributed environment


def _ray_noset_names(ctx: Context) -> list[str]:
    """The NOSET variable(s) the installed Ray reads for NPUs, read from its source (not imported)."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("ray", ctx.sys_path or sys.path)  # finds the package, imports nothing
    names = []
    if spec and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            try:
                with open(os.path.join(loc, "_private", "accelerators", "npu.py"), encoding="utf-8") as fh:
                    names = sorted(set(re.findall(r"RAY_EXPERIMENTAL_NOSET_ASCEND\w*", fh.read())))
            except OSError:
                continue
            break
    return names




@check("ray.visible_devices")
def check_ray_noset(ctx: Context) -> Result:
    """Ray's NOSET flag and what it means for device ids."""
    if ctx.device == "cpu":
        return Result(SKIP, "no accelerator: Ray's device visibility does not apply")
    ray = ctx.dist_version("ray")
    if ray is None:
        return Result(SKIP, "ray is not installed")
    if ctx.device == "npu":
        read = _ray_noset_names(ctx) or [NPU_NOSET[0]]
        names, visible_var, res = NPU_NOSET, npu.VISIBLE_DEVICES_VAR, "NPU"
    else:
        read, names, visible_var, res = [CUDA_NOSET], (CUDA_NOSET,), nvidia.VISIBLE_DEVICES_VAR, "GPU"
    set_vars = {n: ctx.env[n] for n in names if ctx.env.get(n)}
    data = {"ray": ray, "ray_reads": read, "set": set_vars}
    ignored = [n for n in set_vars if n not in read]
    if ignored and not any(n in set_vars for n in read):
        return Result(WARN, f"{ignored[0]} is set, but ray {ray} reads {read[0]}: Ray will still rewrite "
                            f"{visible_var} in every actor", f"export {read[0]}=1 (setting both names is safe "
                            "across Ray versions)", data)
    active = [n for n in read if ctx.env.get(n)]
    if not active:
        return Result(PASS, f"ray {ray} sets {visible_var} per actor to the {res}s it assigns: inside an actor "
                            "use torch device 0..k-1", data=data)
    flag = active[0]
    if ctx.env[flag].strip().lower() in ("0", "false", "no", "off"):
        return Result(WARN, f"{flag}={ctx.env[flag]!r} still turns NOSET on: Ray tests only that it is non-empty",
                      f"unset {flag} to let Ray manage {visible_var}, or set it to 1 to make the intent plain",
                      data)
    visible = ctx.env.get(visible_var)
    ids, _ = parse_ids(visible) if visible else (None, None)
    if ids and ids != list(range(len(ids))):
        return Result(WARN, f"{flag} is set and {visible_var}={visible}: Ray hands out the physical ids "
                            f"{visible}, while torch numbers the same devices 0..{len(ids) - 1}",
                      f"map a Ray id to a torch device by its position in {visible_var} "
                      f"(e.g. {visible_var}.split(',').index(str(ray_id)))", data)
    return Result(PASS, f"{flag} is set: Ray leaves {visible_var} alone, every actor sees all {res}s and Ray's "
                        f"assigned ids (get_accelerator_ids()['{res}']) are physical ids to select by hand",
                  data=data)


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
