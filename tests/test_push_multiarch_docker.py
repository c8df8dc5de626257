"""`image push --platform linux/amd64,linux/arm64` to a real registry on 127.0.0.1 (marker `docker`): each
platform's image pushed, one manifest list naming both by digest, recorded in both build reports, and the name the
cluster targets render. The two images are tiny (FROM scratch, one file, built with BuildKit for each platform:
nothing runs, so no emulation is needed); they stand in for a stack's two builds, which
tests/test_arm64_docker.py makes for real. Images are labelled trainbox.test=1 and removed."""

from __future__ import annotations

import json
import subprocess
import urllib.request
import uuid

import pytest

import docker_helpers as dh

pytestmark = [pytest.mark.docker]

LIST_TYPES = ("application/vnd.docker.distribution.manifest.list.v2+json, "
              "application/vnd.oci.image.index.v1+json")


@pytest.fixture
def two_builds(tmp_path, monkeypatch):
    """trainbox/STACK:HASH (linux/amd64) and trainbox/STACK:HASH-arm64 (linux/arm64), each with its build report."""
    import trainbox.paths

    client = dh.docker_client()
    stack = f"pushtest-{uuid.uuid4().hex[:8]}"
    reports = tmp_path / "reports"
    reports.mkdir()
    monkeypatch.setattr(trainbox.paths, "REPORTS_DIR", reports)
    made, paths = [], {}
    for plat, suffix in (("linux/amd64", ""), ("linux/arm64", "-arm64")):
        ctx = tmp_path / plat.replace("/", "-")
        ctx.mkdir()
        (ctx / "marker").write_text(plat)
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY marker /marker\n")
        tag = f"trainbox/{stack}:{uuid.uuid4().hex[:12]}{suffix}"
        proc = subprocess.run([*client.build_argv, "--platform", plat, "--network", "none", "-t", tag, "--label",
                               dh.TEST_LABEL, "--label", f"io.trainbox.stack={stack}", str(ctx)],
                              capture_output=True, text=True, env=client.build_env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        made.append(tag)
        paths[plat] = reports / f"{stack}{suffix}.json"
        paths[plat].write_text(json.dumps({"stack": stack, "platform": plat, "tag": tag}))
    yield stack, made, paths
    for tag in made:
        client.remove_image(tag, force=True)


def test_push_platforms_publishes_one_manifest_list(registry, two_builds):
    from trainbox.launch.images import pinned
    from trainbox.image.push import push_platforms

    stack, (amd_tag, arm_tag), reports = two_builds
    client = dh.docker_client()
    lines: list[str] = []
    listed = push_platforms(stack, registry, ["linux/amd64", "linux/arm64"], say=lines.append)
    try:
        assert listed.ref == f"{registry}/trainbox/{stack}@{listed.digest}"
        assert listed.images["linux/arm64"]["tag"].endswith(arm_tag.split(":")[1])
        name, tag = listed.tag.split("/", 1)[1].rsplit(":", 1)
        req = urllib.request.Request(f"http://{registry}/v2/{name}/manifests/{tag}", headers={"Accept": LIST_TYPES})
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert resp.headers["Docker-Content-Digest"] == listed.digest
            doc = json.loads(resp.read())
        got = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in doc["manifests"]}
        assert got == {p: listed.images[p]["digest"] for p in ("linux/amd64", "linux/arm64")}, doc
        for plat, path in reports.items():
            rec = json.loads(path.read_text())
            assert [e["ref"] for e in rec["manifest_lists"]] == [listed.ref]
            assert rec["pushed"][-1]["ref"] == listed.images[plat]["ref"]
        # the cluster targets name the list, whichever platform's local image the job was given
        assert pinned(amd_tag)[0] == listed.ref and pinned(arm_tag)[0] == listed.ref
    finally:
        for i in listed.images.values():
            client.run("image", "rm", i["tag"], i["ref"], check=False)
