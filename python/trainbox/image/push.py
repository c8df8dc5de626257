"""`trainbox image push`: a built image out of the build host, named by the digest the registry gave it (host module).

The stack's content-hash tag (trainbox/STACK:HASH) is tagged REG/trainbox/STACK:HASH and pushed with the `docker`
SDK (its push stream carries per-layer progress, typed errors and, at the end, the manifest digest the registry
stored). The digest is recorded in the build report (`pushed`); the engine keeps it in the image's RepoDigests,
which `image ls` shows and from which the cluster targets name REG/trainbox/STACK@sha256:... (launch.images.pinned).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ..yamlfile import json_loads
from ..runtime.errors import TrainboxError

# host[:port] with an optional path below it (a project or namespace): what `docker push` accepts before the name
REGISTRY_RE = re.compile(r"^(localhost|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+|\[[0-9a-fA-F:]+\]|[A-Za-z0-9-]+:\d+)"
                         r"(:\d{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
HASH_TAG_RE = re.compile(r"^trainbox/(?P<stack>[^:/]+):(?P<hash>[0-9a-f]{12})$")
# the tag of the manifest list `image push --platform A,B` writes: multiarch-<hash of its images' tags>
LIST_TAG_PREFIX = "multiarch-"
# the longest repository name (registry and path included) a reference may have: distribution's reference grammar
# (NameTotalLengthMax); the engine refuses a longer one with an HTTP 500 and a URL-sized message
NAME_MAX = 255


class PushFailed(TrainboxError):
    """The registry (or the engine on its way there) refused or lost the push: a check that failed, exit 1, as
    `image build` exits when the build fails. Bad input (a registry that is no registry name, no image built, no
    engine) stays exit 2."""

    exit_code = 1


@dataclass
class Pushed:
    stack: str
    source: str  # the local content-hash tag
    tag: str  # REG/trainbox/STACK:HASH
    digest: str  # sha256:... of the manifest the registry stored
    ref: str  # REG/trainbox/STACK@sha256:..., what every node pulls
    image_id: str
    pushed_at: str

    def as_dict(self) -> dict:
        return asdict(self)


def check_registry(registry: str) -> str:
    reg = registry.strip().rstrip("/")
    if reg.startswith(("http://", "https://")) or not REGISTRY_RE.match(reg):
        raise TrainboxError(f"--registry {registry!r}: expected a registry host[:port], optionally with a path, "
                            "e.g. registry.example.com:5000/ml (no scheme, no image name)")
    return reg


def sdk():
    """A `docker` SDK client for the engine the CLI talks to (DOCKER_HOST etc. from the environment)."""
    try:
        import docker
    except ImportError:
        raise TrainboxError("the `docker` Python package is missing: pip install 'trainbox[build]'") from None
    try:
        api = docker.from_env(timeout=600)
        api.ping()
    except docker.errors.DockerException as exc:
        raise TrainboxError(f"no Docker engine answers through the docker SDK ({exc}); "
                            "bash ci/ensure-docker.sh starts one") from None
    return api


def report_path(stack: str, platform: str | None = None) -> Path:
    """The build report `image build` writes for the stack on `platform` (None: the plain one, linux/amd64)."""
    from .. import paths
    from ..specs.platforms import tag_suffix

    return paths.REPORTS_DIR / f"{stack}{tag_suffix(platform) if platform else ''}.json"


def _tag_re(platform: str | None):
    """The content-hash tag of the stack's image for `platform` (trainbox/STACK:HASH, or ...:HASH-arm64)."""
    if not platform:
        return HASH_TAG_RE
    from ..specs.platforms import tag_suffix

    return re.compile(HASH_TAG_RE.pattern.rstrip("$") + re.escape(tag_suffix(platform)) + "$")


def _read_report(path: Path) -> dict | None:
    try:
        return json_loads(path.read_text())
    except (OSError, ValueError):
        return None


