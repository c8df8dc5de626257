"""Issue 14, item 6: `python3 -m trainbox.doctor --json` exited 0 and printed nothing, so a health probe written
that way always passed. Every runtime module a user may run with -m either works or exits non-zero with a
message; none exits 0 silently."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainbox.paths import REPO_ROOT

RUNTIME = REPO_ROOT / "python" / "trainbox" / "runtime"


def runtime_modules() -> list[str]:
    mods = {"trainbox.runtime", "trainbox.doctor"}  # the package itself and the pre-split name from the issue
    for path in RUNTIME.rglob("*.py"):
        rel = path.relative_to(RUNTIME.parent.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] in ("__init__", "__main__"):
            parts = parts[:-1]
        mods.add(".".join(parts))
    return sorted(mods)


@pytest.mark.parametrize("module", runtime_modules())
def test_python_m_works_or_fails_loudly(module, tmp_path):
    args = ["true"] if module.endswith(".entrypoint") else ["--json"]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python"), TRAINBOX_MANIFEST=str(tmp_path / "none.json"))
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL)
    if proc.returncode == 0:
        assert proc.stdout.strip() or module.endswith(".entrypoint"), f"{module}: exit 0 with no output"
    else:
        assert proc.stderr.strip(), f"{module}: exit {proc.returncode} without a message"
        assert "Traceback" not in proc.stderr, proc.stderr


def test_library_module_says_what_to_run_instead():
    proc = subprocess.run([sys.executable, "-m", "trainbox.runtime.dist", "--json"], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT / "python")), timeout=60)
    assert proc.returncode == 2 and "trainbox.runtime.doctor" in proc.stderr
