"""Shared helpers for tests that need a real Docker engine (marker `docker`).

The images built here are the product's own builds (`trainbox.image.build.build`), tagged by content hash,
so a second session, or `make image-cpu` before `make test`, reuses them for free. Wire them into
conftest.py as session fixtures, e.g.::

    @pytest.fixture(scope="session")
    def cpu_image():
        return docker_helpers.build_cpu_image()   # the tag; build_cpu_outcome() has the report

Inside CI (CI set) a missing engine or wheelhouse fails the test instead of skipping it: CI must
prove the build for real every time.
"""

from __future__ import annotations

import functools
import os
import subprocess
import uuid
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
MARKER_CA = DATA / "marker-ca.pem"
#: An index URL with credentials the builds get as a secret (PyPI ignores them); it must never show
#: up in an image's layers, history or labels.
SECRET_TOKEN = "trainbox-test-secret-5f0c1e9a"
SECRET_INDEX_URL = f"https://trainbox-test:{SECRET_TOKEN}@pypi.org/simple"
TEST_LABEL = "trainbox.test=1"
# the venv's two pin-install steps (partials/install.j2), told apart in reports and history by the file each installs
TORCH_STEP = "-r /tmp/trainbox/torch.txt"
PINS_STEP = "-r /tmp/trainbox/requirements.txt"
NPU_OVERRIDES = {
    # Dockerfile.npu's own steps with pins this machine can reach: the CPU torch from the wheelhouse,
    # the rest from PyPI. torch_npu then installs, but cannot load without CANN.
    "torch.version": "2.13.0+cpu",
    "torch-npu.version": "2.13.0",
    "base.cann": "9.2.0",  # the CANN line torch_npu 2.13.0 pairs with (rule torch-npu-cann); none is inside
    "triton-ascend.version": "3.2.0",
    "megatron-core.version": "0.15.3",
}


def _unavailable(msg: str):
    if os.environ.get("CI"):
        pytest.fail(f"{msg} (CI must run the docker tests; see ci/ensure-docker.sh)", pytrace=False)
    pytest.skip(msg)


@functools.cache
def _client_or_reason():
    from trainbox.image.engine import find_client
    from trainbox.runtime.errors import TrainboxError

    try:
        client = find_client()
    except TrainboxError as exc:
        return None, str(exc)
    ok, detail = client.engine_answers()
    return (client, "") if ok else (None, f"no Docker engine answers: {detail}")


def docker_client():
    """The BuildKit-capable client; skips (fails under CI) when there is no engine."""
    client, why = _client_or_reason()
    if client is None:
        _unavailable(why)
    return client


def wheelhouse_dir() -> Path:
    """A directory holding the CPU torch wheel the cpu stack pins: $TRAINBOX_TEST_WHEELHOUSE, else
    pip's configured find-links directories. The product never looks there by itself."""
    from trainbox.supply.wheelhouse import read_wheelhouse
    from trainbox.specs.stack import load_stack

    torch = load_stack("cpu").components["torch"]
    want = set(torch.pin_for("linux/amd64").sha256)
    candidates = [os.environ.get("TRAINBOX_TEST_WHEELHOUSE", "")]
    try:
        out = subprocess.run(["python", "-m", "pip", "config", "get", "global.find-links"],
                             capture_output=True, text=True, timeout=120).stdout
        candidates += out.split()
    except (OSError, subprocess.TimeoutExpired):
        pass
    candidates.append(os.environ.get("PIP_FIND_LINKS", ""))
    for c in filter(None, candidates):
        p = Path(c.removeprefix("file://"))
        if p.is_dir() and any(w.sha256 in want for w in read_wheelhouse(p)):
            return p
    _unavailable("no wheelhouse with the cpu stack's torch wheel: set TRAINBOX_TEST_WHEELHOUSE")
    raise AssertionError  # unreachable


def _host_bundle() -> Path:
    from trainbox.image.build import default_ca_bundle

    return Path(default_ca_bundle() or "/etc/ssl/certs/ca-certificates.crt")


