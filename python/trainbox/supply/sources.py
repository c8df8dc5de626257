"""Pinned upstream sources, fetched once into a cache and unpacked into scratch trees (host module).

A pin is exact: a PyPI distribution by version *and* sha256 (any of the artifacts the stack pins, wheel or
sdist), a git repository by 40-hex commit, or a URL by sha256. Artifacts land in
$TRAINBOX_CACHE/sources/sha256/<hex>/<filename> only after their hash matched (download to a temporary
directory, verify, rename), so the cache never holds a partial or unverified file; git repositories are
kept as bare mirrors under $TRAINBOX_CACHE/sources/git/. Everything already cached is used without the network.

This module knows how to fetch (from an index, a git repository, a URL); trainbox.supply.fetch picks the way for a
pin by its `source:` (`fetch`, `pin_from_component`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Iterable

from ..specs.kinds import COMMIT_RE
from ..specs.dists import is_dist_of, sha256_file, wheel_tags
from ..runtime.errors import TrainboxError
from ..runtime.unpack import MemberRefused, extract_tar, extract_zip
from .gitobjects import ObjectError, tree_of, verify_tree
from .index import project_files, ssl_context
from .pins import DEFAULT_INDEX, Fetched, Pin
from .. import paths

SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")


class SourceError(TrainboxError):
    """A pinned source that cannot be fetched or does not match its pin."""


def index_url(name: str, indexes: dict[str, str] | None) -> str:
    """The URL of the index a stack names (`indexes:`, or pypi with a pip-style override); a URL as is."""
    if "://" in name:
        return name
    if indexes and name in indexes:
        return indexes[name]
    if name == "pypi":
        # honour a pip-style override (mirrors, air-gapped proxies) for the default index
        from .pipconfig import pip_config

        pip_index = pip_config().index_url()  # PIP_INDEX_URL or pip config's index-url, as pip takes it
        return os.environ.get("TRAINBOX_PYPI_URL") or (pip_index.value if pip_index else None) or DEFAULT_INDEX
    raise SourceError(f"index {name!r} is not defined under the stack's `indexes`")


# ---------------------------------------------------------------------------------------------------------
# cache


def _cache(cache_dir: Path | None) -> Path:
    return Path(cache_dir or paths.cache_dir()) / "sources"


def cached_artifact(sha256: str, cache_dir: Path | None = None) -> Path | None:
    """The cached file with this hash, re-checked; a corrupt entry is dropped."""
    d = _cache(cache_dir) / "sha256" / sha256
    if not d.is_dir():
        return None
    files = [p for p in d.iterdir() if p.is_file()]
    if len(files) == 1 and sha256_file(files[0]) == sha256:
        return files[0]
    shutil.rmtree(d, ignore_errors=True)
    return None


def download_to_cache(url: str, sha256: str, filename: str, cache_dir: Path | None, what: str) -> Path:
    """Download into the cache atomically: temp dir, hash while writing, verify, rename into place."""
    root = _cache(cache_dir) / "sha256"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    try:
        dest = tmp / filename
        h = hashlib.sha256()
        req = urllib.request.Request(url, headers={"User-Agent": "trainbox"})
        ctx = ssl_context() if url.startswith("https:") else None
        try:
            with urllib.request.urlopen(req, timeout=120, context=ctx) as resp, open(dest, "wb") as out:
                for chunk in iter(lambda: resp.read(1 << 20), b""):
                    h.update(chunk)
                    out.write(chunk)
        except urllib.error.HTTPError as exc:
            raise SourceError(f"{what}: download of {url} failed: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise SourceError(f"{what}: download of {url} failed: {getattr(exc, 'reason', exc)}") from None
        got = h.hexdigest()
        if got != sha256:
            raise SourceError(
                f"{what}: {filename} from {url} has sha256 {got}, but the pin says {sha256}; the artifact "
                "changed upstream or the pin is wrong: check it and fix the stack's sha256 (nothing was cached)"
            )
        final = root / sha256
        try:
            os.rename(tmp, final)
        except OSError:
            if cached_artifact(sha256, cache_dir) is None:  # someone else won the race with a bad copy
                raise
        return final / filename
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# PyPI


def _rank(filename: str) -> tuple:
    """Preferred artifact: a pure wheel, then a wheel for this interpreter, other wheels, then the sdist."""
    from packaging.tags import sys_tags

    if not filename.endswith(".whl"):
        return (3, filename)
    tags = wheel_tags(filename)
    if not tags:
        return (3, filename)
    if any(t.platform == "any" and t.abi == "none" for t in tags):
        return (0, filename)
    return (1 if tags & set(sys_tags()) else 2, filename)


def _from_pip_links(pin: Pin, cache_dir: Path | None, what: str) -> Fetched | None:
    """The pinned file where pip itself would find it on this disk (its find-links directories, its file://
    indexes), copied into the cache and re-hashed on the way, as a download is."""
    from .pipconfig import find_local

    hit = find_local(pin.name, pin.version or "", pin.sha256)
    if hit is None:
        return None
    path, where = hit
    sha = sha256_file(path, remember=True)
    cached = download_to_cache(path.resolve().as_uri(), sha, path.name, cache_dir, f"{what} from {where}")
    return Fetched(pin, cached, path.name, sha256=sha)


def fetch_pypi(pin: Pin, prefer: Iterable[str], offline: bool, cache_dir: Path | None) -> Fetched:
    what = f"{pin.key} ({pin.ref})"
    if not pin.sha256:
        raise SourceError(
            f"{what}: no sha256 pinned, so there is nothing to check the download against; add `sha256:` to the "
            "component in the stack file or run `trainbox stack lock` to record the artifacts' hashes"
        )
    prefer = [h for h in prefer if h in pin.sha256]
    cached = []
    for h in pin.sha256:
        path = cached_artifact(h, cache_dir)
        if path is not None and is_dist_of(path.name, pin.name, pin.version or ""):
            cached.append((h not in prefer, _rank(path.name), h, path))
    if cached:
        _, _, h, path = min(cached)
        return Fetched(pin, path, path.name, sha256=h)
    local = _from_pip_links(pin, cache_dir, what)
    if local is not None:
        return local
    if offline:
        raise SourceError(f"{what}: not in the cache ({_cache(cache_dir)}) and --offline was given; run once "
                          "with network access to fill the cache")
    files = project_files(pin.index_name, pin.index_url, pin.name)
    candidates = []
    listed = []
    for f in files:
        fn = f.get("filename", "")
        sha = (f.get("hashes") or {}).get("sha256")
        if not is_dist_of(fn, pin.name, pin.version or ""):
            continue
        listed.append(fn)
        if sha in pin.sha256:
            url = urllib.parse.urljoin(f"{pin.index_url.rstrip('/')}/{pin.name}/", f["url"])
            candidates.append((sha not in prefer, _rank(fn), sha, fn, url))
    if not candidates:
        if not listed:
            raise SourceError(f"{what}: index {pin.index_name!r} ({pin.index_url}) has no files for version "
                              f"{pin.version}; check the version")
        raise SourceError(
            f"{what}: none of the {len(listed)} files of {pin.ref} on {pin.index_url} has a pinned sha256 "
            f"({', '.join(h[:12] for h in pin.sha256)}); the pin's hashes belong to another version or "
            "artifact: fix the stack's sha256 or re-run `trainbox stack lock`"
        )
    _, _, sha, fn, url = min(candidates)
    path = download_to_cache(url, sha, fn, cache_dir, what)
    return Fetched(pin, path, fn, sha256=sha)


# ---------------------------------------------------------------------------------------------------------
# git


# Transports the fetcher lets git use (unless the user's environment says otherwise): no ext:: (runs a
# command), no unauthenticated git:// or http://. A local path counts as file.
GIT_PROTOCOLS = "https:ssh:file"


def run_git(*args: str, cwd: Path | None = None, check: bool = True, user_config: bool = True,
            env: dict[str, str] | None = None, stdout=None,
            error: type[TrainboxError] = SourceError) -> subprocess.CompletedProcess:
    """The one way trainbox runs git: the user's own git, never a prompt, C locale, output captured (stdout: a
    file to write it to instead); a failure raises `error` naming the command and git's message.

    user_config (fetching): the user's configuration (insteadOf mirrors, credential helpers, proxies), and only
    the transports in GIT_PROTOCOLS unless the environment sets its own. Without it (the patch workspaces):
    neither the user's nor the system's configuration, so no ~/.gitconfig shapes an exported patch, and no outer
    GIT_DIR/GIT_WORK_TREE/GIT_INDEX_FILE. `env`: more variables (fixed authors and dates)."""
    full = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    if user_config:
        full.setdefault("GIT_ALLOW_PROTOCOL", GIT_PROTOCOLS)
    else:
        full.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
        for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
            full.pop(k, None)
    full.update(env or {})
    proc = subprocess.run(["git", *args], cwd=cwd, text=True, env=full, stdout=stdout or subprocess.PIPE,
                          stderr=subprocess.PIPE)
    if check and proc.returncode != 0:
        where = f" in {cwd}" if cwd else ""
        raise error(f"git {' '.join(args)}{where} failed: {(proc.stderr or proc.stdout or '').strip()}")
    return proc


def _has_commit(repo: Path, commit: str) -> bool:
    return run_git("--git-dir", str(repo), "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0


def git_cache_repo(url: str, cache_dir: Path | None = None) -> Path:
    """The bare repository that holds the fetched commits of `url` (one per URL as the stack spells it)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", url.rstrip("/").rsplit("/", 1)[-1]).strip("-") or "repo"
    return _cache(cache_dir) / "git" / f"{slug}-{hashlib.sha256(url.encode()).hexdigest()[:12]}.git"


