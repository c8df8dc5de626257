"""The doctor's machinery: results, context, the check registry, the report; shared helpers."""

from __future__ import annotations

import glob
import importlib
import json
import os
import platform as _platform
import re
import sys

from ... import __version__
from . import AREAS
from .. import emulation as _emulation
from ..apply_patches import canon_name
from ..manifest import ManifestError, load_manifest, manifest_path
from ..nvidia import CTL_NODE
from ..npu import NPU_CARD_NODE, NPU_DEVICE_NODES, TOOLKIT_HOMES, TOOLKIT_INSTALL_INFO, VERSIONED_HOMES

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
_RANK = {SKIP: 0, PASS: 0, WARN: 1, FAIL: 2}
DEVICES = ("npu", "cuda", "cpu")

CPU_ON_PURPOSE = ("to run without an accelerator on purpose, set TRAINBOX_DEVICE=cpu (the entrypoint then "
                  "sets TORCH_DEVICE_BACKEND_AUTOLOAD=0)")

GiB = 1 << 30
MiB = 1 << 20

# The limit on each child process the doctor starts (`import torch` above all): a hung driver or filesystem must
# end in a FAIL line, not a doctor that never answers. An input, for what is slow by nature: under qemu-user an
# aarch64 `import torch` takes minutes (more on a loaded host), so an emulated doctor allows EMULATED_FACTOR times
# as long, and TRAINBOX_DOCTOR_IMPORT_S sets the limit outright.
IMPORT_S_VAR = "TRAINBOX_DOCTOR_IMPORT_S"
IMPORT_S = 120.0
EMULATED_FACTOR = 10


def child_timeout(env: dict, emulated: dict | None) -> tuple[float, str]:
    """(seconds, where the figure came from); a bad TRAINBOX_DOCTOR_IMPORT_S is a usage error (one line)."""
    raw = (env.get(IMPORT_S_VAR) or "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 < value < float("inf"):
            from ..errors import TrainboxError

            raise TrainboxError(f"{IMPORT_S_VAR}={raw!r}: expected a number of seconds above 0 (the limit on "
                                f"`import torch` and the doctor's other child processes); unset it for the "
                                f"default {IMPORT_S:.0f} s")
        return value, IMPORT_S_VAR
    if emulated:
        return IMPORT_S * EMULATED_FACTOR, f"{IMPORT_S:.0f} s x {EMULATED_FACTOR}, emulated"
    return IMPORT_S, "default"


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
                 timeout: float | None = None, emulated: dict | None | bool = False):
        self.env = dict(os.environ if env is None else env)
        self.root = root or self.env.get("TRAINBOX_DOCTOR_ROOT") or "/"
        self.manifest = manifest
        self.manifest_file = manifest_file
        self.manifest_error = manifest_error
        self.python = python or sys.executable
        self.sys_path = sys_path  # where package metadata is looked up; None: this interpreter's sys.path
        self.quick = quick
        # None: look (a test passes a dict, or None for native); False (the default): look at this process
        self.emulated = _emulation.detect(root=self.root) if emulated is False else emulated
        if timeout is not None:
            self.timeout, self.timeout_source = float(timeout), "given"
        elif quick:  # starts no child process: nothing to limit, nothing to complain about
            self.timeout, self.timeout_source = IMPORT_S, "default"
        else:
            self.timeout, self.timeout_source = child_timeout(self.env, self.emulated)
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
        key = canon_name(name)
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
        if self.exists(NPU_DEVICE_NODES[0]) or glob.glob(self.path(NPU_CARD_NODE + "[0-9]*")):
            return "npu", "detected"
        if self.exists(CTL_NODE):
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
        # the report's order whichever area was imported first (a host module imports npu and hccl alone); stable
        CHECKS.sort(key=lambda c: _rank(c.func.__module__.rpartition(".")[2]))
        return func

    return deco


def _rank(area: str) -> int:
    return AREAS.index(area) if area in AREAS else len(AREAS)


def registered() -> list[Check]:
    """Every area's checks, in the report's order (the areas are imported on first use, not with the package:
    `trainbox doctor`'s arguments are part of every trainbox command's parser)."""
    for area in AREAS:
        importlib.import_module(f"{__package__}.{area}")
    return CHECKS


def run_checks(ctx: Context, only: list | None = None) -> list[Result]:
    results = []
    for chk in registered():
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
            # the platform the image was built for (its manifest) and the machine this runs on (aarch64 under qemu
            # too): an arm64 image says so wherever it runs
            "platform": (ctx.manifest or {}).get("platform"),
            "machine": _platform.machine(),
            # under user-mode emulation: {"machine", "kernel", "how"} (see trainbox.runtime.emulation), else null
            "emulated": ctx.emulated,
            "child_timeout_s": ctx.timeout,
        },
        "summary": summarize(results, strict),
        "checks": [r.to_dict() for r in results],
    }


