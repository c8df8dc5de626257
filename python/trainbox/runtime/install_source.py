"""Install one source component inside an image build (standard library only, any Python 3.10+).

Run as `python -m trainbox.runtime.install_source` with the checkout's python/ on PYTHONPATH (the Dockerfile
bind-mounts it; the builder has no trainbox package yet).

The host (`trainbox fetch` / `trainbox image build`) fetched and verified the source and staged it in the build
context under build/sources/<component>/ with a `.trainbox-source.json` that names URL and commit; the Dockerfile
bind-mounts that directory, so no layer ever holds `.git` or a credential. Without a staged copy (a plain
`docker build` of the committed Dockerfile) a git component is fetched here with git, by commit, and the fetched
HEAD is checked against the pin.

    --mode pip      apply the patch series to a copy of the tree, build a wheel from it (or from --subdir; with
                    --build-req in an environment of exactly those hash-pinned build requirements), install it
                    --no-deps and record the commit in its direct_url.json (PEP 610); with --wheel-out DIR only
                    build it into DIR, with --wheel-in DIR only install (and record) the wheel built there: the
                    wheel is built in a stage of its own, beside the venv's pins, and not on their path
    --mode tree     apply the series, put the tree (no .git) at /opt/src/<component>, add it to sys.path (.pth)
    --mode archive  check the staged archive's sha256, install the wheels it holds --no-deps
    --mode sdist    check the staged sdist (none staged: --dist==--version downloaded by pip) against one of --sha256
                    and the toolkits it --needs, build and install it --no-deps (--no-build-isolation: against the
                    venv's own torch, as CUDA extensions build)
    --mode build    apply the series, check the toolkits it --needs are in the builder, run each --build command
                    (bash, in the tree, the venv first on PATH, with --build-req the hash-pinned build requirements
                    on PYTHONPATH and pip's build isolation off), install the wheels matching --wheels --no-deps;
                    with --url and --sha256 instead of --git, the tree is the staged source archive (an sdist),
                    checked and unpacked (its one top-level directory)
    --mode build-env
                    install the --build-req lines (hash-pinned, from the index) into --build-env DIR, in a step of
                    its own: the one step of a source build that is given the index credentials. The build step
                    (pip, build) then takes --build-env DIR and runs the tree's own code with no credentials in
                    reach (no secret mounted, no PIP_INDEX_URL that holds one)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

from . import apply_patches, npu, nvidia, unpack

PROG = "trainbox-install-source"
MARKER = ".trainbox-source.json"


class SourceFailed(Exception):
    """One line that names the component and what went wrong."""


def _run(argv: list[str], what: str, cwd: Path | None = None, env: dict | None = None) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        out = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise SourceFailed(f"{what} failed: {out[-1] if out else 'exit ' + str(proc.returncode)}\n"
                           + "\n".join(out[-30:]))
    return proc.stdout


def _git_fetch(url: str, commit: str, dest: Path) -> None:
    """No staged tree: fetch the commit with git (depth 1), check it, export it without .git."""
    if not shutil.which("git"):
        raise SourceFailed(f"{url}@{commit}: no staged tree in the build context and no git in the builder; build "
                           "with `trainbox image build` (it stages the tree) or `trainbox fetch` first")
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ALLOW_PROTOCOL="https:ssh:file")
    repo = dest.parent / f".{dest.name}.git"
    _run(["git", "init", "-q", "--bare", str(repo)], "git init", env=env)
    _run(["git", "--git-dir", str(repo), "fetch", "-q", "--depth", "1", "--no-tags", "--", url, commit],
         f"git fetch {url} {commit}", env=env)
    head = _run(["git", "--git-dir", str(repo), "rev-parse", "FETCH_HEAD"], "git rev-parse", env=env).strip()
    if head != commit:
        raise SourceFailed(f"{url}: fetched {head}, not the pinned commit {commit}")
    dest.mkdir(parents=True)
    with tempfile.TemporaryFile() as tf:
        subprocess.run(["git", "--git-dir", str(repo), "archive", "--format=tar", commit], stdout=tf, check=True)
        tf.seek(0)
        with tarfile.open(fileobj=tf) as tar:
            extract_tree(tar, dest, f"{url}@{commit}")
    shutil.rmtree(repo)


def extract_tree(tar: tarfile.TarFile, dest: Path, what: str) -> None:
    """Unpack a git tree (runtime.unpack's checks; links kept as links, never followed)."""
    try:
        unpack.extract_tar(tar, dest, what, keep_links=True)
    except unpack.MemberRefused as exc:
        raise SourceFailed(str(exc)) from None


def _what(args: argparse.Namespace) -> str:
    return f"{args.git}@{args.commit}" if args.git else f"{args.url} (sha256 {', '.join(h[:12] for h in args.sha256)})"


def _unpack(archive: Path, dest: Path) -> None:
    """An archive of wheels or an sdist: files and directories only (runtime.unpack)."""
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                unpack.extract_zip(zf, dest, archive.name)
        else:
            with tarfile.open(archive) as tar:
                unpack.extract_tar(tar, dest, archive.name)
    except unpack.MemberRefused as exc:
        raise SourceFailed(str(exc)) from None


def _archive_tree(args: argparse.Namespace, work: Path) -> Path:
    """A source archive (an sdist) as the tree: its one top-level directory, unpacked from the checked file."""
    archive, _ = _staged_file(args, "source archive")
    _unpack(archive, work)
    tops = list(work.iterdir())
    return tops[0] if len(tops) == 1 and tops[0].is_dir() else work


def _tree(args: argparse.Namespace, work: Path) -> Path:
    """A writable copy of the pinned tree at `work`."""
    if not args.git:
        return _archive_tree(args, work)
    staged = args.sources_dir / args.component
    marker = staged / MARKER
    if marker.is_file():
        meta = json.loads(marker.read_text())
        if meta.get("commit") != args.commit or meta.get("git") != args.git:
            raise SourceFailed(f"staged tree is {meta.get('git')}@{meta.get('commit')}, not the pinned "
                               f"{args.git}@{args.commit}; re-run `trainbox image build`")
        shutil.copytree(staged, work, symlinks=True, ignore=shutil.ignore_patterns(MARKER))
    else:
        _git_fetch(args.git, args.commit, work)
    return work


def _patch(args: argparse.Namespace, tree: Path) -> list[dict]:
    if not args.patches:
        return []
    patches = apply_patches.load_series(args.patches)
    for p in patches:
        m = apply_patches.GIT_REF_RE.match(p.upstream_ref or "")
        if m and m.group("commit") != args.commit:
            raise SourceFailed(f"patch {p.name} was made against commit {m.group('commit')}, not the pinned "
                               f"{args.commit}; rebase it with `trainbox patches edit {args.component}`")
    results = apply_patches.apply_series(patches, tree)
    bad = next((r for r in results if not r.ok), None)
    if bad is not None:
        raise SourceFailed(f"patch {bad.name} does not apply to {args.git}@{args.commit}: {bad.describe()}")
    for r in results:
        print(f"{args.component}: {r.name}: {r.describe()}")
    return [{"file": p.name, "sha256": p.sha256} for p in patches]


def _purelib() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _pinned(args: argparse.Namespace) -> bool:
    """Whether the build gets the lock's hash-pinned build requirements (installed here or in a step before)."""
    return bool(args.build_req or args.build_env)


def _build_env(args: argparse.Namespace, tmp: Path) -> tuple[list[str], dict | None]:
    """pip wheel's flags and environment. With --build-req (the lock's hash-pinned PEP 518 requirements) the
    build environment holds exactly those, installed --require-hashes, and pip builds without isolation in it:
    an isolated build would install whatever version of setuptools the wheelhouse or index offers, unchecked
    (a setuptools-99 wheel added to a wheelhouse ran its code). Without a lock: pip's own isolation."""
    if not args.build_isolation:
        return ["--no-build-isolation"], None
    if not _pinned(args):
        return [], None
    return ["--no-build-isolation", "--use-pep517", "--check-build-dependencies"], _pinned_build_env(args, tmp)


def _pinned_build_env(args: argparse.Namespace, tmp: Path, base: dict | None = None) -> dict:
    """The environment with the lock's hash-pinned build requirements (--build-req) installed --require-hashes
    into their own directory, first on PYTHONPATH (before the venv's own site-packages). With --build-env that
    directory was filled by a `--mode build-env` step before this one (which alone saw the index credentials)."""
    if args.build_env:
        if not args.build_env.is_dir():
            raise SourceFailed(f"--build-env {args.build_env}: no such directory; the `--mode build-env` step "
                               "before this one installs the build requirements there")
        return dict(base or os.environ, PYTHONPATH=str(args.build_env))
    env_dir = tmp / "build-env"
    _install_build_reqs(args.build_req, tmp, env_dir)
    return dict(base or os.environ, PYTHONPATH=str(env_dir))


def _install_build_reqs(lines: list[str], tmp: Path, env_dir: Path) -> None:
    reqs = tmp / "build-requirements.txt"
    reqs.write_text("".join(line + "\n" for line in lines))
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--require-hashes", "--no-compile",
          "--disable-pip-version-check", "--target", str(env_dir), "-r", str(reqs)],
         "installing the hash-pinned build requirements")


