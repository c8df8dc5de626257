"""trainbox.runtime.markers: patch markers and the MindSpeed import-order guard.

The MindSpeed / Megatron tests use STAND-IN packages (a `mindspeed.megatron_adaptor` that imports
`megatron.core`, as the real one does, and an `mcore_bridge`) written to a temporary directory and
imported in a child process, so the real import machinery and sys.modules of this process stay clean.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from trainbox.runtime import markers
from trainbox.runtime.errors import TrainboxError

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------- patch markers


def test_mark_and_query():
    def kernel():
        return "npu"

    assert not markers.is_patched(kernel)
    assert markers.mark_patched(kernel) is kernel
    assert markers.is_patched(kernel) and markers.is_patched(kernel, "npu")
    assert not markers.is_patched(kernel, "cuda")
    markers.mark_patched(kernel, "mindspeed")
    assert markers.is_patched(kernel, "npu") and markers.is_patched(kernel, "mindspeed")


def test_decorator_forms():
    @markers.mark_patched
    def a():
        pass

    @markers.mark_patched(tag="fla")
    def b():
        pass

    assert markers.is_patched(a, "npu") and markers.is_patched(b, "fla") and not markers.is_patched(b, "npu")


def test_generic_code_does_not_overwrite_an_npu_replacement():
    # The Twinkle #208 bug: the sequence-parallel path replaced the NPU-patched chunk_gated_delta_rule.
    module = types.ModuleType("fla_ops")
    module.chunk_gated_delta_rule = lambda: "triton"

    def npu_rule():
        return "npu"

    def generic_rule():
        return "generic"

    assert markers.patch_attr(module, "chunk_gated_delta_rule", npu_rule, tag="npu") is True
    assert module.chunk_gated_delta_rule() == "npu"
    assert markers.patch_attr(module, "chunk_gated_delta_rule", generic_rule) is False  # kept
    assert module.chunk_gated_delta_rule() == "npu"
    assert markers.patch_attr(module, "chunk_gated_delta_rule", generic_rule, tag="cuda") is True  # other tag
    assert markers.patch_attr(module, "chunk_gated_delta_rule", npu_rule, force=True) is True
    assert module.chunk_gated_delta_rule() == "npu"


def test_markers_on_methods_classes_instances_and_builtins():
    class Attention:
        def forward(self):
            return 1

    obj = Attention()
    markers.mark_patched(obj.forward)  # a bound method refuses attributes: its function is marked
    assert markers.is_patched(Attention.forward) and markers.is_patched(obj.forward)
    markers.mark_patched(Attention, "npu")
    assert markers.is_patched(Attention)
    partial = functools.partial(print)
    markers.mark_patched(partial)
    assert markers.is_patched(partial)

    joiner = b"-".join  # a C callable: no attributes, but weak references, so the side table holds it
    markers.mark_patched(joiner, "npu")
    assert markers.is_patched(joiner, "npu") and not markers.is_patched(b"+".join)

    with pytest.raises(TrainboxError, match="accepts neither attributes nor weak references"):
        markers.mark_patched(12345)
    assert not markers.is_patched(12345)


def test_foreign_marker_is_honoured():
    def twinkle_patched():
        pass

    twinkle_patched._twinkle_npu_patched = True
    assert markers.is_patched(twinkle_patched, "npu")


# -------------------------------------------------------------------------------- MindSpeed order guard

STANDIN_FILES = {
    # STAND-INS, not the real packages: just enough structure for import order to matter.
    "megatron/__init__.py": "",
    "megatron/core/__init__.py": "import sys\nPATCHED = 'mindspeed.megatron_adaptor' in sys.modules\n",
    "mindspeed/__init__.py": "",
    "mindspeed/megatron_adaptor.py": "import megatron.core\nAPPLIED = True\n",
    "mcore_bridge/__init__.py": "import megatron.core\n",
}


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron-standins")
    for rel, text in STANDIN_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _child(code: str, pythonpath: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(REPO / "python")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=60, cwd=REPO)


def test_adaptor_first_is_fine(standins):
    proc = _child("""
        from trainbox.runtime.markers import import_mindspeed_adaptor
        adaptor = import_mindspeed_adaptor()
        import megatron.core, mcore_bridge
        print(adaptor.APPLIED, megatron.core.PATCHED, import_mindspeed_adaptor() is adaptor)
        """, standins)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "True"]


def test_megatron_first_is_a_clear_error(standins):
    proc = _child("""
        import mcore_bridge
        from trainbox.runtime.markers import import_mindspeed_adaptor
        from trainbox.runtime.errors import TrainboxError
        try:
            import_mindspeed_adaptor()
        except TrainboxError as exc:
            print(exc)
        """, standins)
    assert proc.returncode == 0, proc.stderr
    assert "mcore_bridge, megatron.core were imported before mindspeed.megatron_adaptor" in proc.stdout
    assert "at the very top of the entry script" in proc.stdout


def test_import_guard_stops_the_wrong_order_at_the_import(standins):
    proc = _child("""
        from trainbox.runtime.markers import install_mindspeed_import_guard
        assert install_mindspeed_import_guard() is True
        assert install_mindspeed_import_guard() is False
        try:
            import mcore_bridge
        except ImportError as exc:
            print("blocked:", exc)
        import mindspeed.megatron_adaptor  # its own `import megatron.core` must pass the guard
        import mcore_bridge, megatron.core
        print("then", megatron.core.PATCHED)
        """, standins)
    assert proc.returncode == 0, proc.stderr
    blocked, then = proc.stdout.strip().splitlines()
    assert blocked.startswith("blocked: importing mcore_bridge before mindspeed.megatron_adaptor")
    assert then == "then True"


def test_guard_refuses_when_megatron_is_already_loaded(standins):
    proc = _child("""
        import megatron.core
        from trainbox.runtime.markers import install_mindspeed_import_guard
        install_mindspeed_import_guard()
        """, standins)
    assert proc.returncode != 0
    assert "megatron.core was imported before mindspeed.megatron_adaptor" in proc.stderr


def test_missing_mindspeed(tmp_path):
    proc = _child("""
        from trainbox.runtime.markers import import_mindspeed_adaptor
        from trainbox.runtime.errors import TrainboxError
        print(import_mindspeed_adaptor(required=False))
        try:
            import_mindspeed_adaptor()
        except TrainboxError as exc:
            print(exc)
        """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()
    assert first == "None" and "mindspeed.megatron_adaptor is not installed" in second
