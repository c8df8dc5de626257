"""Doctor checks: npu."""

from __future__ import annotations

import glob
import json
import os

from ..npu import (
    BASE_IMAGE,
    BASE_TAG_FORM,
    CANN_ENV_APPLIED_VAR,
    CANN_ENV_FILE,
    DRIVER_LIB64,
    DRIVER_VERSION_INFO,
    NNAL_SET_ENV,
    NPU_CARD_NODE,
    NPU_DEVICE_NODES,
    NPU_DOCKER_FLAGS,
    NPU_DRIVER_MOUNTS,
    NPU_SMI,
    TOOLKIT_HOMES,
    TOOLKIT_INSTALL_INFO,
    TOOLKIT_SET_ENV,
    VERSIONED_HOMES,
)
from .core import (
    CPU_ON_PURPOSE,
    FAIL,
    PASS,
    SKIP,
    WARN,
    Context,
    Result,
    check,
    find_command,
    find_lib,
    no_cann_reason,
    parse_ids,
    parse_int,
    path_entries,
    read_kv,
    run_python,
    skip_unless,
    toolkit_home,
    toolkit_version,
)

# ---------------------------------------------------------------------------------------------------
# checks: CANN






def _set_env_script(home: str) -> str:
    # ascend-toolkit/latest -> ascend-toolkit/set_env.sh; cann -> cann/set_env.sh
    parent = os.path.dirname(home.rstrip("/")) if home.rstrip("/").endswith("/latest") else home
    return os.path.join(parent, "set_env.sh")




@check("cann.toolkit")
def check_cann_toolkit(ctx: Context) -> Result:
    """The CANN toolkit is installed, at the stack's version."""
    skip = skip_unless(ctx, "npu")
    if skip:
        return skip
    home = toolkit_home(ctx)
    want = ((ctx.manifest or {}).get("base") or {}).get("cann")
    if not home:
        looked = ", ".join(TOOLKIT_HOMES + (VERSIONED_HOMES,))
        return Result(FAIL, f"no CANN toolkit found (looked in {looked}){no_cann_reason(ctx)}",
                      f"build the image from a CANN base ({BASE_IMAGE}:{BASE_TAG_FORM}) or mount the "
                      f"toolkit at {os.path.dirname(TOOLKIT_SET_ENV[0])}; {CPU_ON_PURPOSE}", {"expected": want})
    have = toolkit_version(ctx, home)
    data = {"home": home, "version": have, "expected": want}
    if want and have and not have.lower().startswith(str(want).lower()):
        return Result(FAIL, f"CANN toolkit {have} at {home}, but the stack was built for CANN {want}",
                      "use the image's own CANN (do not mount a host toolkit over it), or rebuild the stack "
                      f"with base.cann {have}", data)
    if not have:
        return Result(WARN, f"CANN toolkit at {home}, but its version is unknown (no "
                            f"{TOOLKIT_INSTALL_INFO})",
                      "reinstall the toolkit package; a partial copy of /usr/local/Ascend misses libraries too",
                      data)
    return Result(PASS, f"CANN toolkit {have} at {home}" + (" as the stack pins" if want else ""), data=data)