def _build_wheel(args: argparse.Namespace, tree: Path, tmp: Path, out: Path) -> Path:
    """The one wheel built from the (patched) tree into `out`, its version checked against the pin."""
    src = tree / args.subdir if args.subdir else tree
    flags, env = _build_env(args, tmp)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", *flags, "-w", str(out),
          str(src)], f"building a wheel from {args.git}@{args.commit}", env=env)
    return _one_wheel(args, out, f"building a wheel from {args.git}@{args.commit}")


def _one_wheel(args: argparse.Namespace, where: Path, what: str) -> Path:
    wheels = sorted(where.glob("*.whl"))
    if len(wheels) != 1:
        raise SourceFailed(f"{what} gave {len(wheels)} wheels")
    version = wheels[0].name.split("-")[1]
    if args.version and version != args.version:
        raise SourceFailed(f"the tree at {args.commit} builds version {version}, but the stack says "
                           f"version: {args.version}")
    return wheels[0]


def _install_wheel(args: argparse.Namespace, wheel: Path) -> None:
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
          str(wheel)], f"installing {wheel.name}")
    # what pip records for `pip install NAME @ git+URL@COMMIT` (PEP 610): doctor compares the commit
    dist, version = wheel.name.split("-")[:2]
    info = next(_purelib().glob(f"{dist}-{version}.dist-info"), None)
    if info is not None:
        (info / "direct_url.json").write_text(json.dumps(
            {"url": args.git, "vcs_info": {"vcs": "git", "commit_id": args.commit}}) + "\n")
    print(f"{args.component}: installed {wheel.name} built from {args.git}@{args.commit}")


