"""Component kinds: every `source:` either installs (its line reaches the rendered build) or is refused at
validation with the file and key named, never listed in the manifest as installed."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from trainbox.specs import kinds
from trainbox.specs.kinds import KINDS, PinnedComponent, PlatformPinView, StackView
from trainbox.paths import STACKS_DIR
from trainbox.image.render import render_stack
from trainbox.runtime.errors import TrainboxError
from trainbox.specs.stack import load_stack

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


def _members(proto: type) -> set[str]:
    return {n for n in vars(proto) if not n.startswith("_")}


def test_the_model_is_what_the_kinds_say_they_read():
    """kinds.py names the component and stack it reads as Protocols (the model imports the kinds, so the kinds
    cannot import the model): the shipped model satisfies them, and the kinds read nothing the Protocols leave out."""
    stack = load_stack(STACKS_DIR / "cpu.yaml")
    assert isinstance(stack, StackView)
    for c in stack.components.values():
        assert isinstance(c, PinnedComponent)
        assert isinstance(c.pin_for(stack.platforms[0]), PlatformPinView)
    read: dict[str, set[str]] = {"c": set(), "stack": set(), "pin": set()}
    for node in ast.walk(ast.parse(Path(kinds.__file__).read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in read:
            read[node.value.id].add(node.attr)
    read["c"] |= {f for k in KINDS.values() for f in k.foreign}  # read by name: getattr(c, f)
    assert read["c"] and read["c"] <= _members(PinnedComponent), read["c"] - _members(PinnedComponent)
    assert read["stack"] and read["stack"] <= _members(StackView), read["stack"] - _members(StackView)
    assert read["pin"] and read["pin"] <= _members(PlatformPinView), read["pin"] - _members(PlatformPinView)


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


KERNELS = ("{source: git, git: 'https://github.com/sgl-project/sgl-kernel-npu.git', "
           "commit: 20b773601e8539299256a751d76ebf38ce28dbcb, install: build, "
           "build: ['bash build.sh -a memory-saver'], wheels: 'output/*.whl', needs: [cann-toolkit]}")


def test_git_build_runs_its_commands_in_the_builder_and_names_its_toolkits(tmp_path):
    r = rendered(tmp_path, KERNELS)
    entry = r.manifest["components"]["extra"]
    assert entry["install"] == "build" and entry["needs"] == ["cann-toolkit"] and r.manifest["left_out"] == {}
    assert ("--mode build --git https://github.com/sgl-project/sgl-kernel-npu.git --commit "
            "20b773601e8539299256a751d76ebf38ce28dbcb --build 'bash build.sh -a memory-saver' --wheels "
            "'output/*.whl' --needs cann-toolkit") in r.dockerfile


# Transformer Engine's PyTorch binding: PyPI has only its sdist, a CUDA extension built against the venv's torch
TE_SDIST = (f"{{source: pypi, name: transformer-engine-torch, version: 2.9.0, sha256: [{SHA}], "
            "needs: [cuda-toolkit], build_isolation: false}")


def _run_of(dockerfile: str, component: str) -> str:
    """The one RUN instruction that installs `component` through install_source."""
    runs = [r for r in dockerfile.split("\nRUN ") if f"--component {component} " in r]
    assert len(runs) == 1, runs
    return runs[0]


def test_a_pypi_sdist_that_needs_a_toolkit_is_built_in_its_own_step_after_the_pins(tmp_path):
    r = rendered(tmp_path, TE_SDIST)
    assert "transformer-engine-torch" not in r.requirements  # not in the pip pass that installs torch itself
    run = _run_of(r.dockerfile, "extra")
    assert (f"--mode sdist --dist transformer-engine-torch --version 2.9.0 --sha256 {SHA} --needs cuda-toolkit "
            "--no-build-isolation") in run
    assert "id=pip_index_url" not in run  # its setup.py runs without the index credentials (no secret mount)
    assert r.dockerfile.index("-r /tmp/trainbox/requirements.txt") < r.dockerfile.index("--component extra")
    entry = r.manifest["components"]["extra"]
    assert entry["install"] == "sdist" and entry["needs"] == ["cuda-toolkit"]
    assert entry["build_flags"] == ["--no-build-isolation"] and r.manifest["left_out"] == {}


@pytest.mark.parametrize("component, toolkit", [(KERNELS, "cann-toolkit"), (TE_SDIST, "cuda-toolkit")])
def test_on_a_substitute_base_a_component_that_needs_a_toolkit_is_left_out_and_named(tmp_path, component, toolkit):
    from trainbox.image.plan import render_for
    from trainbox.image.plan import BuildBase

    stack = load_stack(stack_with(tmp_path, component))
    r = render_for(stack, BuildBase(requested=stack.base.image, used="local/debian:bookworm",
                                    substituted="local/debian:bookworm"))
    assert "extra" not in r.manifest["components"] and "--component extra" not in r.dockerfile
    assert r.manifest["left_out"] == {
        "extra": f"needs {toolkit}, which the substitute base local/debian:bookworm does not have"}
    assert "extra" not in r.requirements


def test_the_cuda_stack_builds_transformer_engines_pytorch_binding_and_a_substitute_leaves_it_out():
    from trainbox.image.plan import render_for
    from trainbox.image.plan import BuildBase

    stack = load_stack("cuda")
    run = _run_of(render_stack(stack).dockerfile, "transformer-engine-torch")
    assert "--mode sdist --dist transformer-engine-torch --version 2.9.0 --sha256 " in run
    assert "--needs cuda-toolkit --no-build-isolation" in run
    sub = render_for(stack, BuildBase(requested=stack.base.image, used="local/debian:bookworm",
                                      substituted="local/debian:bookworm"))
    assert "transformer-engine-torch" in sub.manifest["left_out"]
    assert "--component transformer-engine-torch" not in sub.dockerfile


def _sdist_source(tmp_path: Path, content: bytes = b"not really an sdist") -> tuple[Path, str]:
    import hashlib

    staged = tmp_path / "sources" / "te"
    staged.mkdir(parents=True)
    (staged / "transformer_engine_torch-2.9.0.tar.gz").write_bytes(content)
    return tmp_path / "sources", hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize("wrong_hash, expected", [
    (True, "trainbox-install-source: error: te: transformer_engine_torch-2.9.0.tar.gz has sha256 "),
    (False, "trainbox-install-source: error: te: needs cann-toolkit (no $ASCEND_TOOLKIT_HOME"),
])
def test_install_source_checks_the_staged_sdist_and_the_toolkit_before_building(tmp_path, wrong_hash, expected):
    """The builder's side of `--mode sdist`: a staged sdist that is not the pinned one, or a builder without the
    toolkit it needs, fails with one line before pip runs. (The toolkit asked for is CANN's: this host has no
    CANN, while it may have nvcc.)"""
    import os
    import subprocess
    import sys

    sources, sha = _sdist_source(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_TOOLKIT_HOME"}
    proc = subprocess.run([sys.executable, "-m", "trainbox.runtime.install_source", "--component", "te",
                           "--mode", "sdist", "--version", "2.9.0", "--sha256", SHA if wrong_hash else sha,
                           "--needs", "cann-toolkit", "--no-build-isolation", "--sources-dir", str(sources)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith(expected), proc.stderr


@pytest.mark.parametrize("component, expected", [
    (f"{{source: git, git: 'https://x.invalid/x.git', commit: {COMMIT}, install: build}}",
     r"components.extra: install: build needs `build:`"),
    (f"{{source: git, git: 'https://x.invalid/x.git', commit: {COMMIT}, install: tree, build: [make]}}",
     r"components.extra: `build` belongs to `install: build`"),
    (f"{{source: git, git: 'https://x.invalid/x.git', commit: {COMMIT}, needs: [cann-toolkit]}}",
     r"components.extra: `needs` belongs to `install: build`"),
    (f"{{source: git, git: 'https://x.invalid/x.git', commit: {COMMIT}, install: build, build: [make], "
     "wheels: /abs/*.whl}", r"components.extra: wheels '/abs/\*.whl' must be a glob relative to the tree"),
    (f"{{source: git, git: 'https://x.invalid/x.git', commit: {COMMIT}, install: build, build: [make], "
     "needs: [rocm]}", r"components.extra.needs.0"),
    (f"{{source: pypi, version: '1.0', sha256: [{SHA}], build_isolation: false}}",
     r"components.extra: build_isolation: false is for a pypi component compiled in the build"),
    (f"{{source: pypi, version: '1.0', sha256: [{SHA}], needs: [cuda-toolkit], extras: [pytorch]}}",
     r"components.extra: a pypi component with `needs:` is built from its sdist --no-deps"),
])
def test_build_keys_are_refused_where_they_cannot_apply(tmp_path, component, expected):
    with pytest.raises(TrainboxError, match=r"kind-test.yaml: " + expected):
        load_stack(stack_with(tmp_path, component))


def test_install_source_refuses_a_build_without_its_toolkit(tmp_path, monkeypatch):
    """The builder's side: a component that needs the CANN toolkit, in a builder without one (this host), fails
    before any command runs, with one line naming the toolkit."""
    import subprocess
    import sys

    tree = tmp_path / "sources" / "kernels"
    tree.mkdir(parents=True)
    (tree / ".trainbox-source.json").write_text('{"git": "https://x.invalid/k.git", "commit": "%s"}' % COMMIT)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("ASCEND_TOOLKIT_HOME",)}
    proc = subprocess.run([sys.executable, "-m", "trainbox.runtime.install_source", "--component", "kernels",
                           "--mode", "build", "--git", "https://x.invalid/k.git", "--commit", COMMIT,
                           "--build", "touch RAN", "--needs", "cann-toolkit", "--sources-dir", str(tmp_path / "sources")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith("trainbox-install-source: error: kernels: needs cann-toolkit (no $ASCEND_TOOLKIT_HOME")
    assert not (tree / "RAN").exists()


@pytest.mark.slow
def test_install_source_build_runs_the_commands_with_the_venv_first_and_installs_the_wheels(tmp_path):
    """--mode build in a throwaway venv (the builder's /opt/venv stands here): the commands run in the tree with
    the venv's python3 first on PATH, the wheels they leave install, and a stand-in toolkit home satisfies
    `--needs cann-toolkit` (this host has no CANN)."""
    import os
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    tree = tmp_path / "sources" / "kernels"
    (tree / "kern").mkdir(parents=True)
    (tree / "kern" / "__init__.py").write_text("BUILT = True\n")
    (tree / "make_wheel.py").write_text(  # the project's own build, standing in for a kernel build
        "import sys, zipfile\n"
        "with zipfile.ZipFile(sys.argv[1], 'w') as z:\n"
        "    z.write('kern/__init__.py')\n"
        "    z.writestr('kern-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: kern\\nVersion: 1.0\\n')\n"
        "    z.writestr('kern-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n"
        "    z.writestr('kern-1.0.dist-info/RECORD', '')\n")
    (tree / ".trainbox-source.json").write_text('{"git": "https://x.invalid/k.git", "commit": "%s"}' % COMMIT)
    toolkit = tmp_path / "stand-in-ascend-toolkit"
    toolkit.mkdir()
    env = dict(os.environ, ASCEND_TOOLKIT_HOME=str(toolkit),
               PYTHONPATH=str(Path(__file__).resolve().parents[1] / "python"))
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "trainbox.runtime.install_source", "--component",
                           "kernels", "--mode", "build", "--git", "https://x.invalid/k.git", "--commit", COMMIT,
                           "--build", "test \"$(command -v python3)\" = " + str(venv / "bin" / "python3"),
                           "--build", "mkdir -p output",
                           "--build", "python3 make_wheel.py output/kern-1.0-py3-none-any.whl",
                           "--wheels", "output/*.whl", "--needs", "cann-toolkit",
                           "--sources-dir", str(tmp_path / "sources")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "kernels: installed kern-1.0-py3-none-any.whl built from https://x.invalid/k.git@" in proc.stdout
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import kern; print(kern.BUILT)"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert check.stdout.strip() == "True"
    assert not (tree / "output").exists()  # built in a copy: the staged tree stays as fetched


@pytest.mark.slow
@pytest.mark.parametrize("staged", [True, False])
def test_install_source_sdist_builds_the_staged_sdist_against_the_venv_without_isolation(tmp_path, staged):
    """--mode sdist in a throwaway venv (the builder's /opt/venv stands here): the staged (or, in a plain
    `docker build` with nothing staged, downloaded) sdist is hash-checked, built --no-build-isolation, so its
    setup.py sees what the venv holds (as transformer_engine_torch sees torch), and installed; a stand-in toolkit
    home satisfies `--needs cann-toolkit` (this host has no CANN)."""
    import hashlib
    import os
    import subprocess
    import sys
    import tarfile

    venv = tmp_path / "venv"
    # no ensurepip (its setuptools 65 has no bdist_wheel): pip and setuptools from the host's site, as the image's
    # venv has pip and the stack's setuptools pin
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    src = tmp_path / "ext-1.0"
    (src / "ext").mkdir(parents=True)
    (src / "ext" / "__init__.py").write_text("")
    # what a --no-build-isolation build can see: the venv's own packages (here: a marker only the venv has)
    (src / "setup.py").write_text(
        "import marker_only_in_the_venv, setuptools\n"
        "setuptools.setup(name='ext', version='1.0', packages=['ext'])\n")
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: ext\nVersion: 1.0\n")
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "marker_only_in_the_venv.py").write_text("")
    staged = tmp_path / "sources" / "ext"
    staged.mkdir(parents=True)
    sdist = staged / "ext-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname="ext-1.0")
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    toolkit = tmp_path / "stand-in-ascend-toolkit"
    toolkit.mkdir()
    env = dict(os.environ, ASCEND_TOOLKIT_HOME=str(toolkit), PIP_NO_INDEX="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[1] / "python"))
    if not staged:  # what pip finds: the same file, from a find-links directory standing in for the index
        links = tmp_path / "links"
        links.mkdir()
        sdist.rename(links / sdist.name)
        staged_dir = sdist.parent
        staged_dir.rmdir()
        env.update(PIP_FIND_LINKS=str(links), PIP_CONFIG_FILE=os.devnull)
        wrong = subprocess.run([str(venv / "bin" / "python"), "-m", "trainbox.runtime.install_source", "--component",
                                "ext", "--mode", "sdist", "--dist", "ext", "--version", "1.0", "--sha256", "0" * 64,
                                "--needs", "cann-toolkit", "--no-build-isolation",
                                "--sources-dir", str(tmp_path / "sources")],
                               capture_output=True, text=True, env=env, timeout=600)
        assert wrong.returncode == 1 and "ext-1.0.tar.gz has sha256 " in wrong.stderr  # checked before it builds
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "trainbox.runtime.install_source", "--component",
                           "ext", "--mode", "sdist", "--dist", "ext", "--version", "1.0", "--sha256", "0" * 64,
                           "--sha256", sha,
                           "--needs", "cann-toolkit", "--no-build-isolation", "--sources-dir", str(tmp_path / "sources")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert f"ext: built and installed ext-1.0.tar.gz (sha256 {sha[:12]})" in proc.stdout
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import ext, importlib.metadata as m; print(m.version('ext'))"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert check.stdout.strip() == "1.0"


SDIST = ("{source: url, name: sglang, url: 'https://files.invalid/sglang-0.5.9.tar.gz', sha256: [%s], install: build, "
         "build: ['cp pyproject_npu.toml pyproject.toml', 'python3 -m pip wheel --no-deps -w dist .']}" % SHA)


def test_url_source_archive_builds_with_its_own_commands(tmp_path):
    """An sdist built with another pyproject (sglang's NPU build): staged, checked, built by its commands."""
    r = rendered(tmp_path, SDIST)
    assert r.manifest["components"]["extra"] == {
        "name": "sglang", "source": "url", "url": "https://files.invalid/sglang-0.5.9.tar.gz", "sha256": [SHA],
        "install": "build"}
    assert ("--mode build --url https://files.invalid/sglang-0.5.9.tar.gz --sha256 " + SHA +
            " --build 'cp pyproject_npu.toml pyproject.toml' --build 'python3 -m pip wheel --no-deps -w dist .'"
            ) in r.dockerfile
    assert "sglang" not in r.requirements  # not a pip requirement: the builder builds and installs it


@pytest.mark.parametrize("component, expected", [
    (f"{{source: url, url: 'https://x.invalid/x-1-py3-none-any.whl', sha256: [{SHA}], install: build, "
     "build: [make]}", r"install: build needs a source archive"),
    (f"{{source: url, url: 'https://x.invalid/x-1.tar.gz', sha256: [{SHA}], install: build}}",
     r"install: build needs `build:`"),
    (f"{{source: url, url: 'https://x.invalid/x-1.tar.gz', sha256: [{SHA}], build: [make]}}",
     r"`build` belongs to `install: build`"),
])
def test_url_build_keys_are_refused_where_they_cannot_apply(tmp_path, component, expected):
    with pytest.raises(TrainboxError, match=r"kind-test.yaml: components.extra: " + expected):
        load_stack(stack_with(tmp_path, component))


def _sdist(tmp_path: Path) -> tuple[Path, str]:
    """A tiny sdist whose default pyproject is not the one to build (as sglang's: pyproject_npu.toml)."""
    import hashlib
    import io
    import tarfile

    files = {"pkg-1.0/pyproject.toml": "this is not the pyproject to build\n",
             "pkg-1.0/pyproject_npu.toml": "[build-system]\nrequires=[]\n",
             "pkg-1.0/make_wheel.py": (
                 "import sys, zipfile\n"
                 "with zipfile.ZipFile(sys.argv[1], 'w') as z:\n"
                 "    z.writestr('npupkg/__init__.py', 'BUILT_WITH = ' + repr(open('pyproject.toml').read()))\n"
                 "    z.writestr('npupkg-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: npupkg\\nVersion: 1.0\\n')\n"
                 "    z.writestr('npupkg-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n"
                 "    z.writestr('npupkg-1.0.dist-info/RECORD', '')\n")}
    staged = tmp_path / "sources" / "pkg"
    staged.mkdir(parents=True)
    archive = staged / "pkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return archive, hashlib.sha256(archive.read_bytes()).hexdigest()


def _install_sdist(tmp_path: Path, sha: str, python: str):
    import os
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "python"))
    return subprocess.run([python, "-m", "trainbox.runtime.install_source", "--component", "pkg", "--mode", "build",
                           "--url", "https://x.invalid/pkg-1.0.tar.gz", "--sha256", sha,
                           "--build", "cp pyproject_npu.toml pyproject.toml", "--build", "mkdir -p dist",
                           "--build", "python3 make_wheel.py dist/npupkg-1.0-py3-none-any.whl",
                           "--sources-dir", str(tmp_path / "sources")],
                          capture_output=True, text=True, env=env, timeout=300)