@check("cann.env")
def check_cann_env(ctx: Context) -> Result:
    """The CANN (and NNAL) environment is set: set_env.sh was sourced or its ENV baked into the image."""
    skip = skip_unless(ctx, "npu")
    if skip:
        return skip
    home = toolkit_home(ctx)
    if not home:
        return Result(SKIP, "no CANN toolkit (see cann.toolkit)")
    script = _set_env_script(home)
    set_home = ctx.env.get("ASCEND_TOOLKIT_HOME") or ctx.env.get("ASCEND_HOME_PATH")
    ld = path_entries(ctx.env.get("LD_LIBRARY_PATH"))
    homes = set()
    if set_home:  # the scripts may name the home through a symlink (latest -> 8.5.1) or resolved
        homes = {set_home.rstrip("/") + "/", os.path.realpath(ctx.path(set_home)).rstrip("/") + "/"}
    lib_dirs = [d for d in ld if any(d.startswith(h) or os.path.realpath(ctx.path(d)).startswith(h) for h in homes)]
    data = {"home": home, "ASCEND_TOOLKIT_HOME": set_home, "set_env": script}
    fix = (f"source {script} (the trainbox entrypoint does; a Kubernetes `command:` that bypasses it relies on "
           "the ENV baked into the image, so do not clear it)")
    if not set_home:
        return Result(FAIL, f"CANN is installed at {home} but its environment is not set (ASCEND_TOOLKIT_HOME "
                            "is unset)", fix, data)
    if not os.path.isdir(ctx.path(set_home)):
        return Result(FAIL, f"ASCEND_TOOLKIT_HOME={set_home} does not exist", fix, data)
    if not lib_dirs:
        return Result(FAIL, f"ASCEND_TOOLKIT_HOME={set_home} but LD_LIBRARY_PATH holds none of its lib64 dirs",
                      fix, data)
    if ctx.exists(NNAL_SET_ENV) and not ctx.env.get("ATB_HOME_PATH"):
        return Result(WARN, "NNAL (ATB) is installed but its environment is not set (ATB_HOME_PATH unset)",
                      f"source {NNAL_SET_ENV} (the trainbox entrypoint does)", data)
    return Result(PASS, f"CANN environment set (ASCEND_TOOLKIT_HOME={set_home})", data=data)


@check("cann.env_baked")
def check_cann_env_baked(ctx: Context) -> Result:
    """The image's ENV holds the CANN environment its build recorded (a `command:` that skips the entrypoint)."""
    skip = skip_unless(ctx, "npu")
    if skip:
        return skip
    path = ctx.env.get("TRAINBOX_CANN_ENV_FILE") or CANN_ENV_FILE
    try:
        with open(ctx.path(path), encoding="utf-8") as fh:
            record = json.load(fh)
        recorded = dict(record.get("env") or {})
    except FileNotFoundError:
        return Result(SKIP, f"no {path} (an image not built by trainbox)")
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        return Result(WARN, f"{path} is unreadable ({exc})", "rebuild the image with `trainbox image build`")
    if not record.get("sourced"):
        return Result(SKIP, f"{path}: the build found no CANN set_env script to record (a base without CANN)")
    fix = ("build the image with `trainbox image build`, which bakes the record as ENV (a plain `docker build` "
           "of the generated Dockerfile cannot), or start the command through the trainbox entrypoint")
    data = {"record": path, "variables": sorted(recorded)}
    absent = [k for k in sorted(recorded) if k not in ctx.env]
    if absent:
        return Result(WARN, f"{', '.join(absent)} of {path} not set: this process did not start through the "
                            "trainbox entrypoint, and the image's ENV lacks them", fix, data)
    applied = [n for n in (ctx.env.get(CANN_ENV_APPLIED_VAR) or "").split(",") if n]
    if applied:
        return Result(WARN, f"the image's ENV lacks {', '.join(applied)} of {path}: the entrypoint set them, but a "
                            "Kubernetes `command:` that bypasses it starts without them", fix, data)
    return Result(PASS, f"the image's ENV holds the {len(recorded)} variables of {path}", data=data)


