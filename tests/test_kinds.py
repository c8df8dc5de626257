"""Component kinds: every `source:` either installs (its line reaches the rendered build) or is refused at
validation with the file and key named, never listed in the manifest as installed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from trainbox.kinds import KINDS
from trainbox.paths import STACKS_DIR
from trainbox.render import render_stack
from trainbox.runtime.errors import TrainboxError
from trainbox.stack import load_stack

SHA = "c" * 64
COMMIT = "d0d5809d4323eb908f89e87958de254465eb57b4"


def stack_with(tmp_path: Path, component: str) -> Path:
    """A stack extending the shipped cpu stack with one more component (YAML flow mapping)."""
    p = tmp_path / "kind-test.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: kind-test
        extends: cpu
        components:
          extra: {component}
        """))
    # the cpu stack's lock serves the pins this stack inherits (their hashes; the deps only while fresh)
    p.with_suffix(".lock").write_bytes((STACKS_DIR / "cpu.lock").read_bytes())
    return p


def rendered(tmp_path: Path, component: str):
    return render_stack(load_stack(stack_with(tmp_path, component)))


def test_every_kind_is_covered_here():
    assert set(KINDS) == {"pypi", "url", "git"}


def test_pypi_installs_hash_checked(tmp_path):
    r = rendered(tmp_path, f"{{source: pypi, name: six, version: 1.17.0, sha256: [{SHA}]}}")
    assert f"six==1.17.0 --hash=sha256:{SHA}" in r.requirements.splitlines()
    assert r.manifest["components"]["extra"] == {"name": "six", "source": "pypi", "version": "1.17.0",
                                                 "index": "pypi", "sha256": [SHA]}


def test_url_wheel_installs_hash_checked(tmp_path):
    url = "https://example.invalid/six-1.17.0-py2.py3-none-any.whl"
    r = rendered(tmp_path, f"{{source: url, name: six, url: '{url}', sha256: [{SHA}]}}")
    assert f"six @ {url} --hash=sha256:{SHA}" in r.requirements.splitlines()
    assert r.manifest["components"]["extra"]["url"] == url


def test_git_pip_and_tree_install_in_the_builder(tmp_path):
    r = rendered(tmp_path, f"{{source: git, git: 'https://gitcode.com/Ascend/MindSpeed.git', commit: {COMMIT}, "
                           "ref: core_r0.15.3, version: 0.15.3, install: pip}")
    entry = r.manifest["components"]["extra"]
    assert entry["commit"] == COMMIT and entry["install"] == "pip" and entry["version"] == "0.15.3"
    assert "-m trainbox.runtime.install_source --component extra" in r.dockerfile and f"--commit {COMMIT}" in r.dockerfile
    r = rendered(tmp_path, f"{{source: git, git: 'https://github.com/NVIDIA/Megatron-LM.git', commit: {COMMIT}, "
                           "install: tree}")
    assert r.manifest["components"]["extra"]["path"] == "/opt/src/extra"
    assert "--mode tree" in r.dockerfile and "COPY --from=builder /opt/src /opt/src" in r.dockerfile


@pytest.mark.parametrize("component, expected", [
    ("{source: svn, url: 'https://x.invalid/r'}", r"components.extra.source: .*source 'svn': expected one of pypi, url, git"),
    ("{source: git, git: 'https://gitcode.com/Ascend/MindSpeed.git', ref: core_r0.15.3}",
     r"components.extra: a git component needs `commit:`.*a branch or tag alone moves"),
    ("{source: git, git: 'https://gitcode.com/Ascend/MindSpeed.git', commit: d0d5809}",
     r"components.extra: commit 'd0d5809' must be a full 40-hex sha"),
    (f"{{source: git, git: 'git://example.invalid/x.git', commit: {COMMIT}}}",
     r"components.extra: git 'git://example.invalid/x.git': only https://, ssh://"),
    (f"{{source: git, git: 'https://x.invalid/x.git', commit: {COMMIT}, install: wheel}}",
     r"components.extra.install"),
    (f"{{source: git, git: 'https://x.invalid/x.git', commit: {COMMIT}, subdir: ../up}}",
     r"components.extra.subdir: subdir '../up': must stay inside the tree"),
    (f"{{source: url, url: 'https://x.invalid/tool.deb', sha256: [{SHA}]}}",
     r"components.extra: url 'https://x.invalid/tool.deb': expected a wheel"),
    ("{source: url, url: 'https://x.invalid/x-1-py3-none-any.whl'}",
     r"components.extra: a url component needs exactly one `sha256`"),
    (f"{{source: pypi, version: '1.0', install: tree, sha256: [{SHA}]}}",
     r"components.extra: install: 'tree' is for git components"),
])
def test_what_cannot_be_installed_is_refused_at_validation(tmp_path, component, expected):
    with pytest.raises(TrainboxError, match=r"kind-test.yaml: " + expected):
        load_stack(stack_with(tmp_path, component))
