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
        "quick": false,                       # true: child-process checks were left out
        "platform": "linux/arm64" | null,     # what the image was built for (manifest), null when not recorded
        "machine": "aarch64",                 # platform.machine() of the process (under qemu too)
        "emulated": {"machine": "aarch64", "kernel": "x86_64", "how": "/proc/sys/kernel/arch"} | null,
                                              # under qemu-user (trainbox.runtime.emulation), null natively
        "child_timeout_s": 120.0              # limit on each child (`import torch`): TRAINBOX_DOCTOR_IMPORT_S,
                                              # else 120, ten times that when emulated
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

# The package itself imports nothing: `trainbox doctor`'s arguments (cli.py) are read by every trainbox command's
# parser, which must not pay for the checks (~0.1 s). The doctor's names below are looked up on first use (PEP 562),
# every area's checks registered first (core.registered(), in the order of the report).
#: the area modules, in the order of the report; each registers its checks when it is imported (core.registered())
AREAS = ("packages", "npu", "cuda", "ray", "hccl", "system")
_CORE = {"CHECKS", "FAIL", "PASS", "SKIP", "WARN", "Check", "Context", "Result", "check", "format_text", "main",
         "report", "run_checks", "summarize", "versions_match"}


def __getattr__(name: str):
    import importlib

    if name in _CORE or name in ("CHECK_IDS", "explain_import_failure"):
        core = importlib.import_module(f"{__name__}.core")
        checks = core.registered()
        if name == "CHECK_IDS":
            return tuple(c.id for c in checks)
        if name == "explain_import_failure":
            return importlib.import_module(f"{__name__}.packages").explain_import_failure
        return getattr(core, name)
    if name in ("core", "cli") + AREAS:  # `doctor.core` before anything imported it
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