@functools.cache
def marker_ca_bundle() -> Path:
    """The host's CA bundle plus a marker certificate no image may contain (written once per user)."""
    from trainbox.paths import cache_dir

    data = _host_bundle().read_bytes().rstrip(b"\n") + b"\n" + MARKER_CA.read_bytes()
    out = cache_dir() / "test" / "ca-bundle-with-marker.pem"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_bytes() != data:
        out.write_bytes(data)
    return out


#: Where Debian keeps a site's own CAs (an interception proxy's, a private index's): the part of the
#: bundle that is not public, and that no image may carry unless the image asks for it.
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")


def secret_needles(image_bundle: bytes = b"") -> dict[str, bytes]:
    """Byte strings that only a leaked secret could put into an image: a line from the body of the
    marker certificate and of each site-local CA in the bundle given to the build (public CAs ship in
    every certifi copy, so they prove nothing), unless the image's own CA store holds it; and the
    index token."""
    from imagescan import iter_pem_certificates

    needles = {"index-token": SECRET_TOKEN.encode()}
    sources = [("marker", MARKER_CA)] + [(f"local-ca:{p.name}", p) for p in sorted(LOCAL_CA_DIR.glob("*.crt"))]
    for label, path in sources:
        for i, cert in enumerate(iter_pem_certificates(path.read_bytes())):
            body = [ln.strip() for ln in cert.splitlines()[1:-1]]
            if len(body) < 4:
                continue
            line = body[len(body) // 2]  # a middle line: unique to this certificate, no PEM header noise
            if line not in image_bundle:
                needles[f"{label}#{i}"] = line
    return needles


def build_options(**kw):
    from trainbox.image.build import BuildOptions

    return BuildOptions(**kw)


@functools.cache
def ensure_base() -> str:
    import fcntl
    import tempfile

    from trainbox.image.base import DEFAULT_TAG, bootstrap

    client = docker_client()
    # One bootstrap at a time across the test workers (several docker queues run at once): the second waits and
    # then finds the base, instead of making its own and moving the tag under the first one's builds.
    with open(Path(tempfile.gettempdir()) / "trainbox-test-base.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not client.image_exists(DEFAULT_TAG):
            bootstrap(tag=DEFAULT_TAG, client=client)
    return DEFAULT_TAG


def kept_base(repo: str, steps: str, files: dict[str, str] | None = None) -> str:
    """A test base: `steps` (Dockerfile instructions) on the substitute base, tagged `repo:<hash of the substitute
    base's id, the steps and the files>` and kept between runs, as the substitute base is. Why kept: a base
    rebuilt per run gets a new image ID, and every layer built on it is then cold; on a kept one a warm engine
    answers the unchanged layers. A new substitute base gives a new tag. Older tags of the same repository are
    removed when a new one is made, so edits do not pile up bases."""
    import hashlib
    import tempfile

    client = docker_client()
    base = ensure_base()
    dockerfile = f"FROM {base}\n{steps}"
    files = files or {}
    digest = hashlib.sha256(client.inspect(base)["Id"].encode() + b"\0" + dockerfile.encode())
    for rel in sorted(files):
        digest.update(b"\0" + rel.encode() + b"\0" + files[rel].encode())
    tag = f"{repo}:{digest.hexdigest()[:12]}"
    if client.image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="trainbox-test-base-") as tmp:
        ctx = Path(tmp)
        (ctx / "Dockerfile").write_text(dockerfile)
        for rel, body in files.items():
            (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
            (ctx / rel).write_text(body)
        proc = subprocess.run([client.docker, "build", "--network", "host", "--label", TEST_LABEL, "-t", tag,
                               str(ctx)], env=dict(os.environ, DOCKER_BUILDKIT="1"), capture_output=True, text=True,
                              timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    old = client.run("images", "--format", "{{.Repository}}:{{.Tag}}", repo, check=False).stdout.decode().split()
    for other in old:
        if other != tag:
            client.run("rmi", "-f", other, check=False)
    return tag


def cold_base() -> str:
    """The substitute base under an image ID of its own (one LABEL more), for the tests' --no-cache builds.

    Why: a --no-cache build of steps the cpu image shares points BuildKit's cache index at its own results (a
    normal build after one reuses the no-cache build's layers, not the first build's; checked on this engine).
    When those go, the cpu image's steps miss and build cold again (in a parallel run the edit-rebuild test once
    saw all 12 of its steps rerun). On a base of their own, their cache keys never meet the cpu image's. Used by
    the reproducibility test. (The dependency-pass test needs no --no-cache at all; on this base with `--base`
    its stack would also be locked again as an override, which gives it the parent's dependency closure.)"""
    return kept_base("trainbox-test/cold-base", 'LABEL io.trainbox.test.cold-base="1"\n')


def build_cpu_image() -> str:
    """The cpu stack's image tag (trainbox/cpu:<content hash>), built once per session, and again (from the build
    cache) when a test before this one left it without that name: the push tests remove every name of the image to
    pull it back by digest, and a failure between the two leaves it gone."""
    return build_cpu_outcome().tag


def build_npu_template_image() -> str:
    """The tag of Dockerfile.npu's steps built on the cpu base (see build_npu_template_outcome)."""
    return build_npu_template_outcome().tag


def build_cpu_outcome():
    """The cpu stack's image as `make image-cpu` builds it, with secrets to look for later (a marker
    CA in the bundle, credentials in the index URL). Returns trainbox.image.build.BuildOutcome (.tag, .report)."""
    out = _cpu_outcome()
    if not docker_client().image_exists(out.tag):  # a test before this one took its name (see build_cpu_image)
        _cpu_outcome.cache_clear()
        out = _cpu_outcome()
    return out


@functools.cache
def _cpu_outcome():
    from trainbox.image.build import build

    docker_client()
    ensure_base()
    return build(build_options(stack="cpu", wheelhouse=str(wheelhouse_dir()), ca_bundle=str(marker_ca_bundle()),
                               pip_index_url=SECRET_INDEX_URL, report=str(_report_path("cpu"))))


@functools.cache
def build_cpu_ray_image() -> str:
    """The cpu-ray stack (cpu + ray[default]) for the Ray recipe; shares the cpu image's first layers."""
    from trainbox.image.build import build

    docker_client()
    ensure_base()
    return build(build_options(stack="cpu-ray", wheelhouse=str(wheelhouse_dir()),
                               report=str(_report_path("cpu-ray")))).tag


@functools.cache
def build_npu_template_outcome():
    """Dockerfile.npu's steps for real: the npu-910b stack with its CANN base replaced by the cpu
    base and pins this machine can reach, through the user-facing overrides (--base, --set,
    --wheelhouse). Returns trainbox.image.build.BuildOutcome."""
    from trainbox.image.build import build

    docker_client()
    base = ensure_base()
    return build(build_options(stack="npu-910b", base=base, sets=dict(NPU_OVERRIDES),
                               wheelhouse=str(wheelhouse_dir()), ca_bundle=str(marker_ca_bundle()),
                               report=str(_report_path("npu-910b"))))


def _report_path(stack: str) -> Path:
    from trainbox.paths import cache_dir

    p = cache_dir() / "test" / "reports" / f"{stack}-{os.getpid()}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def run_in_image(tag: str, *cmd: str, timeout: float = 300, network: str = "none", env: dict | None = None,
                 entrypoint: str | None = None) -> subprocess.CompletedProcess:
    """`docker run --rm` with the test label, no network by default, bounded in time."""
    client = docker_client()
    name = f"trainbox-test-{uuid.uuid4().hex[:10]}"
    args = [client.docker, "run", "--rm", "--name", name, "--label", TEST_LABEL, "--network", network]
    for k, v in (env or {}).items():
        args += ["-e", f"{k}={v}"]
    if entrypoint is not None:
        args += ["--entrypoint", entrypoint]
    args += [tag, *cmd]
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        subprocess.run([client.docker, "rm", "-f", name], capture_output=True)
        raise


def commit_edited(tag: str, new: str, script: str, mounts: tuple[str, ...] = ()) -> str:
    """`tag` changed by a bash `script` run in it (no network, `mounts` as --mount values), committed as `new` with
    the image's own entrypoint and command put back (the run replaced them with bash); the container removed
    (a throwaway image of a test: labelled TEST_LABEL, the caller removes it)."""
    import json

    docker = docker_client().docker
    name = f"trainbox-test-{uuid.uuid4().hex[:10]}"
    subprocess.run([docker, "run", "--name", name, "--label", TEST_LABEL, "--network", "none", "--entrypoint", "bash",
                    *(a for m in mounts for a in ("--mount", m)), tag, "-c", script],
                   check=True, capture_output=True, timeout=300)
    conf = json.loads(subprocess.run([docker, "inspect", "--format", "{{json .Config}}", tag], check=True,
                                     capture_output=True, text=True, timeout=60).stdout)
    changes = ["--change", f"ENTRYPOINT {json.dumps(conf.get('Entrypoint') or [])}",
               "--change", f"CMD {json.dumps(conf.get('Cmd') or [])}"]
    try:
        subprocess.run([docker, "commit", *changes, name, new], check=True, capture_output=True, timeout=300)
    finally:
        subprocess.run([docker, "rm", "-f", name], capture_output=True)
    return new


def temporary_tag(prefix: str = "trainbox-test/tmp") -> str:
    return f"{prefix}:{uuid.uuid4().hex[:12]}"


def pip_inspect(tag: str) -> dict:
    """`pip inspect` run in the image by its venv's pip (no network): what pip itself says is installed."""
    import json

    proc = run_in_image(tag, "-m", "pip", "inspect", "--disable-pip-version-check", entrypoint="/opt/venv/bin/python",
                        timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def sbom_problems(tag: str) -> list[str]:
    """One line per way the SBOM in the image differs from `pip inspect` in the same image: a distribution left
    out or extra, another version, or a sha256 that pip recorded (PEP 610 archive_info) and the SBOM lacks."""
    import json

    from trainbox.image import sbom
    from trainbox.runtime.installed import canon

    doc = json.loads(sbom.read_from_image(docker_client(), tag))
    listed = {canon(c["name"]): c for c in doc.get("components", []) if c.get("purl", "").startswith("pkg:pypi/")}
    problems = []
    for d in pip_inspect(tag)["installed"]:
        name, version = canon(d["metadata"]["name"]), d["metadata"]["version"]
        c = listed.pop(name, None)
        if c is None:
            problems.append(f"{name} {version}: installed (pip inspect), not in the SBOM")
            continue
        if c.get("version") != version:
            problems.append(f"{name}: pip inspect says {version}, the SBOM {c.get('version')}")
        sha = (((d.get("direct_url") or {}).get("archive_info") or {}).get("hashes") or {}).get("sha256")
        if sha and {"alg": "SHA-256", "content": sha} not in c.get("hashes", []):
            problems.append(f"{name}: pip recorded sha256 {sha}, the SBOM has {c.get('hashes')}")
    problems += [f"{n} {c.get('version')}: in the SBOM, not installed (pip inspect)" for n, c in sorted(listed.items())]
    return problems


def history_layers(ref: str) -> list[tuple[str, str, str, int]]:
    """(created_by, comment, DiffID, bytes) for each layer of an image, oldest first. `docker history` lists
    every step; those that made a layer are the base's import, RUN, COPY, ADD, WORKDIR and trainbox's SBOM
    layer (ENV, LABEL, ARG ... make none), and `inspect` gives the layers' DiffIDs in the same order."""
    client = docker_client()
    diff_ids = client.inspect(ref)["RootFS"]["Layers"]
    out = client.run("history", "--no-trunc", "--human=false", "--format",
                     "{{.CreatedBy}}\t{{.Comment}}\t{{.Size}}", ref).stdout.decode()
    made = []
    for line in reversed(out.splitlines()):
        created_by, comment, size = line.rsplit("\t", 2)
        text = created_by.split(" # buildkit")[0]
        if comment.startswith(("Imported from", "trainbox: the SBOM")) or \
                text.startswith(("RUN ", "COPY ", "ADD ", "WORKDIR ")):
            made.append((text, comment, int(size)))
    assert len(made) == len(diff_ids), (made, diff_ids)  # each layer named by the step that made it
    return [(text, comment, diff_id, size) for (text, comment, size), diff_id in zip(made, diff_ids)]
