"""Which image a job runs in, and why (host module). Never a silent guess: an image built on a substitute base
(Debian standing in for a CANN or CUDA base) or with `--set` pin overrides is not chosen implicitly for a
device stack; `trainbox run` says which image it took and why."""

from __future__ import annotations

from ..image.engine import Client
from ..runtime.errors import TrainboxError
from .job import Job

SUBSTITUTE_LABEL = "io.trainbox.base.substituted"


def _labels(client: Client, ref: str) -> dict[str, str] | None:
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
        from ..image.engine import find_client

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


def emulation_args(image: str) -> tuple[list[str], str | None]:
    """`docker run` options for an image of another platform than this host (an arm64 image on x86_64, run
    through qemu), and why; ([], None) otherwise. The image's PID 1 is `tini -s`, and qemu-user (7.2) does not
    implement prctl(PR_SET_CHILD_SUBREAPER), so tini stops at once ("PR_SET_CHILD_SUBREAPER is unavailable"):
    the engine's own init (docker-init, the host's tini) is PID 1 instead, in front of trainbox's entrypoint."""
    from ..specs.platforms import host_platform, platform_of

    try:
        from ..image.engine import find_client

        plat = platform_of(find_client().image_info(image))
    except TrainboxError:
        return [], None
    if plat is None or plat == host_platform():
        return [], None
    return (["--init", "--entrypoint", "trainbox-entrypoint"],
            f"image {image} is {plat} on this {host_platform()} host: it runs under qemu, with docker's init as "
            "PID 1 (qemu-user lacks the child-subreaper call the image's tini -s needs)")


def _repo(ref: str) -> str:
    """An image reference without its tag or digest (a registry port's colon stays)."""
    name = ref.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return (head + "/" if head else "") + last.split(":", 1)[0]


def pinned(image: str) -> tuple[str, str | None]:
    """(the reference a cluster should pull, the local image id). A pushed image is named by its registry
    digest (REG/repo@sha256:...), so every node runs the same bytes: the digest of this very repository, else
    that of a pushed copy (`trainbox image push` puts trainbox/STACK at REG/trainbox/STACK); when it went to
    several registries, the last one pushed. A local-only image keeps its tag."""
    if "@sha256:" in image:
        return image, None
    try:
        from ..image.engine import find_client

        data = find_client().inspect(image)
    except Exception:  # noqa: BLE001 - not here, or no engine: the tag as given
        return image, None
    repo, digests = _repo(image), data.get("RepoDigests") or []
    same = [d for d in digests if _repo(d) == repo]
    copies = [d for d in digests if _repo(d).endswith("/" + repo)]
    chosen = same or _last_pushed(copies) or copies
    ref = chosen[0] if chosen else image
    return _listed(ref) or ref, data.get("Id")


def _listed(ref: str) -> str | None:
    """The newest manifest list (`image push --platform A,B`) that holds the pushed image `ref`: nodes of every
    platform pull that one name and each gets its own image."""
    from .. import paths
    from ..yamlfile import json_loads

    lists = []
    for path in paths.REPORTS_DIR.glob("*.json"):
        try:
            lists += json_loads(path.read_text()).get("manifest_lists") or []
        except (OSError, ValueError, AttributeError):
            continue
    holding = [e for e in lists if isinstance(e, dict) and ref in (e.get("images") or {}).values()]
    holding.sort(key=lambda e: e.get("pushed_at") or "", reverse=True)
    return holding[0].get("ref") if holding else None


def _last_pushed(refs: list[str]) -> list[str]:
    """Those of `refs` in the order of the build reports' push records, newest first."""
    from .. import paths
    from ..yamlfile import json_loads

    pushed = []
    for path in paths.REPORTS_DIR.glob("*.json"):
        try:
            pushed += json_loads(path.read_text()).get("pushed") or []
        except (OSError, ValueError, AttributeError):
            continue
    order = [p.get("ref") for p in sorted(pushed, key=lambda p: p.get("pushed_at") or "", reverse=True)]
    return [r for r in order if r in refs]


def loopback_problem(image: str) -> str | None:
    """Why the other nodes of a job cannot pull `image` from where it names, or None: a registry on a loopback
    address (127.0.0.1, localhost, ::1) is, on every other node, that node's own (where the image is not)."""
    import ipaddress

    from ..image.engine import registry_of

    host = image.split("#", 1)[0] if "#" in image else registry_of(image)  # enroot's REG#IMAGE, or docker's
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    name = name.strip("[]").lower()
    try:
        loopback = ipaddress.ip_address(name).is_loopback
    except ValueError:
        loopback = name == "localhost" or name.endswith(".localhost")
    if not loopback:
        return None
    return (f"image {image} names the registry {host}, a loopback address: on every other node that is the node "
            "itself, where the image is not. Push it to a registry the nodes reach (trainbox image push STACK "
            "--registry REG) and render again")


def pull_problem(image: str) -> str | None:
    """Why other machines cannot pull `image`, or None. A reference without a registry host (trainbox/cpu:latest)
    resolves to Docker Hub on every other node, where trainbox's images are not; enroot's REG#IMAGE names one."""
    if "#" in image or image.startswith("/"):
        return None  # enroot's registry form, or a squashfs path the site provides
    from ..image.engine import registry_of

    if registry_of(image) != "registry-1.docker.io":
        return None
    return (f"image {image} is a local tag without a registry: other nodes would look for it on Docker Hub. "
            "Push it (trainbox image push STACK --registry REG) and render again, or pass --image REG/NAME@sha256:...")


def entrypoint_free_problem(job: Job) -> str | None:
    """Why the pods of an NPU RayJob could start without the CANN environment, or None. The RayJob asks KubeRay
    to keep the image's entrypoint (ray.io/overwrite-container-cmd), but KubeRay < 1.1 ignores that and replaces
    the container's command (`/bin/bash -c -- ... ray start`), so the entrypoint, which otherwise sources or
    applies CANN's set_env record, does not run: only the image's ENV reaches the raylets. `trainbox image
    build` bakes that record as ENV (label io.trainbox.cann-env); a plain `docker build` does not. An image
    this engine does not have is not checked."""
    if job.device != "npu":
        return None
    from ..image.toolkits.cann import BAKED_LABEL

    try:
        from ..image.engine import find_client

        client = find_client()
        labels = _labels(client, job.image) if client.image_exists(job.image) else None
    except Exception:  # noqa: BLE001 - no engine here: nothing to check
        return None
    if labels is None or labels.get(BAKED_LABEL) not in (None, "0"):
        return None
    why = (f"it was built on the substitute base {labels[SUBSTITUTE_LABEL]}, which has no CANN"
           if labels.get(SUBSTITUTE_LABEL) else
           f"no baked CANN environment (label {BAKED_LABEL}; a plain `docker build` leaves it to the entrypoint)")
    return (f"image {job.image}: {why}. KubeRay older than 1.1 ignores ray.io/overwrite-container-cmd and starts "
            "Ray pods with `/bin/bash -c -- ... ray start`, not the image's entrypoint, so only the image's ENV and "
            "the pod's env reach the raylets: build the image "
            f"with `trainbox image build {job.stack.name}` on its CANN base (it bakes the CANN environment as ENV)")
