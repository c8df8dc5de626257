"""One home per toolkit (issue 38): trainbox.image.toolkits.cann / .cuda reach the toolkit's environment record,
bake, rules, base facts, launch half and doctor checks, and each fact they share with the image's own code is
spelled once, in trainbox.runtime.npu / trainbox.runtime.nvidia (runtime cannot import a host module)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from trainbox.image import toolkits
from trainbox.image.toolkits import cann, cuda
from trainbox.paths import REPO_ROOT
from trainbox.runtime import cann_env, npu, nvidia

PKG = REPO_ROOT / "python" / "trainbox"
TEMPLATES = REPO_ROOT / "build" / "templates"
#: the names every toolkit module has (hpccm's building blocks share one interface)
INTERFACE = ("NAME", "DEVICE", "NEEDS", "ENV_RECORD", "ENV_RECORD_FILE", "VISIBLE_DEVICES_VAR", "RULES",
             "DOCTOR_MODULES", "DOCTOR_FAILS_WITHOUT_CARDS", "DOCTOR_FAILS_ON_SUBSTITUTE", "HOST_NEEDS", "base_facts", "declared_version", "image_labels", "doctor_checks",
             "host_mounts", "docker_args", "host_has_cards", "launch_env")


@functools.lru_cache(maxsize=None)
def code_strings(path: Path) -> tuple[str, ...]:
    """The string constants a module's code holds (f-string parts included), docstrings left out: a path
    named in a docstring or comment explains, one in a string is a copy of the fact."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return tuple(n.value for n in ast.walk(tree)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs)


def holders(fact: str, root: Path = PKG) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if any(fact in s for s in code_strings(p)))


#: each moved fact and its one home
FACTS = {
    **{p: "runtime/npu.py" for p in npu.NPU_DRIVER_MOUNTS},           # the driver mounts
    **{p: "runtime/npu.py" for p in npu.NPU_MULTINODE_MOUNTS},        # hccn_tool, hccn.conf
    **{n: "runtime/npu.py" for n in npu.NPU_DEVICE_NODES},            # davinci_manager, devmm_svm, hisi_hdc
    **{s: "runtime/npu.py" for s in npu.TOOLKIT_SET_ENV},             # the toolkit's set_env.sh, per layout
    npu.VERSIONED_HOMES: "runtime/npu.py",
    npu.NNAL_SET_ENV: "runtime/npu.py",
    "ascend_toolkit_install.info": "runtime/npu.py",
    npu.CANN_ENV_FILE: "runtime/npu.py",
    npu.BASE_IMAGE: "runtime/npu.py",
    **{f: "runtime/npu.py" for f in npu.NPU_NOSET},
    nvidia.CUDA_HOME: "runtime/nvidia.py",
    nvidia.CUDA_NOSET: "runtime/nvidia.py",
    nvidia.CTL_NODE: "runtime/nvidia.py",
    "/usr/local/nvidia/lib64": "runtime/nvidia.py",
}


@pytest.mark.parametrize("fact", sorted(FACTS))
def test_each_moved_fact_is_spelled_in_one_module(fact):
    assert holders(fact) == [FACTS[fact]], (
        f"{fact!r} is spelled in {holders(fact)}; take it from {FACTS[fact]} (through trainbox.image.toolkits on "
        "the host side)")


def test_the_fact_check_can_fail(tmp_path):
    """A copy of a fact in a string is found; the same path in a docstring is not."""
    lib64 = next(iter(npu.NPU_DRIVER_MOUNTS))
    (tmp_path / "a.py").write_text(f'"""Mounts {lib64}."""\nX = 1\n')
    (tmp_path / "b.py").write_text(f'def f():\n    """{lib64}"""\n    return ["-v", f"{lib64}:{{1}}"]\n')
    assert holders(lib64, tmp_path) == ["b.py"]


def test_the_dockerfile_template_takes_the_record_step_from_the_toolkit():
    text = "".join(p.read_text() for p in TEMPLATES.rglob("*.j2"))
    assert npu.CANN_ENV_FILE not in text and cann_env.__name__ not in text


def test_every_toolkit_has_the_one_interface_and_each_device_its_toolkit():
    for mod in (cann, cuda):
        missing = [n for n in INTERFACE if not hasattr(mod, n)]
        assert not missing, f"{mod.__name__} lacks {missing}"
    assert toolkits.for_device("npu") is cann and toolkits.for_device("cuda") is cuda
    assert toolkits.for_device("cpu") is None


def test_the_cann_toolkit_reaches_its_record_bake_rules_base_launch_and_doctor():
    from trainbox.runtime.doctor.core import registered
    from trainbox.specs.rules import RULES

    CHECKS = registered()

    assert cann.ENV_RECORD is cann_env and cann.ENV_RECORD_FILE == npu.CANN_ENV_FILE and callable(cann.bake)
    assert set(cann.RULES) <= {r.id for r in RULES}
    assert cann.base_facts("quay.io/ascend/cann:8.5.1-910b-ubuntu22.04-py3.11") == {
        "cann": "8.5.1", "chip": "910b", "os": "ubuntu22.04", "python": "3.11"}
    assert cann.base_facts("nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04") is None
    assert {"cann.toolkit", "cann.env_baked", "npu.devices", "npu.driver", "hccl.ports"} <= set(cann.doctor_checks())
    assert set(cann.doctor_checks()) <= {c.id for c in CHECKS}
    for mod in (cann, cuda):  # what smoke expects to fail names real checks of the doctor
        assert set(mod.DOCTOR_FAILS_WITHOUT_CARDS + mod.DOCTOR_FAILS_ON_SUBSTITUTE) <= {c.id for c in CHECKS}
    args = cann.docker_args([4, 5], 2, lambda s, t, ro: f"{s}>{t}")
    assert args[:4] == ["--device", "/dev/davinci4", "--device", "/dev/davinci5"]
    assert all(f"{p}:{p}:ro" in args for p in npu.NPU_DRIVER_MOUNTS)
    assert all(f"{p}>{p}" in args for p in npu.NPU_MULTINODE_MOUNTS)
    assert cann.host_mounts(1) == list(npu.NPU_DRIVER_MOUNTS)
    assert cann.launch_env() == {f: "1" for f in npu.NPU_NOSET}
    assert cann.image_labels("8.5.1", substituted=True) == {"io.trainbox.cann.declared": "8.5.1"}


def test_the_cuda_toolkit_beside_it():
    from trainbox.image.sbom import _toolkit_components

    assert cuda.ENV_RECORD is None and cuda.host_mounts(2) == [] and cuda.launch_env() == {}
    assert cuda.docker_args([0, 3], 1, None) == ["--gpus", '"device=0,3"']
    manifest = {"device": "cuda", "base": {"image": "mirror.example/nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04"}}
    assert cuda.declared_version(manifest) == "12.8.1"
    assert cuda.declared_version({**manifest, "device": "cpu"}) is None
    assert set(cuda.doctor_checks()) == {"cuda.driver", "cuda.visible_devices"}
    # the SBOM names a declared toolkit through the toolkit modules
    names = [c.name for c in _toolkit_components({}, manifest)]
    assert names == ["cuda-toolkit"]