def source_tag(stack: str, api, report: dict | None, platform: str | None = None) -> str:
    """The stack's content-hash tag (for `platform`: with its suffix): the build report's, else the newest such
    tag in the engine."""
    import docker

    tag_re = _tag_re(platform)
    tag = (report or {}).get("tag")
    if tag and tag_re.match(tag):
        try:
            api.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
    images = api.images.list(name=f"trainbox/{stack}", filters={"label": f"io.trainbox.stack={stack}"})
    images.sort(key=lambda i: i.attrs.get("Created") or "", reverse=True)
    for img in images:
        for t in sorted(img.tags):
            if tag_re.match(t):
                return t
    for_plat = f" --platform {platform}" if platform else ""
    raise TrainboxError(f"image push {stack}: no trainbox/{stack}:<content hash> image{for_plat and ' for ' + platform} "
                        f"here; build it first: trainbox image build {stack}{for_plat}")


def _stream(lines, say: Callable[[str], None]) -> str:
    """Follow the push stream: one line per layer state change (not every byte count); the manifest digest."""
    digest, seen = "", {}
    for msg in lines:
        if msg.get("error") or msg.get("errorDetail"):
            raise PushFailed(f"push failed: {msg.get('error') or (msg.get('errorDetail') or {}).get('message')}")
        aux = msg.get("aux") or {}
        if aux.get("Digest"):
            digest = aux["Digest"]
        layer, status = msg.get("id"), msg.get("status") or ""
        if layer and status and status != "Pushing" and seen.get(layer) != status:
            seen[layer] = status
            say(f"  {layer}: {status}")
    if not digest.startswith("sha256:"):
        raise PushFailed("push: the registry answered without a manifest digest")
    return digest


def record(pushed: Pushed, path: Path) -> None:
    """Add the push to the build report (a list: one image may go to several registries)."""
    from .run import write_report

    report = _read_report(path)
    if report is None:
        return  # built elsewhere (or the report removed): the engine's RepoDigests still hold the digest
    entries = [p for p in report.get("pushed") or [] if p.get("ref") != pushed.ref]
    report["pushed"] = entries + [pushed.as_dict()]
    write_report(report, path)


def push(stack: str, registry: str, *, say: Callable[[str], None] = print, api=None,
         report: Path | None = None, platform: str | None = None) -> Pushed:
    import docker
    import requests

    reg = check_registry(registry)
    repo = f"{reg}/trainbox/{stack}"
    if len(repo) > NAME_MAX:
        raise TrainboxError(f"--registry {_short(registry)}: REG/trainbox/{stack} would be {len(repo)} characters "
                            f"long; an image name takes at most {NAME_MAX} (registry, path and name together)")
    api = api or sdk()
    path = report or report_path(stack, platform)
    source = source_tag(stack, api, _read_report(path), platform)
    image = api.images.get(source)
    digest_tag = source.split(":", 1)[1]
    with _tag_undone_on_failure(api, image, repo, digest_tag):
        say(f"pushing {repo}:{digest_tag} ({source}, {image.id[7:19]})")
        try:
            digest = _stream(api.api.push(repo, tag=digest_tag, stream=True, decode=True), say)
        except docker.errors.APIError as exc:
            raise PushFailed(f"push {repo}:{digest_tag}: {_one_line(exc.explanation or exc)}") from None
        except requests.exceptions.RequestException as exc:  # the engine's stream broke off or timed out
            raise PushFailed(f"push {repo}:{digest_tag}: the engine's answer broke off: {_one_line(exc)}") from None
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    pushed = Pushed(stack, source, f"{repo}:{digest_tag}", digest, f"{repo}@{digest}", image.id, now)
    record(pushed, path)
    return pushed


def _short(text: str, keep: int = 80) -> str:
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


def _one_line(exc) -> str:
    return " ".join(str(exc).split())


