"""Source components built for real: git commits fetched through git's own insteadOf config from the upstream
copies in ../shared/upstream/, patched, built and installed into the cpu stack's image (tests/data/stacks/
cpu-sources.yaml). Failures (wrong commit, unreachable repository, tampered archive, stale patch) stop before
the build with one line and tag nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import docker_helpers
from trainbox.paths import REPO_ROOT
from upstream_helpers import MEGATRON, MINDSPEED, git_env, hostile_setuptools_wheel, make_mirrors, stack_file

pytestmark = pytest.mark.docker

@pytest.fixture(scope="module")
def mirrors(tmp_path_factory):
    return make_mirrors(tmp_path_factory.mktemp("mirrors"))


def trainbox(args: list[str], env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT)


def build_args(stack: Path, report: Path, base: str | None = None, wheelhouse: Path | None = None) -> list[str]:
    args = ["image", "build", str(stack), "-o", str(report)] + (["--base", base] if base else [])
    if wheelhouse:
        args += ["--wheelhouse", str(wheelhouse)]
    elif Path("/opt/wheels").is_dir():
        args += ["--wheelhouse", "/opt/wheels"]
    return args


def hostile_wheelhouse(tmp: Path) -> Path:
    """/opt/wheels (the torch wheel) plus issue 22's input: a setuptools-99 wheel whose code stops the build."""
    wh = tmp / "wheelhouse"
    wh.mkdir()
    for w in Path("/opt/wheels").glob("*.whl") if Path("/opt/wheels").is_dir() else []:
        (wh / w.name).symlink_to(w)
    hostile_setuptools_wheel(wh)
    return wh


@pytest.fixture(scope="module")
def tools_base():
    """The Debian base with the builder's system packages (git, patch) already in it, as an air-gapped site's base
    has them: an offline (--bundle) build cannot apt-get, and this engine (BuildKit 0.8) does not reuse the online
    build's cached apt layer under --network none. The builder's dpkg-query check then skips apt. Kept between
    runs (docker_helpers.kept_base): the online build's layers on it are then answered by a warm engine, while
    the offline build runs every step with --no-cache."""
    return docker_helpers.kept_base(
        "trainbox-test/base-build-tools",
        "RUN apt-get -o Acquire::Retries=5 update && DEBIAN_FRONTEND=noninteractive apt-get install "
        "-y --no-install-recommends git patch && rm -rf /var/lib/apt/lists/*\nCMD [\"bash\"]\n")


@pytest.fixture(scope="module")
def built(mirrors, tools_base, tmp_path_factory):
    docker_helpers.docker_client()  # skips (fails in CI) without an engine
    tmp = tmp_path_factory.mktemp("sources-build")
    env = git_env(mirrors, TRAINBOX_CACHE=str(tmp / "cache"))
    report = tmp / "report.json"

    def unique(d):  # a value new to this run: a lasting BuildKit cache cannot answer every step of the builds
        d.setdefault("env", {})["TRAINBOX_TEST_RUN"] = uuid.uuid4().hex

    # the MindSpeed wheel builds with the setuptools-99 wheel in the wheelhouse pip is offered: its code would
    # stop the build (an isolated build environment took it); the lock's hash-pinned setuptools is used instead
    wheelhouse = hostile_wheelhouse(tmp)
    proc = trainbox(build_args(stack_file(tmp, unique), report, tools_base, wheelhouse), env, timeout=1800)
    assert "setuptools-99" not in proc.stderr, proc.stderr[-4000:]
    assert proc.returncode == 0, proc.stderr[-4000:]
    tag = json.loads(report.read_text())["tag"]
    yield tag, env, tmp, wheelhouse
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def run_in(tag: str, code: str) -> str:
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "/opt/venv/bin/python",
                           tag, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_mindspeed_wheel_from_the_patched_tree_and_megatron_tree(built):
    tag, *_ = built
    out = json.loads(run_in(tag, """if True:
        import importlib.metadata as md, importlib.util, json, sys, pathlib
        import mindspeed
        spec = importlib.util.find_spec("megatron.training")
        manifest = json.load(open("/etc/trainbox/stack.json"))
        print(json.dumps({
            "version": md.version("mindspeed"),
            "patched": 'core_r0.15.3: the version setup.py builds' in pathlib.Path(mindspeed.__file__).read_text(),
            "direct_url": json.loads(md.distribution("mindspeed").read_text("direct_url.json")),
            "training": str(pathlib.Path(spec.submodule_search_locations[0])),
            "files": sorted(p.name for p in pathlib.Path(spec.submodule_search_locations[0]).glob("*.py"))[:50],
            "on_path": [p for p in sys.path if p.startswith("/opt/src")],
            "git_dirs": [str(p) for p in pathlib.Path("/opt/src").rglob(".git")],
            "components": manifest["components"],
        }))
    """))
    assert out["version"] == "0.15.3"
    assert out["patched"], "the patch's line is not in the installed mindspeed/__init__.py"
    assert out["direct_url"]["vcs_info"]["commit_id"] == MINDSPEED[2]
    assert out["training"] == "/opt/src/megatron-lm/megatron/training"
    assert {"arguments.py", "training.py", "initialize.py"} <= set(out["files"])
    assert out["on_path"] == ["/opt/src/megatron-lm"] and out["git_dirs"] == []
    comps = out["components"]
    assert comps["mindspeed"]["commit"] == MINDSPEED[2] and comps["mindspeed"]["install"] == "pip"
    assert comps["mindspeed"]["git"] == MINDSPEED[0] and len(comps["mindspeed"]["tree"]) == 40
    assert comps["megatron-lm"]["commit"] == MEGATRON[2] and comps["megatron-lm"]["install"] == "tree"