_LIB_PROBE = """
import ctypes, json
out = {}
for name in sys.argv[1:]:
    try:
        ctypes.CDLL(name)
        out[name] = None
    except OSError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def lib_status(ctx: Context, names: list[str], extra_dirs=()) -> dict:
    """{name: (found_path or None, load_error or None)}; loading happens in a child (quick: search only)."""
    found = {n: find_lib(ctx, n, extra_dirs) for n in names}
    if ctx.quick:
        return {n: (found[n], None if found[n] else f"{n} not found on LD_LIBRARY_PATH") for n in names}
    env = dict(ctx.env)
    if ctx.root != "/":
        env["LD_LIBRARY_PATH"] = ":".join(ctx.path(d) for d in path_entries(ctx.env.get("LD_LIBRARY_PATH")))
    targets = [found[n] or n for n in names]
    proc = run_python(ctx, _LIB_PROBE, targets, env=env, timeout=ctx.timeout / 2)  # 60 s natively
    if proc is None or proc.returncode != 0:
        why = "timed out" if proc is None else f"exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
        return {n: (found[n], f"probe {why}") for n in names}
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    return {n: (found[n], errors.get(found[n] or n)) for n in names}


@check("cann.libs")
def check_cann_libs(ctx: Context) -> Result:
    """libascendcl.so and libhccl.so can be loaded (dlopen in a child; --quick: found on LD_LIBRARY_PATH)."""
    skip = skip_unless(ctx, "npu")
    if skip:
        return skip
    status = lib_status(ctx, ["libascendcl.so", "libhccl.so"])
    bad = {n: err for n, (_, err) in status.items() if err}
    data = {n: {"path": p, "error": e} for n, (p, e) in status.items()}
    if not bad:
        how = "found" if ctx.quick else "load"
        return Result(PASS, f"libascendcl.so and libhccl.so {how} ({status['libascendcl.so'][0] or 'system'})",
                      data=data)
    home = toolkit_home(ctx)
    if not home:
        fix = (f"the image has no CANN toolkit{no_cann_reason(ctx)}; build it from a CANN base; {CPU_ON_PURPOSE}")
    else:
        fix = (f"source {_set_env_script(home)} so LD_LIBRARY_PATH holds the CANN lib64 dirs, and mount the "
               f"driver ({NPU_DRIVER_MOUNTS[DRIVER_LIB64]})")
    detail = "; ".join(e if e.startswith(n) else f"{n}: {e}" for n, e in bad.items())
    return Result(FAIL, f"CANN libraries cannot be loaded: {detail}", fix, data)


# ---------------------------------------------------------------------------------------------------
# checks: devices


def device_nodes(ctx: Context, pattern: str, prefix: str) -> list[int]:
    ids = []
    for p in glob.glob(ctx.path(pattern)):
        tail = os.path.basename(p)[len(prefix):]
        if tail.isdigit():
            ids.append(int(tail))
    return sorted(ids)


@check("npu.devices")
def check_npu_devices(ctx: Context) -> Result:
    """NPU device nodes are mounted: /dev/davinciN, /dev/davinci_manager, /dev/devmm_svm, /dev/hisi_hdc."""
    skip = skip_unless(ctx, "npu")
    if skip:
        return skip
    cards = device_nodes(ctx, "/dev/davinci[0-9]*", "davinci")
    missing = [n for n in NPU_DEVICE_NODES if not ctx.exists(n)]
    data = {"cards": cards, "missing": missing}
    if not cards or missing:
        what = ([f"no {NPU_CARD_NODE}N card"] if not cards else []) + missing
        return Result(FAIL, f"NPU device nodes missing: {', '.join(what)}",
                      f"run the container with {NPU_DOCKER_FLAGS} (trainbox launch adds them); {CPU_ON_PURPOSE}",
                      data)
    return Result(PASS, f"{len(cards)} NPU(s): " + ", ".join(f"{NPU_CARD_NODE}{i}" for i in cards)
                  + " and the manager nodes", data=data)


@check("npu.driver")
def check_npu_driver(ctx: Context) -> Result:
    """The host's NPU driver is mounted: driver lib64 (libascend_hal.so), version.info, npu-smi, dcmi."""
    skip = skip_unless(ctx, "npu")
    if skip:
        return skip
    lib64 = DRIVER_LIB64
    hal = [p for p in (f"{lib64}/libascend_hal.so", f"{lib64}/driver/libascend_hal.so") if ctx.exists(p)]
    missing = [p for p in NPU_DRIVER_MOUNTS if p != lib64 and not ctx.exists(p)]
    if NPU_SMI in missing and find_command(ctx, "npu-smi"):
        missing.remove(NPU_SMI)
    version = read_kv(ctx.path(DRIVER_VERSION_INFO)).get("version")
    data = {"libascend_hal": hal[0] if hal else None, "driver_version": version, "missing": missing}
    if not hal:
        mounts = [NPU_DRIVER_MOUNTS[lib64]] + [NPU_DRIVER_MOUNTS[p] for p in missing]
        return Result(FAIL, f"NPU driver not mounted: no libascend_hal.so under {lib64}",
                      "run the container with " + " ".join(mounts) + f"; {CPU_ON_PURPOSE}", data)
    if missing:
        return Result(WARN, f"driver {version or '(version unknown)'} mounted, but missing: {', '.join(missing)} "
                            "(npu-smi and device queries need them)",
                      "add " + " ".join(NPU_DRIVER_MOUNTS[p] for p in missing), data)
    return Result(PASS, f"NPU driver {version or '(version unknown)'} mounted with npu-smi", data=data)