def test_install_source_refuses_a_source_archive_with_other_bytes(tmp_path):
    import sys

    _sdist(tmp_path)
    proc = _install_sdist(tmp_path, SHA, sys.executable)
    assert proc.returncode == 1
    assert proc.stderr.startswith("trainbox-install-source: error: pkg: pkg-1.0.tar.gz has sha256 ")
    assert f"the pin says {SHA}" in proc.stderr


@pytest.mark.slow
def test_install_source_builds_a_source_archive_with_the_swapped_pyproject(tmp_path):
    """--mode build from a staged sdist in a throwaway venv: checked, unpacked to its top directory, the commands
    run there (the NPU pyproject in place of the default one), the wheel they leave installs."""
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    archive, sha = _sdist(tmp_path)
    proc = _install_sdist(tmp_path, sha, str(venv / "bin" / "python"))
    assert proc.returncode == 0, proc.stderr
    assert (f"pkg: installed npupkg-1.0-py3-none-any.whl built from https://x.invalid/pkg-1.0.tar.gz "
            f"(sha256 {sha[:12]})") in proc.stdout
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import npupkg; print(repr(npupkg.BUILT_WITH))"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert check.stdout.strip() == repr("[build-system]\nrequires=[]\n"), check.stderr
    assert archive.read_bytes()  # the staged archive stays as fetched