def test_doctor_checks_the_installed_commits(built):
    tag, *_ = built
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", tag, "trainbox", "doctor", "--json"],
                          capture_output=True, text=True, timeout=120)
    checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["packages.versions"]["status"] == "PASS", checks["packages.versions"]
    assert "mindspeed" in checks["packages.versions"]["data"]["checked"]
    assert checks["packages.sources"]["status"] == "PASS", checks["packages.sources"]
    assert "megatron-lm" in checks["packages.sources"]["message"]


def _fails(tmp_path, mirrors, edit, expected: str, env_extra=None):
    env = git_env(mirrors, TRAINBOX_CACHE=str(tmp_path / "cache"), **(env_extra or {}))
    report = tmp_path / "report.json"
    images = ["docker", "images", "-q", "--no-trunc", "trainbox/cpu-sources"]
    before = set(subprocess.run(images, capture_output=True, text=True).stdout.split())
    proc = trainbox(build_args(stack_file(tmp_path, edit), report), env, timeout=300)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("trainbox: error:")]
    assert len(errors) == 1 and expected in errors[0], proc.stderr[-3000:]
    after = set(subprocess.run(images, capture_output=True, text=True).stdout.split())
    assert after <= before, "a failed build left an image behind"
    return errors[0]


def test_wrong_commit_fails_before_the_build(tmp_path, mirrors):
    def edit(d):
        d["components"]["mindspeed"]["commit"] = "e" * 40
    line = _fails(tmp_path, mirrors, edit, "the repository has no commit " + "e" * 40)
    assert "mindspeed" in line and MINDSPEED[0] in line


def test_unreachable_repository_fails_before_the_build(tmp_path, mirrors):
    def edit(d):
        d["components"]["megatron-lm"]["git"] = "https://git.invalid/NVIDIA/Megatron-LM.git"
    line = _fails(tmp_path, mirrors, edit, "cannot fetch from https://git.invalid/NVIDIA/Megatron-LM.git")
    assert "megatron-lm" in line


def test_patch_for_another_commit_fails_before_the_build(tmp_path, mirrors):
    """core_r0.16.0's tree under the same series: a pin moved without rebasing the patches (the patch happens to
    apply, but its Upstream-Ref names the old commit). A patch that does not apply: tests/test_fetch.py."""
    def edit(d):
        d["components"]["mindspeed"]["commit"] = "e4772499f7eb9fa9a68919dd1eaddef00e915b2d"
        d["components"]["mindspeed"]["ref"] = "core_r0.16.0"
        d["components"]["mindspeed"]["version"] = "0.16.0"
    _fails(tmp_path, mirrors, edit, "component mindspeed: patch patches/mindspeed/0001-mindspeed-expose-__version__"
                                    ".patch was made against https://gitcode.com/Ascend/MindSpeed.git@d0d5809d4323, "
                                    "not the pinned https://gitcode.com/Ascend/MindSpeed.git@e4772499f7eb")


def test_tampered_archive_fails_before_the_build(tmp_path, mirrors):
    import tarfile

    wheel = next(Path("/opt/wheels").glob("*.whl"), None) if Path("/opt/wheels").is_dir() else None
    if wheel is None:
        pytest.skip("no wheel at hand to bundle")
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(wheel, arcname=f"wheels/{wheel.name}")
    import hashlib
    good = hashlib.sha256(bundle.read_bytes()).hexdigest()
    with open(bundle, "ab") as fh:
        fh.write(b"tampered")

    def edit(d):
        d["components"]["bundle"] = {"source": "url", "url": bundle.as_uri(), "sha256": [good]}
    _fails(tmp_path, mirrors, edit, f"component bundle ({bundle.as_uri()}): bundle.tar.gz from {bundle.as_uri()} "
                                    f"has sha256")