@contextlib.contextmanager
def _tag_undone_on_failure(api, image, repo: str, tag: str):
    """Tag `image` as repo:tag for the push; when the push fails (or is interrupted), the name is as it was: gone
    if it was not there, back on the image it named if it named another one (a push that did not happen moves
    no name)."""
    import docker

    ref = f"{repo}:{tag}"
    try:
        before = api.images.get(ref).id
    except docker.errors.ImageNotFound:
        before = None
    try:
        image.tag(repo, tag)
    except docker.errors.APIError as exc:
        raise PushFailed(f"push {_short(ref)}: the engine cannot tag {image.id[7:19]} with that name: "
                         f"{_short(_one_line(exc.explanation or exc), 300)}") from None
    try:
        yield
    except BaseException:
        if before is None:
            with contextlib.suppress(docker.errors.APIError):
                api.images.remove(ref, noprune=True)
        elif before != image.id:
            with contextlib.suppress(docker.errors.APIError):
                api.images.get(before).tag(repo, tag)
        raise


@dataclass
class PushedList:
    """A manifest list: one name for the stack's images of several platforms, each pushed first."""

    stack: str
    tag: str  # REG/trainbox/STACK:multiarch-...
    digest: str  # sha256:... of the list
    ref: str  # REG/trainbox/STACK@sha256:..., what every node pulls (its engine picks its platform)
    images: dict  # platform -> the Pushed of that platform's image, as a dict
    pushed_at: str

    def as_dict(self) -> dict:
        return asdict(self)


def push_platforms(stack: str, registry: str, platforms: list[str], *, say: Callable[[str], None] = print,
                   api=None, reports: dict[str, Path] | None = None, cli: str | None = None) -> PushedList:
    """Push the stack's image for each platform, then one manifest list naming them by digest (`docker manifest`:
    the SDK cannot write lists). Its tag is derived from the images' content-hash tags; its digest is recorded in
    each platform's build report (`manifest_lists`), from where the cluster targets name it."""
    import hashlib
    import subprocess

    reg = check_registry(registry)
    api = api or sdk()
    images = {p: push(stack, reg, say=say, api=api, platform=p, report=(reports or {}).get(p)) for p in platforms}
    key = hashlib.sha256("\n".join(images[p].source for p in sorted(images)).encode()).hexdigest()[:12]
    tag = f"{reg}/trainbox/{stack}:{LIST_TAG_PREFIX}{key}"
    # the CLI, unlike the engine, trusts no plain-HTTP registry by itself: 127.0.0.1 and localhost are local
    insecure = ["--insecure"] if reg.split("/")[0].split(":")[0] in ("127.0.0.1", "localhost") else []
    docker_cli = cli or _docker_cli()

    def run(*args: str) -> str:
        proc = subprocess.run([docker_cli, "manifest", *args], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise PushFailed(f"docker manifest {args[0]} {tag}: {(proc.stderr or proc.stdout).strip()}")
        return proc.stdout

    say(f"pushing the manifest list {tag} ({', '.join(sorted(images))})")
    try:
        run("create", "--amend", *insecure, tag, *(images[p].ref for p in platforms))
        out = run("push", "--purge", *insecure, tag)
    except BaseException:  # the list the client keeps locally until it is pushed goes too: no name left behind
        subprocess.run([docker_cli, "manifest", "rm", tag], capture_output=True, timeout=60)
        raise
    digest = next((w for w in out.split() if w.startswith("sha256:")), "")
    if not digest:
        raise PushFailed(f"docker manifest push {tag} answered without a digest: {out.strip()}")
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    listed = PushedList(stack, tag, digest, f"{reg}/trainbox/{stack}@{digest}",
                        {p: images[p].as_dict() for p in platforms}, now)
    for p in platforms:
        _record_list(listed, (reports or {}).get(p) or report_path(stack, p))
    return listed


def _docker_cli() -> str:
    from .engine import find_client

    return find_client().docker


def _record_list(listed: PushedList, path: Path) -> None:
    from .run import write_report

    report = _read_report(path)
    if report is None:
        return
    entries = [e for e in report.get("manifest_lists") or [] if e.get("ref") != listed.ref]
    report["manifest_lists"] = entries + [{"ref": listed.ref, "tag": listed.tag, "pushed_at": listed.pushed_at,
                                           "images": {p: i["ref"] for p, i in listed.images.items()}}]
    write_report(report, path)
