"""Doctor checks: packages."""

from __future__ import annotations

import json
import re
import sys

from ..installed import SBOM_FILE, canon, distributions
from ..manifest import manifest_path
from ..npu import TOOLKIT_SET_ENV
from .core import (
    CPU_ON_PURPOSE,
    DEVICES,
    FAIL,
    IMPORT_S_VAR,
    PASS,
    SKIP,
    WARN,
    Context,
    Result,
    check,
    device_origin,
    major_minor,
    no_cann_reason,
    run_python,
    toolkit_home,
    versions_match,
)

# ---------------------------------------------------------------------------------------------------
# checks: stack and packages


@check("manifest")
def check_manifest(ctx: Context) -> Result:
    """The stack manifest (/etc/trainbox/stack.json) is present and readable."""
    if ctx.manifest_error:
        return Result(FAIL, ctx.manifest_error,
                      "rebuild the image, or point TRAINBOX_MANIFEST / --manifest at a valid manifest")
    if not ctx.manifest:
        where = manifest_path(ctx.env.get("TRAINBOX_MANIFEST") or None)
        return Result(SKIP, f"no stack manifest at {where} (not inside a trainbox image): package versions "
                            "are not checked; pass --manifest PATH to check against a stack")
    m = ctx.manifest
    comps = m.get("components") or {}
    base = m.get("base") or {}
    plat = f", {m['platform']}" if m.get("platform") else ""
    msg = (f"stack {m.get('stack')} (device {m.get('device')}, python {m.get('python')}{plat}, "
           f"{len(comps)} components) from {ctx.manifest_file}")
    if base.get("substituted"):
        msg += f"; built on substitute base {base['substituted']} instead of {base.get('image')}"
    left_out = m.get("left_out") or {}
    data = {"stack": m.get("stack"), "trainbox_version": m.get("trainbox_version"), "left_out": left_out,
            "substituted": base.get("substituted"), "platform": m.get("platform")}  # what `image ls` shows as SUBST (the same fact, as a label)
    if left_out:  # compiled components a substitute base cannot build: this image lacks them, by design
        msg += "; left out: " + "; ".join(f"{k} ({why})" for k, why in sorted(left_out.items()))
        return Result(WARN, msg, "build the image on the stack's own base to include them", data=data)
    return Result(PASS, msg, data=data)


@check("python.version")
def check_python(ctx: Context) -> Result:
    """The running Python is the one the stack was built for."""
    want = (ctx.manifest or {}).get("python")
    have = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if not want:
        return Result(SKIP, f"python {have}; no stack manifest to compare with")
    if str(want) == have:
        return Result(PASS, f"python {have} ({sys.executable}) as the stack pins", data={"python": have})
    return Result(FAIL, f"this is python {have} ({sys.executable}) but the stack's packages were installed "
                        f"for python {want}", f"run the stack's interpreter (python{want}); check PATH, a "
                        "virtualenv or conda activation that puts another python first",
                  data={"python": have, "expected": want})


@check("packages.versions")
def check_versions(ctx: Context) -> Result:
    """Installed package versions match the stack manifest (drift after a user's `pip install`)."""
    if not ctx.manifest:
        return Result(SKIP, "no stack manifest to compare with")
    comps = ctx.manifest.get("components") or {}
    if not comps:
        return Result(SKIP, "the stack manifest lists no components")
    drifted, missing, checked, unpinned = [], [], [], []
    reinstall = []  # pip requirement strings that restore the pins
    for key, comp in comps.items():
        if comp.get("install") in (False, "tree"):  # trees: packages.sources checks their commit
            continue
        name = comp.get("name") or key
        want = comp.get("version")
        if not want:
            unpinned.append(name)
            continue
        have = ctx.dist_version(name)
        checked.append(name)
        commit, have_commit = comp.get("commit"), ctx.dist_commit(name) if have else None
        if have is None:
            missing.append((name, want))
        elif not versions_match(str(want), have):
            drifted.append((name, want, have))
        elif commit and have_commit and have_commit != commit:
            # same version string, other source: a reinstall from another commit of the same release
            drifted.append((name, f"{want} @ {commit[:12]}", f"{have} @ {have_commit[:12]}"))
        else:
            continue
        git = comp.get("git") if comp.get("source") == "git" else None
        reinstall.append(f"'{name} @ git+{git}@{commit}'" if git and commit else f"'{name}=={want}'")
    data = {"checked": checked, "drifted": [{"name": n, "expected": w, "installed": h} for n, w, h in drifted],
            "missing": [{"name": n, "expected": w} for n, w in missing], "unversioned": unpinned}
    if drifted or missing:
        parts = [f"{n} {h} installed, stack pins {w}" for n, w, h in drifted]
        parts += [f"{n} not installed, stack pins {w}" for n, w in missing]
        return Result(FAIL, "drift from the stack: " + "; ".join(parts),
                      f"pip install --no-deps {' '.join(reinstall)} (or rebuild the image with the new pin in the "
                      "stack YAML, so the change is recorded)", data)
    return Result(PASS, f"{len(checked)} packages match the stack"
                        + (f" ({len(unpinned)} without a version pin not compared)" if unpinned else ""),
                  data=data)


