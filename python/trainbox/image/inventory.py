"""Built images, as the engine holds them: what `trainbox image ls` shows and `image prune` trims (host module).

Everything comes from the labels a build writes (build/templates/partials/labels.j2 and image.build): the stack,
the content hash, the base actually used, whether that base was a substitute, and the --set overrides. An image
is trainbox's when it carries io.trainbox.stack; prune only ever removes tags of the form trainbox/<stack>:<hash>.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import asdict, dataclass, field

from ..yamlfile import json_loads
from .engine import Client, EngineError, find_client
from ..specs.platforms import PLATFORM_ARCH, platform_of

# trainbox/<stack>:<hash>, with the platform's suffix where it is not linux/amd64 (trainbox.specs.platforms.tag_suffix)
HASH_TAG_RE = re.compile(r"^trainbox/(?P<stack>[^:/]+):(?P<hash>[0-9a-f]{12})(?P<suffix>(-(%s))?)$"
                         % "|".join(a for a in PLATFORM_ARCH.values() if a != "amd64"))


@dataclass
class BuiltImage:
    id: str
    tags: list[str]
    stack: str
    hash: str | None
    base: str | None
    substitute: bool
    overrides: dict[str, str]
    size: int
    created: str
    age_s: int
    digests: list[str] = field(default_factory=list)  # REG/repo@sha256:... of each push (or pull) of this image
    platform: str | None = None  # what the image config says it runs on (linux/arm64), None when unknown
    labels: dict[str, str] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("labels")
        return d

    @property
    def hash_tags(self) -> list[str]:
        return [t for t in self.tags if HASH_TAG_RE.match(t)]


def _parse_created(text: str) -> _dt.datetime:
    # docker writes nanoseconds (2026-11-26T05:01:02.123456789Z); Python parses up to microseconds
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?$", text.strip())
    if not m:
        return _dt.datetime.fromtimestamp(0, _dt.timezone.utc)
    frac = (m.group(2) or ".0")[:7]
    tz = m.group(3) or "Z"
    return _dt.datetime.fromisoformat(m.group(1) + frac + ("+00:00" if tz == "Z" else tz))


def _overrides(labels: dict[str, str]) -> dict[str, str]:
    try:
        data = json_loads(labels.get("io.trainbox.overrides") or "{}")  # an image label: anyone's
    except ValueError:
        return {"?": labels["io.trainbox.overrides"]}
    return data if isinstance(data, dict) else {}


def built_images(stacks: list[str] | None = None, client: Client | None = None) -> list[BuiltImage]:
    """trainbox's images (newest first), optionally only those of some stacks."""
    client = client or find_client()
    client.require_engine()
    ids = client.run("image", "ls", "--quiet", "--no-trunc", "--filter", "label=io.trainbox.stack").stdout
    ids = sorted(set(ids.decode().split()))
    if not ids:
        return []
    proc = client.run("image", "inspect", *ids, check=False, timeout=120)
    try:
        data = json.loads(proc.stdout or b"[]")  # an image removed meanwhile is left out, not an error
    except ValueError as exc:
        raise EngineError(f"`docker image inspect` gave no JSON: {exc}") from exc
    now = _dt.datetime.now(_dt.timezone.utc)
    out = []
    for info in data:
        labels = (info.get("Config") or {}).get("Labels") or {}
        stack = labels.get("io.trainbox.stack", "")
        if stacks and stack not in stacks:
            continue
        created = _parse_created(info.get("Created") or "")
        digest = labels.get("io.trainbox.content-hash")
        out.append(BuiltImage(
            id=(info.get("Id") or "").removeprefix("sha256:")[:12], tags=sorted(info.get("RepoTags") or []),
            stack=stack, hash=digest[:12] if digest else None,
            base=labels.get("io.trainbox.base.used") or labels.get("org.opencontainers.image.base.name"),
            substitute=bool(labels.get("io.trainbox.base.substituted")), overrides=_overrides(labels),
            size=int(info.get("Size") or 0), created=created.isoformat(timespec="seconds"),
            age_s=max(0, int((now - created).total_seconds())), digests=sorted(info.get("RepoDigests") or []),
            platform=platform_of(info), labels=labels))
    out.sort(key=lambda i: (i.created, i.id), reverse=True)
    return out


@dataclass
class PruneAction:
    stack: str
    tag: str  # "" for an untagged image, removed by its id
    image: str
    created: str
    removed: bool = False
    error: str | None = None


def prune_plan(images: list[BuiltImage], keep: int) -> list[PruneAction]:
    """The hash tags of each stack's images older than its `keep` newest per platform (images come newest first), and every
    untagged one (`<none>` in `image ls`: a build whose tags moved to a newer image), removed by id."""
    seen: dict[tuple, int] = {}
    plan = []
    for img in images:
        if not img.tags:
            plan.append(PruneAction(img.stack, "", img.id, img.created))  # not counted: nothing can run it by name
            continue
        if not img.hash_tags:
            continue  # no tag prune may touch (only user tags): not counted, never removed
        key = (img.stack, img.platform)  # an arm64 build does not push the stack's amd64 images out, nor back
        n = seen[key] = seen.get(key, 0) + 1
        if n > keep:
            plan += [PruneAction(img.stack, t, img.id, img.created) for t in img.hash_tags]
    return plan


def prune(plan: list[PruneAction], client: Client | None = None) -> None:
    """Remove each tag (the image goes with its last tag; one a container still uses stays, with the reason)."""
    client = client or find_client()
    for act in plan:
        proc = client.run("rmi", act.tag or act.image, check=False, timeout=300)
        if proc.returncode == 0:
            act.removed = True
        else:
            act.error = (proc.stderr.decode(errors="replace").strip().splitlines() or ["docker rmi failed"])[-1]


def human_size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n}"


def human_age(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