def visible_check(ctx: Context, var: str, count: int, kind: str, allow_uuid: bool = False) -> Result:
    value = ctx.env.get(var)
    data = {var: value, "devices": count}
    if value is None:
        return Result(PASS, f"{var} unset: all {count} {kind}(s) visible", data=data)
    if value.strip() in ("", "-1") or value.strip().lower() == "none":
        return Result(FAIL, f"{var}={value!r} hides every {kind}", f"unset {var} or list device ids 0..{count - 1}",
                      data)
    if allow_uuid and any(p.strip().startswith(("GPU-", "MIG-")) for p in value.split(",")):
        return Result(PASS, f"{var}={value} (UUIDs; not compared with device nodes)", data=data)
    ids, bad = parse_ids(value)
    if ids is None:
        return Result(FAIL, f"{var}={value!r}: {bad!r} is not a device id (expected comma-separated integers "
                            "such as 0,1,2,3; ranges like 0-3 are not understood)",
                      f"write the ids out: {var}=" + ",".join(str(i) for i in range(max(count, 1))), data)
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        return Result(FAIL, f"{var}={value} repeats id {dups[0]}", f"list each device once in {var}", data)
    over = [i for i in ids if i >= count]
    if over:
        return Result(FAIL, f"{var}={value} names device {over[0]}, but this container has {count} {kind}(s): "
                            f"ids count the {kind}s the container sees, 0..{count - 1}, not the host's "
                            "/dev numbers",
                      f"set {var}=" + ",".join(str(i) for i in range(count)) + f" (or a subset), or unset it; "
                      f"mount more {kind}s if the job needs {len(ids)}", data)
    return Result(PASS, f"{var}={value}: {len(ids)} of {count} {kind}(s)", data=data)


@check("npu.visible_devices")
def check_npu_visible(ctx: Context) -> Result:
    """ASCEND_RT_VISIBLE_DEVICES names existing NPUs (ids 0..n-1 of the mounted cards)."""
    skip = skip_unless(ctx, "npu")
    if skip:
        return skip
    count = len(device_nodes(ctx, "/dev/davinci[0-9]*", "davinci"))
    if count == 0:
        return Result(SKIP, "no NPU mounted (see npu.devices)")
    return visible_check(ctx, "ASCEND_RT_VISIBLE_DEVICES", count, "NPU")




_ALLOC_KEYS = ("max_split_size_mb", "garbage_collection_threshold", "expandable_segments",
               "base_addr_aligned_kb", "page_size", "segment_size_mb")