def test_bundle_builds_with_the_network_off_to_the_same_tag(built, mirrors, tools_base):
    """fetch --bundle, then image build --bundle with no git config (no mirror) and `--network none`."""
    tag, env, tmp, wheelhouse = built
    bundle = tmp / "bundle.tar"
    # the torch wheel (its index is unreachable here) and the setuptools-99 wheel: only pinned files are bundled
    args = ["fetch", str(tmp / "cpu-sources.yaml"), "--bundle", str(bundle), "--json", "--wheelhouse", str(wheelhouse)]
    proc = trainbox(args, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["schema"] == "trainbox.bundle/1"
    import tarfile

    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert not [n for n in names if "setuptools-99" in n]
    assert [n for n in names if n.startswith("./wheelhouse/setuptools-84.2.1-")], names
    offline = {k: v for k, v in env.items() if not k.startswith("GIT_CONFIG_")}
    offline["TRAINBOX_CACHE"] = str(tmp / "empty-cache")  # nothing from the online build's source cache
    dry = trainbox(["image", "build", str(tmp / "cpu-sources.yaml"), "--bundle", str(bundle), "--base", tools_base,
                    "--dry-run"], offline)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "--network none" in dry.stdout and "TRAINBOX_OFFLINE=1" in dry.stdout
    report = tmp / "offline.json"
    proc = trainbox(["image", "build", str(tmp / "cpu-sources.yaml"), "--bundle", str(bundle), "--base", tools_base,
                     "--force", "--no-cache", "-o", str(report)], offline, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rep = json.loads(report.read_text())
    assert rep["tag"] == tag and not rep["skipped"] and rep["rebuilt_steps"] > 0
    assert run_in(tag, "import importlib.metadata as m; print(m.version('mindspeed'))").strip() == "0.15.3"


def test_a_tampered_bundle_is_refused(built, tmp_path):
    _, env, tmp, _ = built
    bundle = tmp / "bundle.tar"
    if not bundle.exists():
        pytest.skip("the bundle test did not run")
    import tarfile

    bad = tmp_path / "bad.tar"
    with tarfile.open(bundle) as src, tarfile.open(bad, "w") as dst:
        for m in src.getmembers():
            f = src.extractfile(m) if m.isfile() else None
            if m.name.endswith("bundle.json"):
                data = f.read().replace(b"0.15.3", b"0.15.4")
                m.size = len(data)
                import io
                f = io.BytesIO(data)
            dst.addfile(m, f)
    proc = trainbox(["image", "build", str(tmp / "cpu-sources.yaml"), "--bundle", str(bad)], env)
    assert proc.returncode != 0
    assert "bundle.json does not match its SHA256SUMS entry" in proc.stderr


def test_a_setuptools_99_wheel_added_to_a_bundle_with_its_sums_rewritten_is_refused(built, tmp_path, tools_base):
    """Issue 22's HIGH input as a forger would add it: the hostile wheel in the bundle's wheelhouse and SHA256SUMS
    rewritten to match (so the seal holds). A real `image build --bundle` refuses it in one line, exit 2, naming the
    file, before the engine is asked for anything: no image, no report."""
    import hashlib
    import io
    import tarfile

    _, env, tmp, wheelhouse = built
    bundle = tmp / "bundle.tar"
    if not bundle.exists():
        pytest.skip("the bundle test did not run")
    evil = (wheelhouse / "setuptools-99.0.0-py3-none-any.whl").read_bytes()
    bad = tmp_path / "forged.tar"
    with tarfile.open(bundle) as src, tarfile.open(bad, "w") as dst:
        sums = src.extractfile("./SHA256SUMS").read().decode()
        sums += f"{hashlib.sha256(evil).hexdigest()}  wheelhouse/setuptools-99.0.0-py3-none-any.whl\n"
        for m in src.getmembers():
            if m.name == "./SHA256SUMS":
                m.size = len(sums.encode())
                dst.addfile(m, io.BytesIO(sums.encode()))
            else:
                dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        ti = tarfile.TarInfo("./wheelhouse/setuptools-99.0.0-py3-none-any.whl")
        ti.size = len(evil)
        dst.addfile(ti, io.BytesIO(evil))
    offline = {k: v for k, v in env.items() if not k.startswith("GIT_CONFIG_")}
    offline["TRAINBOX_CACHE"] = str(tmp_path / "cache")
    images = ["docker", "images", "-q", "--no-trunc", "trainbox/cpu-sources"]
    before = set(subprocess.run(images, capture_output=True, text=True).stdout.split())
    report = tmp_path / "report.json"
    proc = trainbox(["image", "build", str(tmp / "cpu-sources.yaml"), "--bundle", str(bad), "--base", tools_base,
                     "--force", "-o", str(report)], offline, timeout=600)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err[-3000:]
    assert "wheelhouse/setuptools-99.0.0-py3-none-any.whl is not a file the stack's pins or lock name" in err, err
    assert not report.exists() and not (tmp_path / "cache" / "build").exists()
    assert set(subprocess.run(images, capture_output=True, text=True).stdout.split()) <= before
