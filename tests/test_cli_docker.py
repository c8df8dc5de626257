"""`trainbox image ls|prune` and `image build --dry-run --json` against the real engine (marker docker).

The images here are tiny `docker import`s of an empty tree, labelled as a build labels its images and with the
test label, under a stack name no real build uses; every one is removed at the end."""

from __future__ import annotations

import io
import json
import tarfile
import time
import uuid

import pytest

from tests import docker_helpers
from trainbox.cli import main

pytestmark = pytest.mark.docker


@pytest.fixture
def fake_builds():
    client = docker_helpers.docker_client()
    stack = f"clitest-{uuid.uuid4().hex[:8]}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("marker")
        tar.addfile(info, io.BytesIO(b""))
    made = []

    def make(digest: str, substituted: bool = False, overrides: dict | None = None, extra_tags=()):
        labels = {"io.trainbox.stack": stack, "io.trainbox.content-hash": digest * 2,
                  "io.trainbox.base.used": "local/debian:bookworm", "trainbox.test": "1"}
        if substituted:
            labels["io.trainbox.base.substituted"] = "local/debian:bookworm"
        if overrides:
            labels["io.trainbox.overrides"] = json.dumps(overrides)
        tag = f"trainbox/{stack}:{digest[:12]}"
        changes = [a for k, v in labels.items() for a in ("--change", f"LABEL {k}={json.dumps(v)}")]
        client.run("import", *changes, "-", tag, input=buf.getvalue())
        for t in extra_tags:
            client.tag(tag, t)
        made.extend([tag, *extra_tags])
        time.sleep(1.1)  # distinct creation times, so "newest" is well defined
        return tag

    yield stack, make
    for tag in made:
        client.remove_image(tag, force=True)


def test_image_ls_shows_stack_hash_base_and_flags(fake_builds, capsys):
    stack, make = fake_builds
    old = make("a" * 32)
    new = make("b" * 32, substituted=True, overrides={"torch.version": "2.13.0+cpu"})
    assert main(["image", "ls", stack, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1
    rows = doc["images"]
    assert [r["tags"][0] for r in rows] == [new, old]  # newest first
    assert rows[0]["substitute"] is True and rows[0]["overrides"] == {"torch.version": "2.13.0+cpu"}
    assert rows[1]["substitute"] is False and rows[1]["overrides"] == {}
    assert rows[0]["hash"] == "b" * 12 and rows[0]["base"] == "local/debian:bookworm"
    assert main(["image", "ls", stack]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["IMAGE", "STACK", "PLATFORM", "HASH", "BASE"]
    assert "torch.version=2.13.0+cpu" in lines[1] and " yes " in lines[1]


def test_image_prune_keeps_the_newest(fake_builds, capsys):
    stack, make = fake_builds
    oldest = make("c" * 32)
    middle = make("d" * 32)
    newest = make("e" * 32, extra_tags=(f"trainbox/{stack}:latest",))
    assert main(["image", "prune", stack, "--keep", "1", "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1 and {t["tag"] for t in doc["tags"]} == {oldest, middle}
    assert not any(t["removed"] for t in doc["tags"])
    assert main(["image", "prune", stack, "--keep", "2"]) == 0
    assert f"removed {oldest}" in capsys.readouterr().out
    main(["image", "ls", stack, "--json"])
    left = {t for r in json.loads(capsys.readouterr().out)["images"] for t in r["tags"]}
    assert left == {middle, newest, f"trainbox/{stack}:latest"}


def test_image_prune_removes_untagged_and_names_the_stacks_it_touches(fake_builds, capsys):
    """An untagged image (its tag moved to a newer build) is listed by `image ls` and removed by prune; without
    STACK on an engine with other stacks, prune names them before acting (here only as a dry run)."""
    stack, make = fake_builds
    client = docker_helpers.docker_client()
    first = make("f" * 32)
    old_id = client.image_id(first)
    make("f" * 32)  # the same tag on a newer image: the first is now untagged
    try:
        main(["image", "ls", stack, "--json"])
        rows = json.loads(capsys.readouterr().out)["images"]
        assert [r["tags"] for r in rows] == [[first], []]
        other = f"trainbox/{stack}-b:{'0' * 12}"  # a second stack on this engine
        client.run("import", "--change", f"LABEL io.trainbox.stack={stack}-b", "--change", "LABEL trainbox.test=1",
                   "-", other, input=_empty_tar())
        assert main(["image", "prune", "--keep", "1000", "--dry-run"]) == 0
        out = capsys.readouterr().out
        first_line = out.splitlines()[0]
        assert "no STACK given: pruning every stack on this engine" in first_line
        assert f"{stack}," in first_line and f"{stack}-b" in first_line
        assert f"would remove untagged {stack} image ({rows[1]['id']}" in out
        assert main(["image", "prune", stack, "--keep", "1000"]) == 0
        out = capsys.readouterr().out
        assert "no STACK given" not in out and f"removed untagged {stack} image" in out
        assert client.image_info(old_id) is None
    finally:
        client.remove_image(old_id, force=True)
        client.remove_image(f"trainbox/{stack}-b:{'0' * 12}", force=True)


def _empty_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("marker"), io.BytesIO(b""))
    return buf.getvalue()


def test_image_build_json_is_the_report(capsys, tmp_path):
    """A real build (the cpu image, reused when its content hash exists) with --json: the report on stdout."""
    docker_helpers.docker_client()
    wheelhouse = docker_helpers.wheelhouse_dir()
    rc = main(["image", "build", "cpu", "--json", "--wheelhouse", str(wheelhouse), "-o", str(tmp_path / "r.json")])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert rc == 0 and doc["schema"] == 1 and doc["ok"] is True and doc["tag"].startswith("trainbox/cpu:")
    assert doc["report_file"] == str(tmp_path / "r.json") and json.loads((tmp_path / "r.json").read_text())["ok"]