@check("packages.sources")
def check_sources(ctx: Context) -> Result:
    """Source trees (`install: tree` git components) are the commits the manifest names, and on sys.path."""
    comps = (ctx.manifest or {}).get("components") or {}
    trees = {k: c for k, c in comps.items() if c.get("install") == "tree" and c.get("path")}
    if not trees:
        return Result(SKIP, "the stack installs no source trees")
    bad, good = [], []
    for key, c in sorted(trees.items()):
        found = _tree_marker(ctx, c["path"])
        if found is None:
            bad.append(f"{key}: no tree at {c['path']}")
            continue
        if found.get("commit") != c.get("commit"):
            bad.append(f"{key}: {c['path']} holds {found.get('commit')}, the stack pins {c.get('commit')}")
        elif ctx.root in ("", "/") and c["path"] not in sys.path:
            bad.append(f"{key}: {c['path']} is not on sys.path (its .pth file in site-packages is gone)")
        else:
            good.append(f"{key} @ {str(c.get('commit'))[:12]}")
    if bad:
        return Result(FAIL, "source trees differ from the stack: " + "; ".join(bad),
                      "rebuild the image; trees are not meant to be edited in place", data={"problems": bad})
    return Result(PASS, "source trees as pinned: " + ", ".join(good), data={"trees": good})