@check("npu.alloc_conf")
def check_alloc_conf(ctx: Context) -> Result:
    """PYTORCH_NPU_ALLOC_CONF parses, its values are in range and its options do not contradict each other."""
    value = ctx.env.get("PYTORCH_NPU_ALLOC_CONF")
    data = {"PYTORCH_NPU_ALLOC_CONF": value}
    if not value:  # empty: the allocator's defaults (the relax stack empties the npu line's setting)
        return Result(SKIP, "PYTORCH_NPU_ALLOC_CONF unset" if value is None else "PYTORCH_NPU_ALLOC_CONF empty")
    fmt = "write it as option:value,option:value (e.g. expandable_segments:True)"
    opts: dict[str, str] = {}
    dup = []
    for item in value.split(","):
        if not item.strip():
            continue
        k, sep, v = item.partition(":")
        k, v = k.strip(), v.strip()
        if not sep or not k or not v:
            return Result(FAIL, f"PYTORCH_NPU_ALLOC_CONF={value!r}: {item!r} is not option:value", fmt, data)
        if k in opts:
            dup.append(k)
        opts[k] = v
    data["options"] = opts
    unknown = [k for k in opts if k not in _ALLOC_KEYS]
    if unknown:
        return Result(FAIL, f"PYTORCH_NPU_ALLOC_CONF: unknown option {unknown[0]!r} (the allocator rejects it "
                            "when it starts)", "use " + ", ".join(_ALLOC_KEYS), data)

    def bad(msg, fix):
        return Result(FAIL, f"PYTORCH_NPU_ALLOC_CONF: {msg}", fix, data)

    if "max_split_size_mb" in opts and (parse_int(opts["max_split_size_mb"]) or 0) <= 20:
        return bad(f"max_split_size_mb:{opts['max_split_size_mb']} must be an integer above 20 (MB)",
                   "set max_split_size_mb to more than 20, or drop it")
    if "garbage_collection_threshold" in opts:
        try:
            g = float(opts["garbage_collection_threshold"])
        except ValueError:
            g = -1.0
        if not 0.0 < g < 1.0:
            return bad(f"garbage_collection_threshold:{opts['garbage_collection_threshold']} must lie in (0.0, 1.0)",
                       "use a fraction such as 0.6")
    exp = opts.get("expandable_segments")
    if exp is not None and exp not in ("True", "False", "true", "false"):
        return bad(f"expandable_segments:{exp} must be True or False", "write expandable_segments:True")
    expandable = (exp or "").lower() == "true"
    if "base_addr_aligned_kb" in opts:
        b = parse_int(opts["base_addr_aligned_kb"])
        if b is None or not 0 <= b <= 16:
            return bad(f"base_addr_aligned_kb:{opts['base_addr_aligned_kb']} must be an integer 0-16",
                       "use base_addr_aligned_kb:16 (the default) or drop it")
    if "page_size" in opts and opts["page_size"].lower() not in ("1g", "1gb"):
        return bad(f"page_size:{opts['page_size']} is not supported (only 1g)", "use page_size:1g or drop it")
    if "segment_size_mb" in opts and (parse_int(opts["segment_size_mb"]) or 0) <= 0:
        return bad(f"segment_size_mb:{opts['segment_size_mb']} must be a positive integer", "drop it or fix it")
    if expandable:
        clash = [k for k in ("max_split_size_mb", "garbage_collection_threshold") if k in opts]
        if clash:
            return bad(f"expandable_segments:True together with {' and '.join(clash)}: torch_npu requires "
                       "expandable_segments False when either is set",
                       f"keep expandable_segments:True and drop {', '.join(clash)}, or drop expandable_segments")
    else:
        inert = [k for k in ("base_addr_aligned_kb", "segment_size_mb") if k in opts]
        if inert:
            return Result(WARN, f"PYTORCH_NPU_ALLOC_CONF: {', '.join(inert)} only act with "
                                "expandable_segments:True, which is not set", "add expandable_segments:True or "
                                "drop " + ", ".join(inert), data)
    if dup:
        return Result(WARN, f"PYTORCH_NPU_ALLOC_CONF sets {dup[0]} twice; the last value wins",
                      f"keep one {dup[0]}", data)
    return Result(PASS, f"PYTORCH_NPU_ALLOC_CONF={value}", data=data)


@check("npu.streams_per_device")
def check_streams(ctx: Context) -> Result:
    """STREAMS_PER_DEVICE is 8 or 32, the only values torch_npu accepts."""
    v = ctx.env.get("STREAMS_PER_DEVICE")
    if v is None:
        return Result(SKIP, "STREAMS_PER_DEVICE unset (torch_npu default)")
    if v.strip() not in ("8", "32"):
        return Result(FAIL, f"STREAMS_PER_DEVICE={v!r}: torch_npu accepts only 8 or 32",
                      "set STREAMS_PER_DEVICE=8 or 32, or unset it", {"STREAMS_PER_DEVICE": v})
    return Result(PASS, f"STREAMS_PER_DEVICE={v}", data={"STREAMS_PER_DEVICE": v})


@check("npu.task_queue")
def check_task_queue(ctx: Context) -> Result:
    """TASK_QUEUE_ENABLE is 0, 1 or 2."""
    v = ctx.env.get("TASK_QUEUE_ENABLE")
    if v is None:
        return Result(SKIP, "TASK_QUEUE_ENABLE unset (torch_npu default)")
    if v.strip() not in ("0", "1", "2"):
        return Result(FAIL, f"TASK_QUEUE_ENABLE={v!r}: torch_npu accepts 0 (off), 1 or 2",
                      "set TASK_QUEUE_ENABLE=1 or 2 (2 is the faster queue), or unset it", {"TASK_QUEUE_ENABLE": v})
    return Result(PASS, f"TASK_QUEUE_ENABLE={v}", data={"TASK_QUEUE_ENABLE": v})


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
