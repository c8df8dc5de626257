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
    "RUN pip install torch": "torch, hash-pinned, compiled (a layer of its own)",
    "RUN pip install": "every other hash-pinned wheel, compiled",
    "COPY /out/launchers/ /": "launchers",
    "COPY /out/manifest/ /": "manifest",
    "WORKDIR /workspace": "workdir",
    "COPY /out/package/ /": "the runtime package",
    "SBOM": "the SBOM layer",
}


def _step(text: str, comment: str) -> str:
    """The MUST_MATCH key of the step that made a layer (dh.history_layers)."""
    if comment.startswith("trainbox: the SBOM"):
        return "SBOM"
    if comment.startswith("Imported from"):
        return "base"
    if text.startswith("RUN "):
        for marker, key in (("dpkg-query", "RUN apt / dpkg-query"), ("-m venv", "RUN venv"),
                            (dh.TORCH_STEP, "RUN pip install torch"),
                            ("--require-hashes", "RUN pip install")):
            if marker in text:
                return key
        return "RUN " + text[-60:]
    return text


def _layers_by_step(ref: str) -> dict[str, str]:
    layers = [(_step(text, comment), diff_id) for text, comment, diff_id, _size in dh.history_layers(ref)]
    assert len(dict(layers)) == len(layers), layers  # one step, one layer
    return dict(layers)


def test_two_cold_builds_give_the_same_layers(tmp_path):
    from trainbox.image.build import build

    client = dh.docker_client()
    base = dh.cold_base()
    mark = {"trainbox.test": "1", "trainbox.test.repro": uuid.uuid4().hex[:12]}  # its own content hash and tag
    layers, ids = [], []
    try:
        for i in (1, 2):
            # BuildKit 0.8 once reported two steps of the second --no-cache build CACHED (the hosts stage's RUN and
            # its COPY: not rebuilt, so their layers prove nothing). Such a build is made again, once; the
            # comparison takes only a build that ran every step.
            for attempt in (1, 2):
                out = build(dh.build_options(
                    stack="cpu", base=base, wheelhouse=str(dh.wheelhouse_dir()), no_cache=True, force=True,
                    tag_latest=False, labels=mark, report=str(tmp_path / f"report-{i}-{attempt}.json")))
                ids.append(out.report["image_id"])
                if out.report["cached_steps"] == 0:
                    break
            assert out.report["cached_steps"] == 0, "a cold build ran every step"
            layers.append(_layers_by_step(out.report["image_id"]))
        first, second = layers
        assert set(first) == set(MUST_MATCH) | {"base"}, sorted(first)
        differ = {k: (first[k][:19], second[k][:19]) for k in first if first[k] != second[k]}
        assert not differ, f"layers that did not rebuild bit for bit: {differ}"
        assert ids[0] != ids[-1]  # two builds for real (the image config's `created` differs)
    finally:
        for image_id in set(ids):
            client.remove_image(image_id, force=True)