#: What `needs:` names, and how the builder shows it has it (the toolkit of a CANN or CUDA devel base).
TOOLKITS = {
    "cann-toolkit": ("ASCEND_TOOLKIT_HOME", npu.TOOLKIT_SET_ENV),
    "cuda-toolkit": ("CUDA_HOME", (nvidia.NVCC,)),
}


def _missing_toolkits(needs: list[str]) -> list[str]:
    missing = []
    for name in needs:
        var, paths = TOOLKITS[name]
        home = os.environ.get(var)
        if not (home and os.path.isdir(home)) and not any(os.path.exists(p) for p in paths):
            missing.append(f"{name} (no ${var}, none of {', '.join(paths)})")
    return missing


def _install_built(args: argparse.Namespace, tree: Path, tmp: Path) -> None:
    """A component its own commands build (kernels against CANN or CUDA, an sdist with its own pyproject): the
    commands, then its wheels. With --build-req the commands' pip builds without isolation in exactly the lock's
    hash-pinned build requirements (on PYTHONPATH), so nothing unpinned is fetched."""
    missing = _missing_toolkits(args.needs)
    if missing:
        raise SourceFailed(f"needs {', '.join(missing)} in the builder; build it FROM a base that has the toolkit "
                           "(a substitute base leaves it out, and the manifest says so)")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if _pinned(args):
        env = _pinned_build_env(args, tmp, env)
        # ... and the commands' pip builds in it, not in an isolated environment filled from an index. pip reads
        # PIP_NO_BUILD_ISOLATION as the value of its `build_isolation` setting: "false" turns isolation off.
        # Without --build-req (no fresh lock) the commands build as written (pip's own isolation).
        env.update(PIP_NO_BUILD_ISOLATION="false", PIP_CHECK_BUILD_DEPENDENCIES="true")
    for cmd in args.build:
        print(f"{args.component}: $ {cmd}", flush=True)
        _run(["bash", "-euo", "pipefail", "-c", cmd], f"`{cmd}`", cwd=tree, env=env)
    wheels = sorted(str(p) for p in tree.glob(args.wheels))
    if not wheels:
        raise SourceFailed(f"the build commands left no wheel matching {args.wheels!r} in the tree")
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
          *wheels], f"installing the wheels built from {_what(args)}")
    print(f"{args.component}: installed {', '.join(Path(w).name for w in wheels)} built from {_what(args)}")