def _git_reason(text: str) -> str:
    """git's own reason: its first `fatal:`/`error:` line (the lines after it are consequences and advice)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    told = [ln for ln in lines if ln.startswith(("fatal:", "error:"))]
    return (told or lines[-1:] or ["no output"])[0]


def fetch_git(pin: Pin, offline: bool, cache_dir: Path | None) -> Fetched:
    """The pinned commit, fetched by id (depth 1) into the cache and verified: FETCH_HEAD must be it."""
    what = f"{pin.key} ({pin.git}@{pin.commit})"
    if not pin.commit or not COMMIT_RE.match(pin.commit):
        raise SourceError(f"{what}: a git component needs an exact `commit` (40 hex digits), not only a ref")
    repo = git_cache_repo(pin.git, cache_dir)
    if repo.is_dir() and _has_commit(repo, pin.commit):
        return Fetched(pin, repo, repo.name, commit=pin.commit)
    if offline:
        raise SourceError(f"{what}: commit is not in the cache ({repo}) and the build is offline; run "
                          "`trainbox fetch` where the repository answers")
    if not repo.is_dir():
        repo.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=repo.parent))
        try:
            run_git("init", "--quiet", "--bare", str(tmp / "r.git"))
            with contextlib.suppress(OSError):
                os.rename(tmp / "r.git", repo)  # a concurrent fetch may have made it first
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    with _repo_lock(repo):
        if _has_commit(repo, pin.commit):  # a concurrent fetch brought it while this one waited
            return Fetched(pin, repo, repo.name, commit=pin.commit)
        # the URL after `--`, so that a URL starting with "-" can never be read as an option
        proc = run_git("--git-dir", str(repo), "fetch", "--quiet", "--no-tags", "--depth", "1", "--", pin.git,
                       pin.commit, check=False)
        return _fetched_commit(pin, repo, proc, what)


@contextlib.contextmanager
def _repo_lock(repo: Path):
    """One fetch into a cached repository at a time, on a lock of our own: flock, which the kernel releases when
    its holder dies. Held, it also proves that git's own lock files there are left by a killed fetch (git
    refused every later fetch with `shallow.lock: File exists`): they are removed."""
    import fcntl

    with open(repo.parent / f".{repo.name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        for stale in ("shallow.lock", "packed-refs.lock", "FETCH_HEAD.lock", "config.lock"):
            (repo / stale).unlink(missing_ok=True)
        yield


def _fetched_commit(pin: Pin, repo: Path, proc: subprocess.CompletedProcess, what: str) -> Fetched:
    if proc.returncode != 0:
        err = _git_reason(proc.stderr or proc.stdout)
        if "not our ref" in err or "couldn't find remote ref" in err or "no such remote ref" in err:
            raise SourceError(f"{what}: the repository has no commit {pin.commit}; check `commit:` (git said: {err})")
        raise SourceError(f"{what}: cannot fetch from {pin.git}: {err}")
    got = run_git("--git-dir", str(repo), "rev-parse", "FETCH_HEAD").stdout.strip()
    if got != pin.commit:
        raise SourceError(f"{what}: fetched {got}, not the pinned commit; check `commit:` and the mirror")
    # keep it reachable so that git gc in the cache does not drop it
    run_git("--git-dir", str(repo), "update-ref", f"refs/trainbox/{pin.commit}", pin.commit)
    return Fetched(pin, repo, repo.name, commit=pin.commit)


def tree_id(fetched: Fetched) -> str:
    """git's tree hash of the fetched commit: names the exact file contents, recorded in the manifest. Read from
    the commit object after re-hashing it (replace refs and grafts ignored): it is the pinned commit's own tree."""
    try:
        return tree_of(fetched.path, fetched.commit)
    except ObjectError as exc:
        raise SourceError(f"{fetched.pin.key} ({fetched.pin.git}@{fetched.commit}): {exc}") from None


