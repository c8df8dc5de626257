"""`trainbox doctor`: say what is wrong with a training environment and how to fix it, one line each.

Runtime module: standard library only, Python 3.10-3.12. It never imports torch (or torch_npu, ray)
into its own process: whether `import torch` works is found out in a child process, so the doctor
runs exactly where `import torch` would crash. Installed versions come from package metadata
(importlib.metadata), which imports nothing.

Each check is a small function registered with `@check(id)`; it returns a Result with a status:

- PASS: checked and fine.
- WARN: works, but is likely to bite (a small /dev/shm, a port range inside the ephemeral range).
- FAIL: will not work as configured (a drifted package, CANN not loadable, a bad device id).
- SKIP: does not apply here (a CUDA check on an NPU stack, a variable that is not set).

Quick checks (no child processes) also run in the container entrypoint when TRAINBOX_CHECK=1|strict.

Exit status of `trainbox doctor`: 1 when any check FAILs (with --strict also when any WARNs), else 0;
2 for a usage error (e.g. --manifest names a missing file).

JSON report (`trainbox doctor --json`), schema 1. Keys are only ever added, never renamed or removed,
within a schema number::

    {
      "schema": 1,
      "trainbox_version": "0.1.0",
      "context": {
        "stack": "npu-910b" | null,          # from the manifest
        "device": "npu" | "cuda" | "cpu",     # the device the checks assume
        "device_source": "TRAINBOX_DEVICE" | "manifest" | "detected",
        "manifest": "/etc/trainbox/stack.json" | null,   # the manifest read, null when none
        "python": "3.11.7",
        "root": "/",                          # filesystem root the checks look under
        "quick": false                        # true: child-process checks were left out
      },
      "summary": {"status": "PASS" | "WARN" | "FAIL",   # worst status (SKIP counts as PASS)
                  "exit_code": 0 | 1,
                  "pass": 12, "warn": 1, "fail": 0, "skip": 9},
      "checks": [
        {"id": "system.shm",                  # stable check id, see CHECK_IDS
         "status": "PASS" | "WARN" | "FAIL" | "SKIP",
         "message": "what was found (one line)",
         "fix": "how to fix it (one line)" | null,   # null for PASS and SKIP
         "data": {...}}                       # check-specific facts (sizes, versions); may be {}
      ]
    }

Injectable roots (for tests and for checking a mounted image tree): `Context(root=...)` or
TRAINBOX_DOCTOR_ROOT makes every absolute path the checks look at (/dev, /usr/local/Ascend, /etc,
/proc/sys) relative to that directory.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys

from . import __version__
from .manifest import ManifestError, load_manifest, manifest_path

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
_RANK = {SKIP: 0, PASS: 0, WARN: 1, FAIL: 2}
DEVICES = ("npu", "cuda", "cpu")

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
CPU_ON_PURPOSE = ("to run without an accelerator on purpose, set TRAINBOX_DEVICE=cpu (the entrypoint then "
                  "sets TORCH_DEVICE_BACKEND_AUTOLOAD=0)")

GiB = 1 << 30
MiB = 1 << 20


class Result:
    """One finding. `id` is filled in by the runner from the check's registration."""

    __slots__ = ("id", "status", "message", "fix", "data")

    def __init__(self, status: str, message: str, fix: str | None = None, data: dict | None = None,
                 id: str = ""):
        self.id = id
        self.status = status
        self.message = message
        self.fix = fix if status in (WARN, FAIL) else None
        self.data = data or {}

    def to_dict(self) -> dict:
        return {"id": self.id, "status": self.status, "message": self.message, "fix": self.fix,
                "data": self.data}

    def line(self) -> str:
        text = f"{self.status} {self.id}: {self.message}"
        if self.fix:
            text += f" -> fix: {self.fix}"
        return text

    def __repr__(self) -> str:
        return f"Result({self.line()!r})"