def _install_tree(args: argparse.Namespace, tree: Path, applied: list[dict]) -> None:
    dest = args.tree_root / args.component
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(tree), str(dest))
    (dest / MARKER).write_text(json.dumps({"git": args.git, "commit": args.commit, "patches": applied},
                                          sort_keys=True) + "\n")
    path = dest / args.subdir if args.subdir else dest
    (_purelib() / f"trainbox-src-{args.component}.pth").write_text(f"{path}\n")
    print(f"{args.component}: {args.git}@{args.commit} at {path} (on sys.path)")


def _staged_file(args: argparse.Namespace, what: str, tmp: Path | None = None) -> tuple[Path, str]:
    """The one file the host staged for this component (an sdist with nothing staged, in a plain `docker build`:
    downloaded here, given `tmp`), checked against the pinned sha256(s) before anything uses it."""
    staged = args.sources_dir / args.component
    files = [p for p in staged.iterdir() if p.name != MARKER] if staged.is_dir() else []
    if not files and tmp is not None and args.dist:
        files = _download_sdist(args, tmp)
    if len(files) != 1:
        raise SourceFailed(f"no staged {what} in {staged}; build with `trainbox image build` (it fetches it)")
    got = hashlib.sha256(files[0].read_bytes()).hexdigest()
    if got not in args.sha256:
        raise SourceFailed(f"{files[0].name} has sha256 {got}, the pin says {', '.join(args.sha256)}")
    return files[0], got


def _download_sdist(args: argparse.Namespace, tmp: Path) -> list[Path]:
    """name==version's sdist from the index pip is configured with (PIP_INDEX_URL / PIP_FIND_LINKS); hashed by
    the caller. Its metadata is read against the venv (no build isolation), as the build will be."""
    out = tmp / "sdist"
    flags = [] if args.build_isolation else ["--no-build-isolation"]
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
          *flags, "-d", str(out), f"{args.dist}=={args.version}"], f"downloading {args.dist}=={args.version}")
    return sorted(out.iterdir())


def _install_sdist(args: argparse.Namespace, tmp: Path) -> None:
    """An sdist that compiles against the base's toolkit (Transformer Engine's PyTorch binding and nvcc)."""
    sdist, got = _staged_file(args, "sdist", tmp)
    missing = _missing_toolkits(args.needs)
    if missing:
        raise SourceFailed(f"needs {', '.join(missing)} in the builder; build it FROM a base that has the toolkit "
                           "(a substitute base leaves it out, and the manifest says so)")
    flags = [] if args.build_isolation else ["--no-build-isolation"]
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
          *flags, str(sdist)], f"building and installing {sdist.name}")
    print(f"{args.component}: built and installed {sdist.name} (sha256 {got[:12]})")