def verified_tree_id(fetched: Fetched, dest: Path | None = None) -> str:
    """The tree id, after checking every object under the commit against its name (the cache re-verified on use:
    a rewritten object or a replace ref in the cached repository is refused, never reported fine). With `dest`,
    the tree is also written there from those checked objects."""
    try:
        return verify_tree(fetched.path, fetched.commit, dest)
    except ObjectError as exc:
        raise SourceError(f"{fetched.pin.key} ({fetched.pin.git}@{fetched.commit}): {exc}; remove {fetched.path} "
                          "and fetch again") from None


def fetch_url(pin: Pin, offline: bool, cache_dir: Path | None) -> Fetched:
    what = f"{pin.key} ({pin.url})"
    if len(pin.sha256) != 1:
        raise SourceError(f"{what}: a url source needs exactly one sha256 to be fetched")
    sha = pin.sha256[0]
    path = cached_artifact(sha, cache_dir)
    if path is None:
        if offline:
            raise SourceError(f"{what}: not in the cache and the build is offline; run `trainbox fetch` first")
        name = urllib.parse.unquote(urllib.parse.urlparse(pin.url).path.rsplit("/", 1)[-1]) or "download"
        path = download_to_cache(pin.url, sha, name, cache_dir, what)
    return Fetched(pin, path, path.name, sha256=sha)


