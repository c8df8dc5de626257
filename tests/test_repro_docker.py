"""Layers that rebuild bit for bit (marker `docker`): the cpu stack built twice from cold (`--no-cache`: BuildKit
runs every step again instead of taking a cached layer), on a base of its own (`docker_helpers.cold_base`, so that
the cache index of the cpu image's steps is left alone), then each layer's digest (DiffID) compared step by step.
trainbox's own layers (its files, launchers, manifest, SBOM) must be the same bytes, and so must the hash-pinned
pip layer and the rest of the final stage; the README says which layers match and why. Two cold builds: slow, and
CPU-heavy on a 2-core host."""

from __future__ import annotations

import uuid

import pytest

import docker_helpers as dh

pytestmark = [pytest.mark.docker, pytest.mark.slow]

#: every layer of the cpu image after its base, by the step that writes it
MUST_MATCH = {
    "COPY /out/ /": "/etc/hosts (hosts stage)",
    "RUN apt / dpkg-query": "system stage, its packages already in the base",
    "RUN venv": "the venv and pip",
    "RUN pip install": "every hash-pinned wheel, compiled",
    "COPY /out/launchers/ /": "launchers",
    "COPY /out/manifest/ /": "manifest",
    "WORKDIR /workspace": "workdir",
    "COPY /out/package/ /": "the runtime package",
    "SBOM": "the SBOM layer",
}


def _step(created_by: str, comment: str) -> str | None:
    """The MUST_MATCH key of a history entry that made a layer, None for one that made none (ENV, LABEL ...)."""
    if comment.startswith("trainbox: the SBOM"):
        return "SBOM"
    if comment.startswith("Imported from"):
        return "base"
    text = created_by.split(" # buildkit")[0]
    if text.startswith("RUN "):
        for marker, key in (("dpkg-query", "RUN apt / dpkg-query"), ("-m venv", "RUN venv"),
                            ("--require-hashes", "RUN pip install")):
            if marker in text:
                return key
        return "RUN " + text[-60:]
    if text.startswith(("COPY ", "ADD ", "WORKDIR ")):
        return text
    return None


def _layers_by_step(client, ref: str) -> dict[str, str]:
    diff_ids = client.inspect(ref)["RootFS"]["Layers"]
    out = client.run("history", "--no-trunc", "--format", "{{.CreatedBy}}\t{{.Comment}}", ref).stdout.decode()
    steps = [s for s in (_step(*line.split("\t", 1)) for line in reversed(out.splitlines()) if "\t" in line) if s]
    assert len(steps) == len(diff_ids), (steps, diff_ids)  # each layer named by the step that made it
    return dict(zip(steps, diff_ids))


def test_two_cold_builds_give_the_same_layers(tmp_path):
    from trainbox.image import build

    client = dh.docker_client()
    base = dh.cold_base()
    mark = {"trainbox.test": "1", "trainbox.test.repro": uuid.uuid4().hex[:12]}  # its own content hash and tag
    layers, ids = [], []
    try:
        for i in (1, 2):
            out = build(dh.build_options(
                stack="cpu", base=base, wheelhouse=str(dh.wheelhouse_dir()), no_cache=True, force=True,
                tag_latest=False, labels=mark, report=str(tmp_path / f"report-{i}.json")))
            assert out.report["cached_steps"] == 0, "a cold build ran every step"
            ids.append(out.report["image_id"])
            layers.append(_layers_by_step(client, out.report["image_id"]))
        first, second = layers
        assert set(first) == set(MUST_MATCH) | {"base"}, sorted(first)
        differ = {k: (first[k][:19], second[k][:19]) for k in first if first[k] != second[k]}
        assert not differ, f"layers that did not rebuild bit for bit: {differ}"
        assert ids[0] != ids[1]  # two builds for real (the image config's `created` differs)
    finally:
        for image_id in ids:
            client.remove_image(image_id, force=True)
