"""The doctor under emulation and on a slow machine: it tells when it runs under qemu-user (the kernel's architecture
differs from the process's), and its limit on child processes (`import torch`) is an input: TRAINBOX_DOCTOR_IMPORT_S,
EMULATED_FACTOR times the native default when emulated. The emulated doctor for real: tests/test_arm64_docker.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.runtime import emulation
from trainbox.runtime.doctor import FAIL, Context, format_text, report, run_checks
from trainbox.runtime.doctor.core import EMULATED_FACTOR, IMPORT_S, IMPORT_S_VAR
from trainbox.runtime.errors import TrainboxError

REPO = Path(__file__).resolve().parents[1]
X86_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme sse2\n"
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n"


def proc_tree(root: Path, arch: str | None = None, cpuinfo: str | None = None) -> Path:
    """Stand-in /proc files under an injected root (what qemu-user leaves the guest to read)."""
    if arch is not None:
        (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
        (root / "proc/sys/kernel/arch").write_text(arch + "\n")
    if cpuinfo is not None:
        (root / "proc").mkdir(parents=True, exist_ok=True)
        (root / "proc/cpuinfo").write_text(cpuinfo)
    return root


@pytest.mark.parametrize("arch, cpuinfo, machine, kernel", [
    ("x86_64", None, "aarch64", "x86_64"),          # an arm64 image on an x86_64 host, Linux >= 6.1
    ("aarch64", None, "x86_64", "aarch64"),         # the other way round
    (None, X86_CPUINFO, "aarch64", "x86"),          # older kernels: qemu 7.2 passes the host's cpuinfo through
    (None, ARM_CPUINFO, "x86_64", "arm"),
])
def test_emulation_is_told_by_the_kernel_architecture(tmp_path, arch, cpuinfo, machine, kernel):
    info = emulation.detect(machine, root=str(proc_tree(tmp_path, arch, cpuinfo)))
    assert info == {"machine": machine, "kernel": kernel,
                    "how": "/proc/sys/kernel/arch" if arch else "/proc/cpuinfo"}
    assert emulation.describe(info).startswith(f"emulated: {machine} on a {kernel} kernel")


@pytest.mark.parametrize("arch, cpuinfo, machine", [
    ("x86_64", X86_CPUINFO, "x86_64"),   # native
    ("aarch64", ARM_CPUINFO, "aarch64"),
    ("x86_64", None, "i686"),            # a 32-bit userland on its own 64-bit kernel is not emulation
    ("aarch64", None, "armv7l"),
    (None, None, "aarch64"),             # nothing tells: not claimed
    (None, "processor\t: 0\n", "aarch64"),
])
def test_native_and_unknown_are_not_called_emulated(tmp_path, arch, cpuinfo, machine):
    assert emulation.detect(machine, root=str(proc_tree(tmp_path, arch, cpuinfo))) is None


def test_this_host_is_native():
    assert emulation.detect() is None  # the tests run natively (x86_64 or arm64 hosts alike)


def test_child_limit_default_emulated_and_given(tmp_path):
    ctx = Context(env={}, root=str(tmp_path), emulated=None)
    assert (ctx.timeout, ctx.timeout_source) == (IMPORT_S, "default")
    info = {"machine": "aarch64", "kernel": "x86_64", "how": "/proc/sys/kernel/arch"}
    ctx = Context(env={}, root=str(tmp_path), emulated=info)
    assert ctx.timeout == IMPORT_S * EMULATED_FACTOR and "emulated" in ctx.timeout_source
    # the input wins, emulated or not
    ctx = Context(env={IMPORT_S_VAR: "1800"}, root=str(tmp_path), emulated=info)
    assert (ctx.timeout, ctx.timeout_source) == (1800.0, IMPORT_S_VAR)
    # the Context looks at the root it is given: a stand-in /proc of an emulated process
    ctx = Context(env={}, root=str(proc_tree(tmp_path / "r", arch="x86_64" if emulation.family(
        __import__("platform").machine()) == "arm" else "aarch64")))
    assert ctx.emulated and ctx.timeout == IMPORT_S * EMULATED_FACTOR
    rep = report(ctx, [])
    assert rep["context"]["emulated"] == ctx.emulated and rep["context"]["child_timeout_s"] == ctx.timeout
    head = format_text(ctx, []).splitlines()[0]
    assert "emulated: " in head and f"child processes allowed {ctx.timeout:.0f} s" in head


@pytest.mark.parametrize("bad", ["abc", "0", "-5", "inf", "nan"])
def test_a_bad_limit_is_one_line_and_exit_2(tmp_path, bad):
    with pytest.raises(TrainboxError, match=f"{IMPORT_S_VAR}=.*expected a number of seconds above 0"):
        Context(env={IMPORT_S_VAR: bad}, root=str(tmp_path))
    Context(env={IMPORT_S_VAR: bad}, root=str(tmp_path), quick=True)  # --quick starts no child: not its concern
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "doctor"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "python"), IMPORT_S_VAR: bad},
                          timeout=300)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert IMPORT_S_VAR in line and "unset it for the default 120 s" in line


def test_an_import_that_hangs_fails_at_the_limit(tmp_path):
    """A stand-in torch whose import never ends (sleeps far past the limit): the FAIL names the limit, where it
    came from and the input that raises it."""
    pkg = tmp_path / "fake" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import time\ntime.sleep(3600)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pkg.parent), IMPORT_S_VAR: "2"}
    [res] = run_checks(Context(env=env, root=str(tmp_path / "root"), emulated=None), only=["torch.import"])
    assert res.status == FAIL and res.message.startswith("`import torch` did not finish within 2 s "
                                                         f"({IMPORT_S_VAR})"), res.message
    assert IMPORT_S_VAR in res.fix and res.data["timeout_s"] == 2.0


def test_json_reports_the_limit_and_no_emulation_here():
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "doctor", "--json", "--quick"], capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "python")})
    ctx = json.loads(proc.stdout)["context"]
    assert ctx["emulated"] is None and ctx["child_timeout_s"] == IMPORT_S
