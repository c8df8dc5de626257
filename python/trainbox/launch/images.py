"""Which image a job runs in, and why (host module). Never a silent guess: an image built on a substitute base
(Debian standing in for a CANN or CUDA base) or with `--set` pin overrides is not chosen implicitly for a
device stack; `trainbox run` says which image it took and why."""

from __future__ import annotations

from ..runtime.errors import TrainboxError
from .job import Job

SUBSTITUTE_LABEL = "io.trainbox.base.substituted"


def _labels(client, ref: str) -> dict[str, str] | None:
    try:
        return client.labels(ref)
    except Exception:  # noqa: BLE001 - an engine that does not answer: treat the image as unknown
        return None


def choose_image(job: Job, image: str | None, *, allow_substitute: bool = False,
                 dry_run: bool = False) -> tuple[str, str]:
    """(image, why). `image` given: that one. Otherwise trainbox/STACK:latest, which `image build` tags only
    for a build without pin overrides; on an NPU/CUDA stack it must not be substitute-built unless
    `allow_substitute` (a CPU torch on Debian cannot drive the cards)."""
    if image:
        return image, f"image {image} (--image)"
    latest = f"trainbox/{job.stack.name}:latest"
    try:
        from ..engine import find_client

        client = find_client()
        labels = _labels(client, latest) if client.image_exists(latest) else None
    except TrainboxError:
        labels = None
    if labels is None:
        why = f"image {latest} (the stack's default tag; not present here, so not checked)"
        return latest, why
    substitute = labels.get(SUBSTITUTE_LABEL)
    if substitute and job.device != "cpu":
        msg = (f"image {latest} was built on the substitute base {substitute} (no {job.device.upper()} runtime in it): "
               f"it cannot drive the cards of a {job.device} job")
        if not (allow_substitute or dry_run):
            raise TrainboxError(f"{msg}. Build it on its real base, or run it anyway with --image {latest}")
        return latest, msg + " (allowed: " + ("--allow-substitute" if allow_substitute else "dry run") + ")"
    how = f", built on {substitute}" if substitute else ""
    return latest, f"image {latest} (the stack's default tag, built without pin overrides{how})"


def pinned(image: str) -> tuple[str, str | None]:
    """(the reference a cluster should pull, the local image id). A pushed image is named by its registry
    digest (repo@sha256:...), so every node runs the same bytes; a local-only image keeps its tag."""
    try:
        from ..engine import find_client

        data = find_client().inspect(image)
    except Exception:  # noqa: BLE001 - not here, or no engine: the tag as given
        return image, None
    repo = image.split("@")[0].rsplit(":", 1)[0] if "/" in image.split(":")[0] or ":" in image else image
    for digest in data.get("RepoDigests") or []:
        if digest.split("@")[0] == repo:
            return digest, data.get("Id")
    return image, data.get("Id")
