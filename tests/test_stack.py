"""Stack loading, validation messages, overrides, and the compatibility rules (each fed a violating stack)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from trainbox.cli import main
from trainbox.runtime.errors import TrainboxError
from trainbox.specs.rules import RULES, check
from trainbox.specs.stack import list_stacks, load_stack

SHA = "a" * 64


def write(dir_: Path, name: str, text: str) -> Path:
    p = dir_ / f"{name}.yaml"
    p.write_text(textwrap.dedent(text))
    return p


NPU = """\
name: {name}
device: npu
python: "3.11"
platforms: [linux/amd64]
base:
  image: quay.io/ascend/cann:8.5.1-910b-ubuntu22.04-py3.11
  cann: 8.5.1
indexes:
  pypi: https://pypi.org/simple
  pytorch-cpu: https://download.pytorch.org/whl/cpu
components:
  torch: {{source: pypi, version: 2.9.0+cpu, index: pytorch-cpu, sha256: [{sha}]}}
  torch-npu: {{source: pypi, version: 2.9.0, sha256: [{sha}]}}
  triton-ascend: {{source: pypi, version: 3.2.0, sha256: [{sha}]}}
  megatron-core: {{source: pypi, version: 0.15.3, sha256: [{sha}]}}
  mindspeed: {{source: git, git: https://gitcode.com/Ascend/MindSpeed.git, ref: core_r0.15.3, commit: {commit}}}
env:
  USE_MCORE_GDN: "0"
"""


# MindSpeed branch heads (build/compat/mindspeed.yaml; checked in ../shared/upstream/MindSpeed.git)
MS_0153 = "d0d5809d4323eb908f89e87958de254465eb57b4"  # core_r0.15.3
MS_0160 = "e4772499f7eb9fa9a68919dd1eaddef00e915b2d"  # core_r0.16.0


def npu_stack(tmp_path: Path, name: str = "npu-test", edit=None):
    data = yaml.safe_load(NPU.format(name=name, sha=SHA, commit=MS_0153))
    if edit:
        edit(data)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_stack(p)


def ids(findings, level=None):
    return {f.rule for f in findings if level is None or f.level == level}


def test_shipped_stacks_load_and_pass_rules():
    assert {"cpu", "npu-910b", "npu-a3", "cuda"} <= set(list_stacks())
    for name in list_stacks():
        stack = load_stack(name)
        assert not [f for f in check(stack) if f.level == "error"], name


def test_shipped_stacks_validate_strict():
    # every pin hashed (locks committed), every git source by commit
    assert main(["stack", "validate", "--strict"]) == 0


def test_clean_npu_stack_has_no_findings(tmp_path):
    # `info` findings say where things come from (arm64-artifacts); they are no problem
    assert [f for f in check(npu_stack(tmp_path)) if f.level != "info"] == []


def test_extends_writes_pins_once():
    a3, b = load_stack("npu-a3"), load_stack("npu-910b")
    assert a3.base.image.endswith("-a3-ubuntu22.04-py3.11")
    assert a3.base.chip == "a3"
    assert {k: c.pinned_ref for k, c in a3.components.items()} == {k: c.pinned_ref for k, c in b.components.items()}
    assert a3.env == b.env


def test_unknown_key_is_rejected_with_path(tmp_path):
    p = write(tmp_path, "typo", """\
        name: typo
        device: cpu
        python: "3.11"
        base: {image: debian:bookworm-slim}
        components:
          torch: {source: pypi, verison: 2.9.0}
        """)
    with pytest.raises(TrainboxError) as ei:
        load_stack(p)
    msg = str(ei.value)
    assert str(p) in msg and "components.torch.verison" in msg and "unknown key" in msg


@pytest.mark.parametrize("where,key", [
    ("top", "lock"), ("top", "dropped_indexes"), ("top", "overrides"), ("top", "declared_base"),
    ("top", "source_file"), ("component", "locked"), ("component", "key")])
def test_build_state_keys_in_a_stack_file_are_refused(tmp_path, capsys, where, key):
    """The file schema is what a user writes: trainbox's own build state (the lock, dropped indexes, a pin's
    locked hashes, ...) set in a stack file is refused, naming the file, the key and what to do instead."""
    def edit(d):
        if where == "top":
            d[key] = {"pytorch-cpu": "https://example.invalid/simple"} if key != "source_file" else "x.yaml"
        else:
            d["components"]["torch"][key] = {"linux/amd64": [SHA]} if key == "locked" else "torch"
    data = yaml.safe_load(NPU.format(name="inner", sha=SHA, commit=MS_0153))
    edit(data)
    p = tmp_path / "inner.yaml"
    p.write_text(yaml.safe_dump(data))
    path = key if where == "top" else f"components.torch.{key}"
    with pytest.raises(TrainboxError, match=rf"^{p}: {path}: trainbox's own build state, not a stack file key: "
                                            r"remove it \(.+\)$") as ei:
        load_stack(p)
    assert ei.value.exit_code == 2
    # invalid input: the same status (2) from validate as from the commands that use the stack (issue 37)
    for argv, rc in ((["stack", "validate", str(p)], 2), (["stack", "show", str(p)], 2),
                     (["image", "build", str(p), "--dry-run"], 2)):
        assert main(argv) == rc
        err = capsys.readouterr().err
        assert f"{p}: {path}: trainbox's own build state" in err, err


def test_a_loaded_stack_is_frozen_and_resolving_more_makes_a_copy():
    """What loading resolved is read-only; the steps that resolve more return a new stack."""
    from pydantic import ValidationError

    stack = load_stack("cpu")
    with pytest.raises(ValidationError, match="frozen"):
        stack.platforms = ["linux/arm64"]
    with pytest.raises(ValidationError, match="frozen"):
        stack.components["torch"].version = "0.0.1"
    with pytest.raises(ValidationError, match="frozen"):
        stack.lock = None
    before = stack.model_dump()
    other = stack.without_indexes(["pytorch-cpu"]).with_lock(None).narrowed("linux/arm64")
    assert other.dropped_indexes == {"pytorch-cpu": stack.indexes["pytorch-cpu"]} and other.lock is None
    assert not other.components["torch"].locked and other.platforms == ["linux/arm64"]
    assert stack.model_dump() == before and stack.dropped_indexes == {} and stack.lock
    assert stack.components["torch"].locked and stack.resolution.lock_origin == str(stack.lock_path)


def test_malformed_yaml_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: bad\ncomponents: [\n  oops: {\n")
    with pytest.raises(TrainboxError) as ei:
        load_stack(p)
    assert f"{p}:" in str(ei.value) and "malformed YAML" in str(ei.value)


def test_range_pin_rejected(tmp_path):
    p = write(tmp_path, "rng", """\
        name: rng
        device: cpu
        python: "3.11"
        base: {image: debian:bookworm-slim}
        components:
          torch: {source: pypi, version: ">=2.9"}
        """)
    with pytest.raises(TrainboxError, match=r"components\.torch: .*exact version"):
        load_stack(p)


def test_env_values_must_be_strings(tmp_path):
    p = write(tmp_path, "envs", """\
        name: envs
        device: cpu
        python: "3.11"
        base: {image: debian:bookworm-slim}
        env: {USE_MCORE_GDN: 0}
        """)
    with pytest.raises(TrainboxError, match="USE_MCORE_GDN.*quoted string"):
        load_stack(p)


def test_name_must_match_file(tmp_path):
    p = write(tmp_path, "x", """\
        name: y
        device: cpu
        python: "3.11"
        base: {image: debian:bookworm-slim}
        """)
    with pytest.raises(TrainboxError, match="name: expected 'x'"):
        load_stack(p)


def test_unknown_stack_lists_known():
    with pytest.raises(TrainboxError, match=r"unknown stack 'nope'.*known stacks: .*cpu"):
        load_stack("nope")


def test_set_override_unknown_component():
    with pytest.raises(TrainboxError, match="no component 'nosuch'"):
        load_stack("cpu", sets={"nosuch.version": "1"})


def test_set_override_moves_pin_and_drops_stale_hashes():
    s = load_stack("npu-910b", sets={"torch.version": "2.13.0+cpu"})
    assert s.components["torch"].version == "2.13.0+cpu"
    assert s.components["torch"].pin_for("linux/amd64").sha256 == []  # the old hashes were for 2.9.0
    assert s.overrides == {"torch.version": "2.13.0+cpu"}


def test_git_without_commit_is_refused_at_validation(tmp_path):
    """A branch or tag alone moves: refused with the file and key, never listed as installed."""
    def edit(d):
        del d["components"]["mindspeed"]["commit"]
    with pytest.raises(TrainboxError, match=r"npu-test.yaml: components.mindspeed: a git component needs `commit:` "
                                            r"\(the full 40-hex sha that 'core_r0.15.3' names\)"):
        npu_stack(tmp_path, edit=edit)


def test_strict_flags_missing_hash(tmp_path):
    def edit(d):
        d["components"]["triton-ascend"]["sha256"] = []
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "pinned-sources"]
    assert f and "triton-ascend" in f[0].message and "stack lock" in f[0].message


# --- one violating stack per compatibility rule -----------------------------------------------------------

def test_rule_torch_npu_match(tmp_path):
    def edit(d):
        d["components"]["torch-npu"]["version"] = "2.8.0.post2"
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "torch-npu-cann"]
    assert f and f[0].level == "error"
    assert "torch_npu 2.8.0.post2 is built for torch 2.8.0" in f[0].message


def test_rule_torch_npu_pairs_with_the_base_cann(tmp_path):
    """torch_npu 2.9.0.post2 (TorchNPU 26.0) is recommended with CANN 9.0; Ascend's 26.2.0 release notes document
    26.0.x as compatible with CANN 8.5.x-9.2.x: on the 8.5.1 base a warning that names the recommended pair."""
    def edit(d):
        d["components"]["torch-npu"]["version"] = "2.9.0.post2"
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "torch-npu-cann"]
    assert [x.level for x in f] == ["warning"], f
    assert "base.cann: 8.5.1, and torch_npu 2.9.0.post2 (TorchNPU 26.0.x" in f[0].message
    assert "recommended with CANN 9.0.x" in f[0].message and "TorchNPU 26.2.0 release notes" in f[0].message
    assert "pin torch-npu 2.9.0" in f[0].message and f[0].platforms == ("linux/amd64",)


def test_rule_torch_npu_outside_the_documented_range_is_an_error(tmp_path):
    """torch_npu 2.7.1 (TorchNPU 7.2, CANN 8.3) on a CANN 9.2 base: no release notes document that pair."""
    def edit(d):
        d["components"]["torch"]["version"] = "2.7.1+cpu"
        d["components"]["torch-npu"]["version"] = "2.7.1"
        d["base"].update(image="quay.io/ascend/cann:9.2.0-910b-ubuntu22.04-py3.11", cann="9.2.0")
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "torch-npu-cann"]
    assert [x.level for x in f] == ["error"], f
    assert "documents no compatibility of TorchNPU 7.2.x with CANN 9.2.x" in f[0].message
    assert "pin torch-npu 2.7.1.post11" in f[0].message

    def recommended(d):  # Ascend's table: torch_npu 2.7.1.post2 pairs with CANN 8.5.x
        d["components"]["torch"]["version"] = "2.7.1+cpu"
        d["components"]["torch-npu"]["version"] = "2.7.1.post2"
    (tmp_path / "r").mkdir()
    assert not [x for x in check(npu_stack(tmp_path / "r", edit=recommended)) if x.rule == "torch-npu-cann"]


def test_rule_torch_npu_checks_python_and_unknown_releases(tmp_path):
    def py(d):
        d["python"] = "3.13"
    assert any("supports Python" in x.message for x in check(npu_stack(tmp_path, edit=py))
               if x.rule == "torch-npu-cann")

    def unknown(d):
        d["components"]["torch-npu"]["version"] = "2.9.1"
    (tmp_path / "u").mkdir()
    f = [x for x in check(npu_stack(tmp_path / "u", edit=unknown)) if x.rule == "torch-npu-cann"]
    assert f and f[0].level == "warning" and "not in build/compat/torch-npu.yaml" in f[0].message


def test_shipped_npu_stacks_pass_the_pairing_rule():
    from trainbox.specs.stack import list_stacks
    for name in list_stacks():
        s = load_stack(name)
        assert not [x for x in check(s) if x.rule == "torch-npu-cann"], name


def test_rule_npu_needs_triton(tmp_path):
    def edit(d):
        del d["components"]["triton-ascend"]
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "npu-needs-triton-ascend"]
    assert f and "triton-ascend" in f[0].message


def test_rule_npu_no_cuda_torch(tmp_path):
    def edit(d):
        d["components"]["torch"] = {"source": "pypi", "version": "2.9.0+cu128", "sha256": [SHA]}
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "npu-no-cuda-torch"]
    assert f and "cu128 build" in f[0].message


def test_rule_npu_no_cuda_torch_plain_pypi_x86(tmp_path):
    def edit(d):
        d["components"]["torch"] = {"source": "pypi", "version": "2.9.0", "sha256": [SHA]}
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "npu-no-cuda-torch"]
    assert f and "PyPI's x86_64 torch is the CUDA build" in f[0].message


def test_rule_mindspeed_megatron(tmp_path):
    def edit(d):
        d["components"]["mindspeed"]["commit"] = MS_0160
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "mindspeed-megatron"]
    assert f and f[0].level == "error"
    assert "MindSpeed at commit e4772499f7eb (branch core_r0.16.0) is made for Megatron 0.16, but megatron-core " \
        "is 0.15.3" in f[0].message


def test_rule_mindspeed_megatron_decides_from_the_commit_not_the_ref(tmp_path):
    """Issue 24: a core_r0.16.0 commit relabelled `ref: core_r0.15.3` used to silence the rule."""
    def relabel(d):
        d["components"]["mindspeed"].update(commit=MS_0160, ref="core_r0.15.3")
    f = [x for x in check(npu_stack(tmp_path, edit=relabel)) if x.rule == "mindspeed-megatron"]
    assert f and f[0].level == "error" and "core_r0.16.0" in f[0].message

    def unknown(d):  # a commit of no known branch: its `version:` (which the build checks) decides
        d["components"]["mindspeed"].update(commit="c" * 40, ref="core_r0.15.3", version="0.16.0")
    (tmp_path / "u").mkdir()
    f = [x for x in check(npu_stack(tmp_path / "u", edit=unknown)) if x.rule == "mindspeed-megatron"]
    assert f and f[0].level == "error" and "version 0.16.0" in f[0].message

    def label_only(d):
        d["components"]["mindspeed"].update(commit="c" * 40, ref="core_r0.15.3")
    (tmp_path / "l").mkdir()
    f = [x for x in check(npu_stack(tmp_path / "l", edit=label_only)) if x.rule == "mindspeed-megatron"]
    assert f and f[0].level == "warning" and "cannot be told" in f[0].message


def test_rule_megatron_gdn(tmp_path):
    def edit(d):
        d["env"] = {}
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "megatron-gdn"]
    assert f and 'USE_MCORE_GDN: "0"' in f[0].message


def test_rule_megatron_gdn_not_needed_from_016(tmp_path):
    def edit(d):
        d["env"] = {}
        d["components"]["megatron-core"]["version"] = "0.16.1"
        d["components"]["mindspeed"].update(ref="core_r0.16.0", commit=MS_0160)
    assert "megatron-gdn" not in ids(check(npu_stack(tmp_path, edit=edit)))


def test_rule_python_tag(tmp_path):
    def edit(d):
        d["python"] = "3.10"
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "python-tag"]
    assert f and "ships Python 3.11 but the stack pins wheels for Python 3.10" in f[0].message


def test_rule_patch_series_exists(tmp_path):
    def edit(d):
        d["components"]["megatron-core"]["patches"] = "no-such-series"
    f = [x for x in check(npu_stack(tmp_path, edit=edit)) if x.rule == "patch-series-exists"]
    assert f and "no-such-series/series does not exist" in f[0].message


def test_every_rule_has_id_and_explanation():
    assert len({r.id for r in RULES}) == len(RULES) >= 8
    assert all(r.explanation for r in RULES)


def test_validate_cli_exit_1_and_message(tmp_path, capsys):
    def edit(d):
        d["components"]["torch-npu"]["version"] = "2.8.0"
    s = npu_stack(tmp_path, edit=edit)
    assert main(["stack", "validate", str(s.source_file)]) == 1  # a check found problems
    err = capsys.readouterr().err
    assert "[torch-npu-cann] error" in err and str(s.source_file) in err


def test_show_and_diff_json(capsys):
    import json
    assert main(["stack", "show", "npu-910b", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert any(r["component"] == "torch-npu" for r in shown["components"])
    assert main(["stack", "diff", "npu-910b", "npu-a3", "--json"]) == 1  # they differ
    diff = json.loads(capsys.readouterr().out)
    assert diff["schema"] == 1 and not diff["same"]
    assert {c["key"] for c in diff["changes"]} == {"base.image", "base.chip"}


def test_torch_npu_2_9_0_supports_python_3_10_to_3_12_only(tmp_path):
    """Ascend's notes for torch_npu 2.9.0 (v2.9.0-7.3.0) list Python 3.10-3.12; the row once said 3.9 too."""
    def py39(d):
        d["components"]["torch"]["version"] = "2.9.0+cpu"
        d["components"]["torch-npu"]["version"] = "2.9.0"
        d["python"] = "3.9"
    f = [x for x in check(npu_stack(tmp_path, edit=py39)) if x.rule == "torch-npu-cann"]
    assert any("supports Python 3.10, 3.11, 3.12" in x.message for x in f), f
