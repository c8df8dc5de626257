"""`trainbox image push`: a built image out of the build host, named by the digest the registry gave it (host module).

The stack's content-hash tag (trainbox/STACK:HASH) is tagged REG/trainbox/STACK:HASH and pushed with the `docker`
SDK (its push stream carries per-layer progress, typed errors and, at the end, the manifest digest the registry
stored). The digest is recorded in the build report (`pushed`); the engine keeps it in the image's RepoDigests,
which `image ls` shows and from which the cluster targets name REG/trainbox/STACK@sha256:... (launch.images.pinned).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from .runtime.errors import TrainboxError

# host[:port] with an optional path below it (a project or namespace): what `docker push` accepts before the name
REGISTRY_RE = re.compile(r"^(localhost|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+|\[[0-9a-fA-F:]+\]|[A-Za-z0-9-]+:\d+)"
                         r"(:\d{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
HASH_TAG_RE = re.compile(r"^trainbox/(?P<stack>[^:/]+):(?P<hash>[0-9a-f]{12})$")


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


def report_path(stack: str) -> Path:
    from .image import REPORTS_DIR

    return REPORTS_DIR / f"{stack}.json"


def _read_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def source_tag(stack: str, api, report: dict | None) -> str:
    """The stack's content-hash tag: the build report's, else the newest trainbox/STACK:HASH in the engine."""
    import docker

    tag = (report or {}).get("tag")
    if tag and HASH_TAG_RE.match(tag):
        try:
            api.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
    images = api.images.list(name=f"trainbox/{stack}", filters={"label": f"io.trainbox.stack={stack}"})
    images.sort(key=lambda i: i.attrs.get("Created") or "", reverse=True)
    for img in images:
        for t in sorted(img.tags):
            if HASH_TAG_RE.match(t):
                return t
    raise TrainboxError(f"image push {stack}: no trainbox/{stack}:<content hash> image here; "
                        f"build it first: trainbox image build {stack}")


def _stream(lines, say: Callable[[str], None]) -> str:
    """Follow the push stream: one line per layer state change (not every byte count); the manifest digest."""
    digest, seen = "", {}
    for msg in lines:
        if msg.get("error") or msg.get("errorDetail"):
            raise TrainboxError(f"push failed: {msg.get('error') or msg['errorDetail'].get('message')}")
        aux = msg.get("aux") or {}
        if aux.get("Digest"):
            digest = aux["Digest"]
        layer, status = msg.get("id"), msg.get("status") or ""
        if layer and status and status != "Pushing" and seen.get(layer) != status:
            seen[layer] = status
            say(f"  {layer}: {status}")
    if not digest.startswith("sha256:"):
        raise TrainboxError("push: the registry answered without a manifest digest")
    return digest


def record(pushed: Pushed, path: Path) -> None:
    """Add the push to the build report (a list: one image may go to several registries)."""
    from .buildrun import write_report

    report = _read_report(path)
    if report is None:
        return  # built elsewhere (or the report removed): the engine's RepoDigests still hold the digest
    entries = [p for p in report.get("pushed") or [] if p.get("ref") != pushed.ref]
    report["pushed"] = entries + [pushed.as_dict()]
    write_report(report, path)


def push(stack: str, registry: str, *, say: Callable[[str], None] = print, api=None,
         report: Path | None = None) -> Pushed:
    import docker

    reg = check_registry(registry)
    api = api or sdk()
    path = report or report_path(stack)
    source = source_tag(stack, api, _read_report(path))
    image = api.images.get(source)
    digest_tag = source.split(":", 1)[1]
    repo = f"{reg}/trainbox/{stack}"
    image.tag(repo, digest_tag)
    say(f"pushing {repo}:{digest_tag} ({source}, {image.id[7:19]})")
    try:
        digest = _stream(api.api.push(repo, tag=digest_tag, stream=True, decode=True), say)
    except docker.errors.APIError as exc:
        raise TrainboxError(f"push {repo}:{digest_tag}: {exc.explanation or exc}") from None
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    pushed = Pushed(stack, source, f"{repo}:{digest_tag}", digest, f"{repo}@{digest}", image.id, now)
    record(pushed, path)
    return pushed