def format_text(ctx: Context, results: list[Result], strict: bool = False) -> str:
    stack = (ctx.manifest or {}).get("stack")
    head = f"trainbox doctor {__version__}: "
    head += f"stack {stack}" if stack else "no stack manifest"
    head += f", device {ctx.device} ({device_origin(ctx)}), python {sys.version.split()[0]}"
    if ctx.emulated:
        head += f"; {_emulation.describe(ctx.emulated)}, child processes allowed {ctx.timeout:.0f} s"
    lines = [head] + _folded_lines(results, ctx.device)
    s = summarize(results, strict)
    lines.append(f"summary: {s['status']} ({s['pass']} pass, {s['warn']} warn, {s['fail']} fail, "
                 f"{s['skip']} skip)")
    return "\n".join(lines)


def _folded_lines(results: list[Result], device: str) -> list[str]:
    """One line per result, except SKIPs that say the same thing (e.g. "applies to npu only; device is cpu", or
    NPU settings left unset off an NPU): one line naming them all, where the first stood. --json keeps each."""
    def key(r: Result) -> str | None:
        if r.status != SKIP or r.fix:
            return None
        if device != "npu" and r.id.startswith(("npu.", "hccl.")) and "applies to" not in r.message:
            return f"NPU/HCCL settings unset (their defaults); they do not apply to a {device} device"
        return r.message

    groups: dict[str, list[Result]] = {}
    for r in results:
        if key(r) is not None:
            groups.setdefault(key(r), []).append(r)
    lines = []
    for r in results:
        same = groups.get(key(r)) if key(r) is not None else None
        if not same or len(same) == 1:
            lines.append(r.line())
        elif same[0] is r:
            lines.append(f"{SKIP} {', '.join(x.id for x in same)}: {key(r)}")
    return lines


def main(manifest: str | None = None, as_json: bool = False, strict: bool = False, quick: bool = False,
         out=None) -> int:
    """What `trainbox doctor` runs. Returns the exit status."""
    out = out or sys.stdout
    if manifest and not os.path.exists(manifest):
        from ..errors import TrainboxError

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


def major_minor(v: str) -> tuple | None:
    m = re.match(r"^v?(\d+)\.(\d+)", v.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def human_size(n: float) -> str:
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


def skip_unless(ctx: Context, device: str) -> Result | None:
    if ctx.device == device:
        return None
    return Result(SKIP, f"applies to {device} only; device is {ctx.device} ({device_origin(ctx)})")


def device_origin(ctx: Context) -> str:
    return {"TRAINBOX_DEVICE": "set by TRAINBOX_DEVICE", "manifest": "the stack's device",
            "detected": "detected from /dev"}.get(ctx.device_source, ctx.device_source)


def path_entries(value: str | None) -> list[str]:
    return [p for p in (value or "").split(":") if p]


def find_lib(ctx: Context, name: str, extra_dirs=()) -> str | None:
    """Where the dynamic loader would find `name` via LD_LIBRARY_PATH or the usual dirs (no loading)."""
    dirs = path_entries(ctx.env.get("LD_LIBRARY_PATH")) + list(extra_dirs)
    for d in dirs:
        p = os.path.join(ctx.path(d), name)
        if os.path.exists(p):
            return p
    return None


def find_command(ctx: Context, name: str) -> str | None:
    """Like shutil.which over the context's PATH, under the injected root."""
    for d in path_entries(ctx.env.get("PATH")):
        p = os.path.join(ctx.path(d), name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def run_python(ctx: Context, code: str, args=(), env: dict | None = None, timeout: float | None = None):
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


def parse_ids(value: str) -> tuple[list[int] | None, str | None]:
    ids = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit():
            return None, part
        ids.append(int(part))
    return ids, None


def read_kv(path: str) -> dict:
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

def parse_int(value: str) -> int | None:
    try:
        return int(value.strip())
    except ValueError:
        return None

def read_first_line(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().strip()
    except OSError:
        return None


def toolkit_home(ctx: Context) -> str | None:
    """The CANN toolkit home (a path as seen inside the container), or None."""
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        v = ctx.env.get(var)
        if v and os.path.isdir(ctx.path(v)):
            return v
    for home in TOOLKIT_HOMES:
        if os.path.isdir(ctx.path(home)):
            return home
    versioned = sorted(glob.glob(ctx.path(VERSIONED_HOMES)))
    if versioned:  # report it as the container sees it, not under the injected root
        return "/" + os.path.relpath(versioned[-1], ctx.path("/"))
    return None


def toolkit_version(ctx: Context, home: str) -> str | None:
    for info in sorted(glob.glob(os.path.join(ctx.path(home), TOOLKIT_INSTALL_INFO))):
        v = read_kv(info).get("version")
        if v:
            return v
    return None


def no_cann_reason(ctx: Context) -> str:
    base = (ctx.manifest or {}).get("base") or {}
    if base.get("substituted"):
        return (f", because the image was built on the substitute base {base['substituted']} instead of "
                f"{base.get('image')}")
    return ""


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