class Context:
    """Everything a check may look at; every part can be replaced by a test."""

    def __init__(self, env: dict | None = None, root: str | None = None, manifest: dict | None = None,
                 manifest_file: str | None = None, manifest_error: str | None = None,
                 python: str | None = None, sys_path: list | None = None, quick: bool = False,
                 timeout: float = 120.0):
        self.env = dict(os.environ if env is None else env)
        self.root = root or self.env.get("TRAINBOX_DOCTOR_ROOT") or "/"
        self.manifest = manifest
        self.manifest_file = manifest_file
        self.manifest_error = manifest_error
        self.python = python or sys.executable
        self.sys_path = sys_path  # where package metadata is looked up; None: this interpreter's sys.path
        self.quick = quick
        self.timeout = timeout
        self.stack_device = (manifest or {}).get("device")
        self.device, self.device_source = self._resolve_device()
        self._dists: dict = {}

    @classmethod
    def from_environment(cls, manifest: str | None = None, quick: bool = False, env: dict | None = None,
                         **kw) -> "Context":
        """Load the manifest (explicit path, $TRAINBOX_MANIFEST or the default) and build a context."""
        env = dict(os.environ if env is None else env)
        path = manifest or env.get("TRAINBOX_MANIFEST") or None
        resolved = manifest_path(path)
        data, error = None, None
        try:
            data = load_manifest(resolved)
        except ManifestError as exc:
            error = str(exc)
        return cls(env=env, manifest=data, manifest_file=resolved if (data or error) else None,
                   manifest_error=error, quick=quick, **kw)

    def path(self, p: str) -> str:
        """An absolute path as seen under the injected root."""
        if self.root in ("", "/"):
            return p
        return os.path.join(self.root, p.lstrip("/"))

    def exists(self, p: str) -> bool:
        return os.path.lexists(self.path(p))

    def dist(self, name: str):
        """The installed distribution that `import` would see first (importlib.metadata; imports nothing)."""
        key = _canon_name(name)
        if key not in self._dists:
            from importlib import metadata

            self._dists[key] = next(iter(metadata.distributions(name=name, path=self.sys_path or sys.path)), None)
        return self._dists[key]

    def dist_version(self, name: str) -> str | None:
        d = self.dist(name)
        return d.version if d is not None else None

    def dist_commit(self, name: str) -> str | None:
        """The VCS commit a distribution was installed from (PEP 610 direct_url.json), if pip recorded one."""
        d = self.dist(name)
        try:
            info = json.loads((d.read_text("direct_url.json") if d is not None else None) or "{}")
        except ValueError:
            return None
        return (info.get("vcs_info") or {}).get("commit_id")

    def _resolve_device(self) -> tuple[str, str]:
        forced = (self.env.get("TRAINBOX_DEVICE") or "").strip().lower()
        if forced in DEVICES:
            return forced, "TRAINBOX_DEVICE"
        if self.stack_device in DEVICES:
            return self.stack_device, "manifest"
        # A bare host: judge by what is mounted.
        if self.exists("/dev/davinci_manager") or glob.glob(self.path("/dev/davinci[0-9]*")):
            return "npu", "detected"
        if self.exists("/dev/nvidiactl"):
            return "cuda", "detected"
        return "cpu", "detected"


class Check:
    __slots__ = ("id", "func", "quick", "doc")

    def __init__(self, id: str, func, quick: bool, doc: str):
        self.id, self.func, self.quick, self.doc = id, func, quick, doc


CHECKS: list[Check] = []


def check(id: str, quick: bool = True):
    """Register a check. quick=False: the check starts child processes and is left out of --quick."""

    def deco(func):
        doc = (func.__doc__ or "").strip().splitlines()[0] if func.__doc__ else ""
        CHECKS.append(Check(id, func, quick, doc))
        return func

    return deco


def run_checks(ctx: Context, only: list | None = None) -> list[Result]:
    results = []
    for chk in CHECKS:
        if only and chk.id not in only:
            continue
        if ctx.quick and not chk.quick:
            continue
        try:
            res = chk.func(ctx)
        except Exception as exc:  # a broken check must not hide the others
            res = Result(FAIL, f"the check itself failed: {type(exc).__name__}: {exc}",
                         "report this as a trainbox bug, with `trainbox doctor --json` output")
        res.id = chk.id
        results.append(res)
    return results


def summarize(results: list[Result], strict: bool = False) -> dict:
    counts = {s.lower(): 0 for s in (PASS, WARN, FAIL, SKIP)}
    worst = PASS
    for r in results:
        counts[r.status.lower()] += 1
        if _RANK[r.status] > _RANK[worst]:
            worst = r.status
    code = 1 if worst == FAIL or (strict and worst == WARN) else 0
    return {"status": worst, "exit_code": code, **counts}


def report(ctx: Context, results: list[Result], strict: bool = False) -> dict:
    return {
        "schema": 1,
        "trainbox_version": __version__,
        "context": {
            "stack": (ctx.manifest or {}).get("stack"),
            "device": ctx.device,
            "device_source": ctx.device_source,
            "manifest": ctx.manifest_file if ctx.manifest else None,
            "python": ".".join(str(x) for x in sys.version_info[:3]),
            "root": ctx.root,
            "quick": ctx.quick,
        },
        "summary": summarize(results, strict),
        "checks": [r.to_dict() for r in results],
    }


def format_text(ctx: Context, results: list[Result], strict: bool = False) -> str:
    stack = (ctx.manifest or {}).get("stack")
    head = f"trainbox doctor {__version__}: "
    head += f"stack {stack}" if stack else "no stack manifest"
    head += f", device {ctx.device} ({_source(ctx)}), python {sys.version.split()[0]}"
    lines = [head]
    lines += [r.line() for r in results]
    s = summarize(results, strict)
    lines.append(f"summary: {s['status']} ({s['pass']} pass, {s['warn']} warn, {s['fail']} fail, "
                 f"{s['skip']} skip)")
    return "\n".join(lines)


def main(manifest: str | None = None, as_json: bool = False, strict: bool = False, quick: bool = False,
         out=None) -> int:
    """What `trainbox doctor` runs. Returns the exit status."""
    out = out or sys.stdout
    if manifest and not os.path.exists(manifest):
        from .errors import TrainboxError

        raise TrainboxError(f"--manifest {manifest}: no such file; give the path of a stack manifest "
                            "(/etc/trainbox/stack.json inside a trainbox image)")
    ctx = Context.from_environment(manifest=manifest, quick=quick)
    results = run_checks(ctx)
    if as_json:
        out.write(json.dumps(report(ctx, results, strict), indent=2) + "\n")
    else:
        out.write(format_text(ctx, results, strict) + "\n")
    out.flush()
    return summarize(results, strict)["exit_code"]