def _install_archive(args: argparse.Namespace, tmp: Path) -> None:
    archive, got = _staged_file(args, "archive")
    unpacked = tmp / "archive"
    _unpack(archive, unpacked)
    wheels = sorted(str(p) for p in unpacked.rglob("*.whl"))
    if not wheels:
        raise SourceFailed(f"{archive.name} holds no wheels")
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
          *wheels], f"installing the wheels of {archive.name}")
    print(f"{args.component}: installed {len(wheels)} wheel(s) from {archive.name} (sha256 {got[:12]})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--component", required=True)
    ap.add_argument("--mode", choices=("pip", "tree", "archive", "build", "sdist", "build-env"), required=True)
    ap.add_argument("--git")
    ap.add_argument("--url", help="--mode build: the source archive's URL (its staged copy is checked by --sha256)")
    ap.add_argument("--commit")
    ap.add_argument("--sha256", action="append", default=[], help="archive, sdist: a pinned sha256 of the file")
    ap.add_argument("--subdir")
    ap.add_argument("--version")
    ap.add_argument("--dist", help="sdist: the distribution name (downloaded by pip when nothing is staged)")
    ap.add_argument("--patches", type=Path, help="series directory to apply before building")
    ap.add_argument("--no-build-isolation", dest="build_isolation", action="store_false")
    ap.add_argument("--build-req", action="append", default=[], metavar="LINE",
                    help="--mode pip, build: a hash-pinned build requirement (`name==version --hash=sha256:...`)")
    ap.add_argument("--build-env", type=Path, metavar="DIR",
                    help="--mode build-env: where to install the --build-req lines; --mode pip, build: where a "
                    "build-env step installed them")
    ap.add_argument("--wheel-out", type=Path, metavar="DIR",
                    help="--mode pip: build the wheel into DIR and stop (a stage of its own builds it beside the "
                    "venv's pins)")
    ap.add_argument("--wheel-in", type=Path, metavar="DIR",
                    help="--mode pip: install the one wheel in DIR (built by --wheel-out in another stage)")
    ap.add_argument("--build", action="append", default=[], metavar="CMD", help="--mode build: a build command")
    ap.add_argument("--wheels", default="dist/*.whl", help="--mode build: the wheels it leaves (glob in the tree)")
    ap.add_argument("--needs", action="append", default=[], choices=sorted(TOOLKITS),
                    help="--mode build, sdist: a toolkit the builder must have")
    ap.add_argument("--sources-dir", type=Path, default=Path("/tmp/trainbox/sources"))
    ap.add_argument("--tree-root", type=Path, default=Path("/opt/src"))
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix=f"trainbox-src-{args.component}-"))
    try:
        if args.mode == "build-env":
            if not (args.build_env and args.build_req):
                raise SourceFailed("--mode build-env takes --build-env DIR and the --build-req lines to install")
            _install_build_reqs(args.build_req, tmp, args.build_env)
            print(f"{args.component}: {len(args.build_req)} hash-pinned build requirement(s) in {args.build_env}")
            return 0
        if args.mode == "archive":
            _install_archive(args, tmp)
            return 0
        if args.mode == "sdist":
            _install_sdist(args, tmp)
            return 0
        if args.mode == "pip" and args.wheel_in:
            _install_wheel(args, _one_wheel(args, args.wheel_in, f"--wheel-in {args.wheel_in}"))
            return 0
        tree = _tree(args, tmp / "tree")
        applied = _patch(args, tree)
        if args.mode == "pip" and args.wheel_out:
            wheel = _build_wheel(args, tree, tmp, args.wheel_out)
            print(f"{args.component}: built {wheel.name} from {args.git}@{args.commit} into {args.wheel_out}")
        elif args.mode == "pip":
            _install_wheel(args, _build_wheel(args, tree, tmp, tmp / "wheel"))
        elif args.mode == "build":
            _install_built(args, tree, tmp)
        else:
            _install_tree(args, tree, applied)
    except (SourceFailed, apply_patches.PatchError, OSError) as exc:
        first, _, rest = str(exc).partition("\n")
        print(f"{PROG}: error: {args.component}: {first}", file=sys.stderr)
        if rest:
            print(rest, file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