# ---------------------------------------------------------------------------------------------------------
# unpack


def _strip_single_top(dest: Path) -> None:
    entries = list(dest.iterdir())
    if len(entries) == 1 and entries[0].is_dir():
        top = entries[0]
        hold = dest.parent / f".{dest.name}.top"
        os.rename(top, hold)
        dest.rmdir()
        os.rename(hold, dest)


def unpack(fetched: Fetched, dest: Path) -> Path:
    """Unpack the source tree patches apply to into `dest` (which must not exist).

    wheel: its contents, i.e. the installed package tree (megatron/core/...); sdist or archive: the tree
    under its single top directory; git: the commit's tree. On any error nothing is left at `dest`.
    """
    dest = Path(dest)
    if dest.exists():
        raise SourceError(f"{dest}: already exists; unpack needs a fresh directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir()
    try:
        if fetched.commit:
            # the pinned commit's tree, written from objects each checked against its name: a replace ref, a
            # graft or a rewritten object in the repository is refused, never staged
            verified_tree_id(fetched, part)
        elif fetched.filename.endswith((".whl", ".zip")):
            with zipfile.ZipFile(fetched.path) as zf:
                extract_zip(zf, part, fetched.filename)
            if not fetched.filename.endswith(".whl"):
                _strip_single_top(part)
        elif fetched.filename.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")):
            with tarfile.open(fetched.path) as tar:
                extract_tar(tar, part, fetched.filename)
            _strip_single_top(part)
        else:
            raise SourceError(f"{fetched.filename}: unknown archive type; patches need a wheel, sdist, tar or zip")
        os.rename(part, dest)
    except BaseException as exc:
        shutil.rmtree(part, ignore_errors=True)
        if isinstance(exc, MemberRefused):
            raise SourceError(str(exc)) from None
        raise
    return dest