@check("packages.sbom")
def check_sbom(ctx: Context) -> Result:
    """The image's SBOM (/etc/trainbox/sbom.cdx.json, written by `trainbox image build`) lists every installed
    distribution at its installed version, and nothing that is not installed."""
    if not ctx.manifest:
        return Result(SKIP, "not inside a trainbox image (no stack manifest): no SBOM to check")
    path = ctx.path(SBOM_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return Result(WARN, f"no SBOM at {SBOM_FILE}: the image was not built by `trainbox image build` (a plain "
                            "`docker build` adds none)", "build it with `trainbox image build STACK`")
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: thousands of brackets deep
        return Result(FAIL, f"{SBOM_FILE} cannot be read as JSON: {exc}", "rebuild the image")
    listed = {}
    for c in doc.get("components") or [] if isinstance(doc, dict) else []:
        if isinstance(c, dict) and str(c.get("purl", "")).startswith("pkg:pypi/"):
            listed[canon(str(c.get("name")))] = c.get("version")
    have = {d["canonical_name"]: d["version"] for d in distributions(ctx.sys_path)}
    problems = [f"{n} {v} installed, not in the SBOM" for n, v in sorted(have.items()) if n not in listed]
    problems += [f"{n} {v} in the SBOM, not installed" for n, v in sorted(listed.items()) if n not in have]
    problems += [f"{n} installed {have[n]}, SBOM {listed[n]}" for n in sorted(have)
                 if n in listed and listed[n] != have[n]]
    if problems:
        return Result(FAIL, f"the SBOM at {SBOM_FILE} differs from what is installed: " + "; ".join(problems[:8])
                      + (f" (+{len(problems) - 8} more)" if len(problems) > 8 else ""),
                      "something was installed or removed after the build: rebuild the image",
                      data={"problems": problems})
    return Result(PASS, f"SBOM {SBOM_FILE} lists all {len(have)} installed distributions at their versions",
                  data={"distributions": len(have)})


def _tree_marker(ctx: Context, path: str) -> dict | None:
    """The .trainbox-source.json the build wrote at the tree's root (the path may be a subdir of it)."""
    parts = path.rstrip("/").split("/")
    for n in range(len(parts), 2, -1):
        f = ctx.path("/".join(parts[:n]) + "/.trainbox-source.json")
        try:
            with open(f) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            continue
    return None


@check("packages.torch_npu")
def check_torch_npu_pair(ctx: Context) -> Result:
    """torch and torch_npu agree in major.minor, and torch is not a CUDA build next to torch_npu."""
    npu = ctx.dist_version("torch_npu")
    if npu is None:
        return Result(SKIP, "torch_npu is not installed")
    torch = ctx.dist_version("torch")
    if torch is None:
        return Result(FAIL, f"torch_npu {npu} is installed but torch is not",
                      f"pip install 'torch=={npu.split('.post')[0].split('+')[0]}' from the CPU index")
    data = {"torch": torch, "torch_npu": npu}
    local = torch.partition("+")[2].lower()
    if local.startswith(("cu", "rocm")):
        return Result(FAIL, f"torch {torch} is a {local} build; with torch_npu {npu} it fails at import",
                      "install the CPU build of torch (PyTorch's CPU index on x86_64, PyPI on aarch64) at the "
                      "same version", data)
    tm, nm = major_minor(torch), major_minor(npu)
    if tm != nm:
        return Result(FAIL, f"torch {torch} and torch_npu {npu} differ in major.minor: torch_npu's extension "
                            "is built against one torch and fails with undefined symbols on another",
                      f"pip install torch_npu matching torch {tm[0]}.{tm[1]}.x, or torch matching "
                      f"torch_npu {nm[0]}.{nm[1]}" if tm and nm else "install matching versions", data)
    return Result(PASS, f"torch {torch} and torch_npu {npu} match", data=data)


@check("device.selection")
def check_device_selection(ctx: Context) -> Result:
    """TRAINBOX_DEVICE and TORCH_DEVICE_BACKEND_AUTOLOAD agree with the stack's device."""
    forced = ctx.env.get("TRAINBOX_DEVICE")
    autoload = ctx.env.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    data = {"device": ctx.device, "source": ctx.device_source, "stack_device": ctx.stack_device}
    if forced is not None and forced.strip().lower() not in DEVICES:
        return Result(FAIL, f"TRAINBOX_DEVICE={forced!r} is not a device type",
                      "set TRAINBOX_DEVICE to npu, cuda or cpu, or unset it to use the stack's device", data)
    has_npu_ext = ctx.dist_version("torch_npu") is not None
    if ctx.device == "cpu" and has_npu_ext and autoload != "0":
        return Result(WARN, "device is cpu but torch_npu is installed and auto-loads at `import torch`; without "
                            "CANN that import fails", "set TORCH_DEVICE_BACKEND_AUTOLOAD=0 (the trainbox "
                            "entrypoint does this when TRAINBOX_DEVICE=cpu; a command that bypasses it does not)",
                      data)
    if ctx.device == "npu" and autoload == "0":
        return Result(WARN, "TORCH_DEVICE_BACKEND_AUTOLOAD=0 on an NPU environment: `import torch` no longer "
                            "loads torch_npu, so torch.npu is missing until code imports torch_npu itself",
                      "unset TORCH_DEVICE_BACKEND_AUTOLOAD, or `import torch_npu` before using the NPU", data)
    if ctx.stack_device and ctx.device != ctx.stack_device:
        return Result(PASS, f"TRAINBOX_DEVICE={ctx.device} overrides the stack's {ctx.stack_device} on "
                            "purpose; device checks follow the override", data=data)
    return Result(PASS, f"device {ctx.device} ({device_origin(ctx)})", data=data)


# ---------------------------------------------------------------------------------------------------
# checks: torch import (child process)

_TORCH_PROBE = """
import json
import torch
out = {"torch": torch.__version__, "cuda": None, "npu": None}
try:
    out["cuda"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception as exc:
    out["cuda_error"] = str(exc)
npu = getattr(torch, "npu", None)
if npu is not None:
    try:
        out["npu"] = npu.device_count() if npu.is_available() else 0
    except Exception as exc:
        out["npu_error"] = str(exc)
print("TRAINBOX_PROBE " + json.dumps(out))
"""

_MISSING_LIB = re.compile(r"([\w.+-]+\.so(?:\.[\d.]+)?): cannot open shared object file")
_BACKEND = re.compile(r"Failed to load the backend extension: (\w+)")
_UNDEFINED = re.compile(r"undefined symbol: (\S+)")
_LAST_ERROR = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Exit)): ?(.*)$", re.M)