# ---------------------------------------------------------------------------------------------------
# helpers


def _canon_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(.*)$")


def _canon_version(v: str) -> tuple:
    """A light PEP 440 normal form: '2.9' == '2.9.0', '2.9.0-post1' == '2.9.0.post1'."""
    pub, _, local = v.strip().lower().partition("+")
    m = _VERSION.match(pub)
    if not m:
        return (pub, "", local)
    rel = [int(x) for x in m.group(1).split(".")]
    while len(rel) > 1 and rel[-1] == 0:
        rel.pop()
    rest = re.sub(r"[-_.]", "", m.group(2))
    return (tuple(rel), rest, re.sub(r"[-_]", ".", local))


def versions_match(pinned: str, installed: str) -> bool:
    """pip's rule for `==`: a pin without a local label (+cpu) matches any local label."""
    p, i = _canon_version(pinned), _canon_version(installed)
    if not p[2]:
        return p[:2] == i[:2]
    return p == i


def _major_minor(v: str) -> tuple | None:
    m = re.match(r"^v?(\d+)\.(\d+)", v.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _size(n: float) -> str:
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


def _skip_unless(ctx: Context, device: str) -> Result | None:
    if ctx.device == device:
        return None
    return Result(SKIP, f"applies to {device} only; device is {ctx.device} ({_source(ctx)})")


def _source(ctx: Context) -> str:
    return {"TRAINBOX_DEVICE": "set by TRAINBOX_DEVICE", "manifest": "the stack's device",
            "detected": "detected from /dev"}.get(ctx.device_source, ctx.device_source)


def _path_entries(value: str | None) -> list[str]:
    return [p for p in (value or "").split(":") if p]


def _find_lib(ctx: Context, name: str, extra_dirs=()) -> str | None:
    """Where the dynamic loader would find `name` via LD_LIBRARY_PATH or the usual dirs (no loading)."""
    dirs = _path_entries(ctx.env.get("LD_LIBRARY_PATH")) + list(extra_dirs)
    for d in dirs:
        p = os.path.join(ctx.path(d), name)
        if os.path.exists(p):
            return p
    return None


def _which(ctx: Context, name: str) -> str | None:
    """Like shutil.which over the context's PATH, under the injected root."""
    for d in _path_entries(ctx.env.get("PATH")):
        p = os.path.join(ctx.path(d), name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _run_python(ctx: Context, code: str, args=(), env: dict | None = None, timeout: float | None = None):
    """Run `python -c code` in a child; returns CompletedProcess, or None on timeout."""
    import subprocess

    # Drop '' from sys.path: a `torch/` folder in the current directory must not shadow the real one.
    prelude = "import sys\nsys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
    try:
        return subprocess.run([ctx.python, "-c", prelude + code, *args], env=env or ctx.env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=timeout or ctx.timeout)
    except subprocess.TimeoutExpired:
        return None


def _parse_ids(value: str) -> tuple[list[int] | None, str | None]:
    ids = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit():
            return None, part
        ids.append(int(part))
    return ids, None


def _read_kv(path: str) -> dict:
    out = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                k, sep, v = line.partition("=")
                if sep:
                    out[k.strip().lower()] = v.strip()
    except OSError:
        pass
    return out


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
    msg = (f"stack {m.get('stack')} (device {m.get('device')}, python {m.get('python')}, "
           f"{len(comps)} components) from {ctx.manifest_file}")
    if base.get("substituted"):
        msg += f"; built on substitute base {base['substituted']} instead of {base.get('image')}"
    return Result(PASS, msg, data={"stack": m.get("stack"), "trainbox_version": m.get("trainbox_version")})


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
        if comp.get("install") is False:
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
    tm, nm = _major_minor(torch), _major_minor(npu)
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
    return Result(PASS, f"device {ctx.device} ({_source(ctx)})", data=data)


# ---------------------------------------------------------------------------------------------------
# checks: CANN


def _toolkit_home(ctx: Context) -> str | None:
    """The CANN toolkit home (a path as seen inside the container), or None."""
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        v = ctx.env.get(var)
        if v and os.path.isdir(ctx.path(v)):
            return v
    for home in TOOLKIT_HOMES:
        if os.path.isdir(ctx.path(home)):
            return home
    versioned = sorted(glob.glob(ctx.path("/usr/local/Ascend/cann-*")))
    if versioned:  # report it as the container sees it, not under the injected root
        return "/" + os.path.relpath(versioned[-1], ctx.path("/"))
    return None


def _toolkit_version(ctx: Context, home: str) -> str | None:
    for info in sorted(glob.glob(os.path.join(ctx.path(home), "*-linux", "ascend_toolkit_install.info"))):
        v = _read_kv(info).get("version")
        if v:
            return v
    return None


def _set_env_script(home: str) -> str:
    # ascend-toolkit/latest -> ascend-toolkit/set_env.sh; cann -> cann/set_env.sh
    parent = os.path.dirname(home.rstrip("/")) if home.rstrip("/").endswith("/latest") else home
    return os.path.join(parent, "set_env.sh")


def _no_cann_reason(ctx: Context) -> str:
    base = (ctx.manifest or {}).get("base") or {}
    if base.get("substituted"):
        return (f", because the image was built on the substitute base {base['substituted']} instead of "
                f"{base.get('image')}")
    return ""


@check("cann.toolkit")
def check_cann_toolkit(ctx: Context) -> Result:
    """The CANN toolkit is installed, at the stack's version."""
    skip = _skip_unless(ctx, "npu")
    if skip:
        return skip
    home = _toolkit_home(ctx)
    want = ((ctx.manifest or {}).get("base") or {}).get("cann")
    if not home:
        looked = ", ".join(TOOLKIT_HOMES + ("/usr/local/Ascend/cann-*",))
        return Result(FAIL, f"no CANN toolkit found (looked in {looked}){_no_cann_reason(ctx)}",
                      "build the image from a CANN base (quay.io/ascend/cann:<cann>-<chip>-...) or mount the "
                      f"toolkit at /usr/local/Ascend/ascend-toolkit; {CPU_ON_PURPOSE}", {"expected": want})
    have = _toolkit_version(ctx, home)
    data = {"home": home, "version": have, "expected": want}
    if want and have and not have.lower().startswith(str(want).lower()):
        return Result(FAIL, f"CANN toolkit {have} at {home}, but the stack was built for CANN {want}",
                      "use the image's own CANN (do not mount a host toolkit over it), or rebuild the stack "
                      f"with base.cann {have}", data)
    if not have:
        return Result(WARN, f"CANN toolkit at {home}, but its version is unknown (no "
                            "<arch>-linux/ascend_toolkit_install.info)",
                      "reinstall the toolkit package; a partial copy of /usr/local/Ascend misses libraries too",
                      data)
    return Result(PASS, f"CANN toolkit {have} at {home}" + (" as the stack pins" if want else ""), data=data)


@check("cann.env")
def check_cann_env(ctx: Context) -> Result:
    """The CANN (and NNAL) environment is set: set_env.sh was sourced or its ENV baked into the image."""
    skip = _skip_unless(ctx, "npu")
    if skip:
        return skip
    home = _toolkit_home(ctx)
    if not home:
        return Result(SKIP, "no CANN toolkit (see cann.toolkit)")
    script = _set_env_script(home)
    set_home = ctx.env.get("ASCEND_TOOLKIT_HOME") or ctx.env.get("ASCEND_HOME_PATH")
    ld = _path_entries(ctx.env.get("LD_LIBRARY_PATH"))
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


def _lib_status(ctx: Context, names: list[str], extra_dirs=()) -> dict:
    """{name: (found_path or None, load_error or None)}; loading happens in a child (quick: search only)."""
    found = {n: _find_lib(ctx, n, extra_dirs) for n in names}
    if ctx.quick:
        return {n: (found[n], None if found[n] else f"{n} not found on LD_LIBRARY_PATH") for n in names}
    env = dict(ctx.env)
    if ctx.root != "/":
        env["LD_LIBRARY_PATH"] = ":".join(ctx.path(d) for d in _path_entries(ctx.env.get("LD_LIBRARY_PATH")))
    targets = [found[n] or n for n in names]
    proc = _run_python(ctx, _LIB_PROBE, targets, env=env, timeout=60)
    if proc is None or proc.returncode != 0:
        why = "timed out" if proc is None else f"exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
        return {n: (found[n], f"probe {why}") for n in names}
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    return {n: (found[n], errors.get(found[n] or n)) for n in names}


@check("cann.libs")
def check_cann_libs(ctx: Context) -> Result:
    """libascendcl.so and libhccl.so can be loaded (dlopen in a child; --quick: found on LD_LIBRARY_PATH)."""
    skip = _skip_unless(ctx, "npu")
    if skip:
        return skip
    status = _lib_status(ctx, ["libascendcl.so", "libhccl.so"])
    bad = {n: err for n, (_, err) in status.items() if err}
    data = {n: {"path": p, "error": e} for n, (p, e) in status.items()}
    if not bad:
        how = "found" if ctx.quick else "load"
        return Result(PASS, f"libascendcl.so and libhccl.so {how} ({status['libascendcl.so'][0] or 'system'})",
                      data=data)
    home = _toolkit_home(ctx)
    if not home:
        fix = (f"the image has no CANN toolkit{_no_cann_reason(ctx)}; build it from a CANN base; {CPU_ON_PURPOSE}")
    else:
        fix = (f"source {_set_env_script(home)} so LD_LIBRARY_PATH holds the CANN lib64 dirs, and mount the "
               "driver (-v /usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64:ro)")
    detail = "; ".join(e if e.startswith(n) else f"{n}: {e}" for n, e in bad.items())
    return Result(FAIL, f"CANN libraries cannot be loaded: {detail}", fix, data)


# ---------------------------------------------------------------------------------------------------
# checks: devices


def _nodes(ctx: Context, pattern: str, prefix: str) -> list[int]:
    ids = []
    for p in glob.glob(ctx.path(pattern)):
        tail = os.path.basename(p)[len(prefix):]
        if tail.isdigit():
            ids.append(int(tail))
    return sorted(ids)


@check("npu.devices")
def check_npu_devices(ctx: Context) -> Result:
    """NPU device nodes are mounted: /dev/davinciN, /dev/davinci_manager, /dev/devmm_svm, /dev/hisi_hdc."""
    skip = _skip_unless(ctx, "npu")
    if skip:
        return skip
    cards = _nodes(ctx, "/dev/davinci[0-9]*", "davinci")
    missing = [n for n in NPU_DEVICE_NODES if not ctx.exists(n)]
    data = {"cards": cards, "missing": missing}
    if not cards or missing:
        what = (["no /dev/davinciN card"] if not cards else []) + missing
        return Result(FAIL, f"NPU device nodes missing: {', '.join(what)}",
                      f"run the container with {NPU_DOCKER_FLAGS} (trainbox launch adds them); {CPU_ON_PURPOSE}",
                      data)
    return Result(PASS, f"{len(cards)} NPU(s): " + ", ".join(f"/dev/davinci{i}" for i in cards)
                  + " and the manager nodes", data=data)


@check("npu.driver")
def check_npu_driver(ctx: Context) -> Result:
    """The host's NPU driver is mounted: driver lib64 (libascend_hal.so), version.info, npu-smi, dcmi."""
    skip = _skip_unless(ctx, "npu")
    if skip:
        return skip
    lib64 = "/usr/local/Ascend/driver/lib64"
    hal = [p for p in (f"{lib64}/libascend_hal.so", f"{lib64}/driver/libascend_hal.so") if ctx.exists(p)]
    missing = [p for p in NPU_DRIVER_MOUNTS if p != lib64 and not ctx.exists(p)]
    if "/usr/local/bin/npu-smi" in missing and _which(ctx, "npu-smi"):
        missing.remove("/usr/local/bin/npu-smi")
    version = _read_kv(ctx.path("/usr/local/Ascend/driver/version.info")).get("version")
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


def _visible_check(ctx: Context, var: str, count: int, kind: str, allow_uuid: bool = False) -> Result:
    value = ctx.env.get(var)
    data = {var: value, "devices": count}
    if value is None:
        return Result(PASS, f"{var} unset: all {count} {kind}(s) visible", data=data)
    if value.strip() in ("", "-1") or value.strip().lower() == "none":
        return Result(FAIL, f"{var}={value!r} hides every {kind}", f"unset {var} or list device ids 0..{count - 1}",
                      data)
    if allow_uuid and any(p.strip().startswith(("GPU-", "MIG-")) for p in value.split(",")):
        return Result(PASS, f"{var}={value} (UUIDs; not compared with device nodes)", data=data)
    ids, bad = _parse_ids(value)
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
    skip = _skip_unless(ctx, "npu")
    if skip:
        return skip
    count = len(_nodes(ctx, "/dev/davinci[0-9]*", "davinci"))
    if count == 0:
        return Result(SKIP, "no NPU mounted (see npu.devices)")
    return _visible_check(ctx, "ASCEND_RT_VISIBLE_DEVICES", count, "NPU")


@check("cuda.driver")
def check_cuda_driver(ctx: Context) -> Result:
    """An NVIDIA GPU and driver are visible: /dev/nvidiactl, /dev/nvidiaN, libcuda.so.1, nvidia-smi."""
    skip = _skip_unless(ctx, "cuda")
    if skip:
        return skip
    gpus = _nodes(ctx, "/dev/nvidia[0-9]*", "nvidia")
    ctl = ctx.exists("/dev/nvidiactl")
    data = {"gpus": gpus}
    fix = ("run with --gpus all (NVIDIA Container Toolkit), or on Kubernetes request nvidia.com/gpu; "
           + CPU_ON_PURPOSE)
    if not gpus or not ctl:
        return Result(FAIL, "no NVIDIA GPU visible (" + ("no /dev/nvidiaN" if not gpus else "no /dev/nvidiactl")
                      + ")", fix, data)
    libdirs = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64")
    status = _lib_status(ctx, ["libcuda.so.1"], libdirs)
    path, err = status["libcuda.so.1"]
    data["libcuda"] = path
    if err:
        return Result(FAIL, f"{len(gpus)} GPU node(s) but the driver library cannot be loaded: {err}",
                      "the NVIDIA Container Toolkit mounts libcuda.so.1: run with --gpus (or --runtime nvidia)",
                      data)
    if not _which(ctx, "nvidia-smi"):
        return Result(WARN, f"{len(gpus)} GPU(s) and libcuda.so.1, but no nvidia-smi on PATH",
                      "run with --gpus all (it mounts nvidia-smi) or NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                      data)
    return Result(PASS, f"{len(gpus)} GPU(s), driver library loads", data=data)


@check("cuda.visible_devices")
def check_cuda_visible(ctx: Context) -> Result:
    """CUDA_VISIBLE_DEVICES names existing GPUs (ids 0..n-1 of the GPUs the container sees, or UUIDs)."""
    skip = _skip_unless(ctx, "cuda")
    if skip:
        return skip
    count = len(_nodes(ctx, "/dev/nvidia[0-9]*", "nvidia"))
    if count == 0:
        return Result(SKIP, "no GPU visible (see cuda.driver)")
    return _visible_check(ctx, "CUDA_VISIBLE_DEVICES", count, "GPU", allow_uuid=True)


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
            home = _toolkit_home(ctx)
            if home is None and lib.startswith(("libhccl", "libascend", "libacl", "libge_", "libgraph",
                                                  "libopapi", "libruntime")):
                where = f": the image has no CANN toolkit{_no_cann_reason(ctx)}"
            elif home is not None:
                where = f": CANN is at {home} but its lib64 dirs are not on LD_LIBRARY_PATH"
        msg = f"`import torch` fails: {who} cannot load {lib}{where}"
        if (ext and "npu" in ext) or lib.startswith(("libhccl", "libascend")):
            fix = ("on an NPU host mount the driver and devices and source CANN (source "
                   "/usr/local/Ascend/ascend-toolkit/set_env.sh; the trainbox entrypoint does); "
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
    proc = _run_python(ctx, _TORCH_PROBE)
    if proc is None:
        return Result(FAIL, f"`import torch` did not finish within {ctx.timeout:.0f} s",
                      "check for a hung device (npu-smi info / nvidia-smi) or a slow network filesystem on "
                      "sys.path")
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


NPU_NOSET = ("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_ASCEND_VISIBLE_DEVICES")
CUDA_NOSET = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


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
        names, visible_var, res = NPU_NOSET, "ASCEND_RT_VISIBLE_DEVICES", "NPU"
    else:
        read, names, visible_var, res = [CUDA_NOSET], (CUDA_NOSET,), "CUDA_VISIBLE_DEVICES", "GPU"
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
    ids, _ = _parse_ids(visible) if visible else (None, None)
    if ids and ids != list(range(len(ids))):
        return Result(WARN, f"{flag} is set and {visible_var}={visible}: Ray hands out the physical ids "
                            f"{visible}, while torch numbers the same devices 0..{len(ids) - 1}",
                      f"map a Ray id to a torch device by its position in {visible_var} "
                      f"(e.g. {visible_var}.split(',').index(str(ray_id)))", data)
    return Result(PASS, f"{flag} is set: Ray leaves {visible_var} alone, every actor sees all {res}s and Ray's "
                        f"assigned ids (get_accelerator_ids()['{res}']) are physical ids to select by hand",
                  data=data)


def _int(value: str) -> int | None:
    try:
        return int(value.strip())
    except ValueError:
        return None


@check("hccl.timeouts")
def check_hccl_timeouts(ctx: Context) -> Result:
    """HCCL_CONNECT_TIMEOUT in [120, 7200] s; HCCL_EXEC_TIMEOUT a valid number for the chip and mode."""
    conn, exe = ctx.env.get("HCCL_CONNECT_TIMEOUT"), ctx.env.get("HCCL_EXEC_TIMEOUT")
    data = {"HCCL_CONNECT_TIMEOUT": conn, "HCCL_EXEC_TIMEOUT": exe}
    if conn is None and exe is None:
        return Result(SKIP, "HCCL_CONNECT_TIMEOUT and HCCL_EXEC_TIMEOUT unset (defaults 120 s and 1836 s)")
    if conn is not None:
        v = _int(conn)
        if v is None or not 120 <= v <= 7200:
            return Result(FAIL, f"HCCL_CONNECT_TIMEOUT={conn!r} is outside HCCL's range [120, 7200] seconds",
                          "set HCCL_CONNECT_TIMEOUT to an integer from 120 to 7200 (e.g. 1200 for large jobs)", data)
    if exe is not None:
        try:
            v = float(exe)
        except ValueError:
            v = None
        chip = str(((ctx.manifest or {}).get("base") or {}).get("chip") or "").lower()
        limit = 17340 if chip in ("910", "910a", "910pro", "310p") else 2147483647
        if v is None or v < 0 or v > limit or (limit == 17340 and v == 0):
            rng = "(0, 17340]" if limit == 17340 else "[0, 2147483647] (0 = never)"
            return Result(FAIL, f"HCCL_EXEC_TIMEOUT={exe!r} is outside HCCL's range {rng} seconds",
                          "set HCCL_EXEC_TIMEOUT to a number of seconds in range (default 1836)", data)
        if (ctx.env.get("HCCL_OP_EXPANSION_MODE") or "").upper() == "AIV" and (v == 0 or v > 1091):
            return Result(WARN, f"HCCL_EXEC_TIMEOUT={exe} with HCCL_OP_EXPANSION_MODE=AIV: AIV mode caps the "
                                "timeout at 1091 s, so this value acts as 1091",
                          "set HCCL_EXEC_TIMEOUT<=1091, or use another expansion mode if collectives need longer",
                          data)
    parts = [f"{k}={v}" for k, v in data.items() if v is not None]
    return Result(PASS, ", ".join(parts) + " within range", data=data)


_EXPANSION_MODES = ("AI_CPU", "AIV", "HOST", "HOST_TS", "AICPU_CACHEDISABLE")


@check("hccl.options")
def check_hccl_options(ctx: Context) -> Result:
    """HCCL_BUFFSIZE is a positive MB count; HCCL_OP_EXPANSION_MODE is a known mode; HCCL_IF_IP is an IP."""
    names = ("HCCL_BUFFSIZE", "HCCL_OP_EXPANSION_MODE", "HCCL_IF_IP", "HCCL_SOCKET_IFNAME")
    data = {n: ctx.env.get(n) for n in names}
    if all(v is None for v in data.values()):
        return Result(SKIP, "no HCCL options set (HCCL_BUFFSIZE defaults to 200 MB)")
    buf = data["HCCL_BUFFSIZE"]
    if buf is not None and (_int(buf) is None or _int(buf) < 1):
        return Result(FAIL, f"HCCL_BUFFSIZE={buf!r} is not a positive number of MB",
                      "set HCCL_BUFFSIZE to an integer MB count (default 200)", data)
    mode = data["HCCL_OP_EXPANSION_MODE"]
    if mode is not None and mode.upper() not in _EXPANSION_MODES:
        return Result(WARN, f"HCCL_OP_EXPANSION_MODE={mode!r} is not a mode HCCL documents (AI_CPU, AIV, HOST, "
                            "HOST_TS)", "use AI_CPU or AIV, or unset it for the default", data)
    ip = data["HCCL_IF_IP"]
    if ip is not None:
        import ipaddress

        try:
            ipaddress.ip_address(ip.strip())
        except ValueError:
            return Result(FAIL, f"HCCL_IF_IP={ip!r} is not an IP address",
                          "set HCCL_IF_IP to this host's address on the training network, or use "
                          "HCCL_SOCKET_IFNAME=<nic> instead", data)
    if ip and data["HCCL_SOCKET_IFNAME"]:
        return Result(WARN, "both HCCL_IF_IP and HCCL_SOCKET_IFNAME are set; HCCL_IF_IP wins",
                      "keep one of them", data)
    return Result(PASS, ", ".join(f"{k}={v}" for k, v in data.items() if v is not None), data=data)


def _parse_ports(value: str) -> tuple[list[tuple[int, int]] | None, str | None]:
    spans = []
    for part in value.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        a, b = _int(lo) if lo else None, (_int(hi) if sep else _int(lo) if lo else None)
        if a is None or b is None:
            return None, f"{part!r} is not a port or a range lo-hi"
        if not (1 <= a <= 65535 and 1 <= b <= 65535) or a > b:
            return None, f"{part!r} is outside 1-65535 or reversed"
        spans.append((a, b))
    return spans, None


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


@check("hccl.ports")
def check_hccl_ports(ctx: Context) -> Result:
    """HCCL host/NPU socket port ranges are well formed, disjoint, above 1023 and out of the ephemeral range."""
    names = ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE", "HCCL_IF_BASE_PORT", "MASTER_PORT")
    data = {n: ctx.env.get(n) for n in names}
    if all(data[n] is None for n in names[:3]):
        return Result(SKIP, "no HCCL port settings (HCCL picks from HCCL_IF_BASE_PORT, default 60000)")
    ranges = {}
    for name in names[:2]:
        value = data[name]
        if value is None or value.strip().lower() == "auto":
            continue
        spans, err = _parse_ports(value)
        if spans is None:
            return Result(FAIL, f"{name}={value!r}: {err}",
                          f"write {name} as ports and ranges such as 60000-60050,60100, or 'auto'", data)
        for i, s in enumerate(spans):
            for t in spans[i + 1:]:
                if _overlaps(s, t):
                    return Result(FAIL, f"{name}={value!r}: {s[0]}-{s[1]} and {t[0]}-{t[1]} overlap",
                                  f"make the parts of {name} disjoint", data)
        ranges[name] = spans
    base = data["HCCL_IF_BASE_PORT"]
    if base is not None:
        b = _int(base)
        if b is None or not 1024 <= b <= 65535 - 16:
            return Result(FAIL, f"HCCL_IF_BASE_PORT={base!r} is not a port in 1024-65519",
                          "set HCCL_IF_BASE_PORT to an unused port (default 60000)", data)
    warn = []
    for name, spans in ranges.items():
        if any(lo < 1024 for lo, _ in spans):
            warn.append(f"{name} reaches below 1024 (system ports)")
    mp = _int(data["MASTER_PORT"]) if data["MASTER_PORT"] else None
    if mp:
        for name, spans in ranges.items():
            if any(lo <= mp <= hi for lo, hi in spans):
                warn.append(f"MASTER_PORT={mp} lies inside {name}")
    eph = _read_first_line(ctx.path("/proc/sys/net/ipv4/ip_local_port_range"))
    reserved = _read_first_line(ctx.path("/proc/sys/net/ipv4/ip_local_reserved_ports")) or ""
    if eph:
        try:
            lo, hi = (int(x) for x in eph.split())
            res_spans = _parse_ports(reserved)[0] if reserved.strip() else []
            for name, spans in ranges.items():
                for s in spans:
                    covered = any(r[0] <= s[0] and s[1] <= r[1] for r in res_spans or [])
                    if _overlaps(s, (lo, hi)) and not covered:
                        warn.append(f"{name} {s[0]}-{s[1]} overlaps the ephemeral range {lo}-{hi}, where the "
                                    "kernel hands out ports to outgoing connections")
                        break
        except ValueError:
            pass
    if warn:
        return Result(WARN, "; ".join(warn), "move the ranges above the ephemeral range (e.g. 61000+) or reserve "
                      "them (sysctl net.ipv4.ip_local_reserved_ports), and keep MASTER_PORT outside them", data)
    return Result(PASS, ", ".join(f"{k}={v}" for k, v in data.items() if v is not None), data=data)


def _read_first_line(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().strip()
    except OSError:
        return None


_ALLOC_KEYS = ("max_split_size_mb", "garbage_collection_threshold", "expandable_segments",
               "base_addr_aligned_kb", "page_size", "segment_size_mb")


@check("npu.alloc_conf")
def check_alloc_conf(ctx: Context) -> Result:
    """PYTORCH_NPU_ALLOC_CONF parses, its values are in range and its options do not contradict each other."""
    value = ctx.env.get("PYTORCH_NPU_ALLOC_CONF")
    data = {"PYTORCH_NPU_ALLOC_CONF": value}
    if value is None:
        return Result(SKIP, "PYTORCH_NPU_ALLOC_CONF unset")
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

    if "max_split_size_mb" in opts and (_int(opts["max_split_size_mb"]) or 0) <= 20:
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
        b = _int(opts["base_addr_aligned_kb"])
        if b is None or not 0 <= b <= 16:
            return bad(f"base_addr_aligned_kb:{opts['base_addr_aligned_kb']} must be an integer 0-16",
                       "use base_addr_aligned_kb:16 (the default) or drop it")
    if "page_size" in opts and opts["page_size"].lower() not in ("1g", "1gb"):
        return bad(f"page_size:{opts['page_size']} is not supported (only 1g)", "use page_size:1g or drop it")
    if "segment_size_mb" in opts and (_int(opts["segment_size_mb"]) or 0) <= 0:
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


# ---------------------------------------------------------------------------------------------------
# checks: system limits


def _gib_env(ctx: Context, name: str, default: float) -> float:
    try:
        return float(ctx.env.get(name) or default)
    except ValueError:
        return default


@check("system.shm")
def check_shm(ctx: Context) -> Result:
    """/dev/shm is large enough for DataLoader workers and NCCL/HCCL shared memory (>= 4 GiB; < 512 MiB fails)."""
    path = ctx.path("/dev/shm")
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return Result(FAIL, f"/dev/shm is not usable: {exc.strerror}",
                      "mount a tmpfs at /dev/shm (docker: --shm-size=16g or --ipc=host)")
    size = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    data = {"size_bytes": size, "free_bytes": free}
    fix = ("run with --shm-size=16g (or --ipc=host); on Kubernetes mount an emptyDir with medium: Memory "
           "at /dev/shm")
    fail_below = _gib_env(ctx, "TRAINBOX_MIN_SHM_GB", 0.5) * GiB
    warn_below = max(fail_below, 4 * GiB)
    if size < fail_below:
        return Result(FAIL, f"/dev/shm is {_size(size)}: DataLoader workers and NCCL's shared-memory transport "
                            "run out ('Bus error', 'No space left on device')", fix, data)
    if size < warn_below:
        return Result(WARN, f"/dev/shm is {_size(size)}, below {_size(warn_below)}: several DataLoader workers "
                            "with large batches can run out", fix, data)
    return Result(PASS, f"/dev/shm is {_size(size)} ({_size(free)} free)", data=data)


@check("system.memlock")
def check_memlock(ctx: Context) -> Result:
    """The memlock ulimit is unlimited, as RDMA (HCCL over RoCE, NCCL over InfiniBand) needs."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    data = {"soft": None if soft == inf else soft, "hard": None if hard == inf else hard}
    if soft == inf:
        return Result(PASS, "memlock unlimited", data=data)
    msg = f"memlock ulimit is {_size(soft) if soft >= MiB else f'{soft // 1024} KiB'}"
    if ctx.device == "cpu":
        return Result(PASS, msg + " (only RDMA needs more; no accelerator here)", data=data)
    return Result(WARN, msg + ": RDMA collectives (HCCL over RoCE, NCCL over InfiniBand) pin memory and fail "
                              "to register buffers", "run with --ulimit memlock=-1:-1 (Kubernetes: set it in the "
                              "container runtime's default ulimits)", data)


@check("system.disk")
def check_disk(ctx: Context) -> Result:
    """Free space where checkpoints go (TRAINBOX_CHECKPOINT_DIR, else the working directory)."""
    target = ctx.env.get("TRAINBOX_CHECKPOINT_DIR") or os.getcwd()
    probe = ctx.path(target)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        return Result(FAIL, f"cannot inspect {target}: {exc.strerror}", "mount the checkpoint volume")
    free = st.f_bavail * st.f_frsize
    data = {"path": target, "free_bytes": free}
    min_free = _gib_env(ctx, "TRAINBOX_MIN_FREE_GB", 20) * GiB
    fix = ("mount a larger volume for checkpoints and point TRAINBOX_CHECKPOINT_DIR (and the job's save dir) at it; "
           "TRAINBOX_MIN_FREE_GB sets this threshold")
    if os.path.isdir(ctx.path(target)) and not os.access(ctx.path(target), os.W_OK):
        return Result(FAIL, f"checkpoint dir {target} is not writable by uid {os.getuid()}",
                      "mount it read-write, or chown it to the container user", data)
    if free < 1 * GiB:
        return Result(FAIL, f"only {_size(free)} free at {target}: a checkpoint save will fail", fix, data)
    if free < min_free:
        return Result(WARN, f"{_size(free)} free at {target}, below {_size(min_free)}: LLM checkpoints "
                            "(weights plus optimizer state) may not fit", fix, data)
    return Result(PASS, f"{_size(free)} free at {target}", data=data)


CHECK_IDS = tuple(c.id for c in CHECKS)