def explain_import_failure(stderr: str, ctx: Context | None = None) -> tuple[str, str]:
    """(message, fix) for a failed `import torch`, naming the real cause, not the last traceback line."""
    backend = _BACKEND.search(stderr)
    missing = _MISSING_LIB.search(stderr)
    undefined = _UNDEFINED.search(stderr)
    last = _LAST_ERROR.findall(stderr)
    last_line = f"{last[-1][0]}: {last[-1][1]}" if last else (stderr.strip().splitlines() or ["no output"])[-1]
    ext = backend.group(1) if backend else None
    if missing:
        lib = missing.group(1)
        who = f"{ext} (which torch auto-loads)" if ext else "torch"
        where = ""
        if ctx is not None:
            home = toolkit_home(ctx)
            if home is None and lib.startswith(("libhccl", "libascend", "libacl", "libge_", "libgraph",
                                                  "libopapi", "libruntime")):
                where = f": the image has no CANN toolkit{no_cann_reason(ctx)}"
            elif home is not None:
                where = f": CANN is at {home} but its lib64 dirs are not on LD_LIBRARY_PATH"
        msg = f"`import torch` fails: {who} cannot load {lib}{where}"
        if (ext and "npu" in ext) or lib.startswith(("libhccl", "libascend")):
            fix = ("on an NPU host mount the driver and devices and source CANN (source "
                   f"{TOOLKIT_SET_ENV[0]}; the trainbox entrypoint does); "
                   "to run without an NPU on purpose set TRAINBOX_DEVICE=cpu or TORCH_DEVICE_BACKEND_AUTOLOAD=0")
        else:
            fix = f"install the package that provides {lib}, or add its directory to LD_LIBRARY_PATH"
        return msg, fix
    if undefined:
        who = ext or "torch"
        return (f"`import torch` fails: {who} has an undefined symbol {undefined.group(1)}: it was built for "
                "another torch version",
                "install torch and torch_npu with the same major.minor (see packages.torch_npu)")
    if ext:
        return (f"`import torch` fails: the auto-loaded backend {ext} raised {last_line}",
                f"fix {ext}'s installation, or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to import torch without it")
    return f"`import torch` fails: {last_line}", "reinstall torch at the stack's version"


@check("torch.import", quick=False)
def check_torch_import(ctx: Context) -> Result:
    """`import torch` works (tried in a child process) and sees the stack's accelerator."""
    want = ((ctx.manifest or {}).get("components") or {}).get("torch")
    proc = run_python(ctx, _TORCH_PROBE)
    if proc is None:
        slow = "; under emulation" if ctx.emulated else ""
        return Result(FAIL, f"`import torch` did not finish within {ctx.timeout:g} s ({ctx.timeout_source}"
                      f"{slow})",
                      "check for a hung device (npu-smi info / nvidia-smi) or a slow network filesystem on "
                      f"sys.path; where the machine is merely slow (qemu, a loaded host) raise {IMPORT_S_VAR}",
                      {"timeout_s": ctx.timeout, "emulated": ctx.emulated})
    if proc.returncode != 0:
        if "No module named 'torch'" in proc.stderr:
            if want:
                return Result(FAIL, "torch is not installed, but the stack pins it",
                              f"pip install 'torch=={want.get('version')}' or rebuild the image")
            return Result(SKIP, "torch is not installed")
        if proc.returncode < 0:
            import signal

            try:
                sig = signal.Signals(-proc.returncode).name
            except ValueError:
                sig = str(-proc.returncode)
            return Result(FAIL, f"`import torch` crashed with {sig}", "run `python -X faulthandler -c 'import "
                          "torch'` to see where; a torch/torch_npu or driver mismatch is the usual cause")
        msg, fix = explain_import_failure(proc.stderr, ctx)
        return Result(FAIL, msg, fix, {"stderr_tail": proc.stderr.strip()[-2000:]})
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("TRAINBOX_PROBE ")]
    info = json.loads(line[-1].split(" ", 1)[1]) if line else {}
    data = dict(info)
    dev = ctx.device
    count = info.get(dev) if dev in ("npu", "cuda") else None
    if dev in ("npu", "cuda") and not count:
        err = info.get(f"{dev}_error")
        what = "torch.npu is missing (torch_npu not loaded)" if dev == "npu" and info.get("npu") is None else (
            f"torch.{dev} sees no device" + (f" ({err})" if err else ""))
        return Result(FAIL, f"torch {info.get('torch')} imports, but {what}",
                      "see npu.devices / cuda.driver for the missing mounts; " + CPU_ON_PURPOSE, data)
    msg = f"torch {info.get('torch')} imports"
    if count:
        msg += f" and sees {count} {dev.upper()}(s)"
    return Result(PASS, msg, data=data)


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
