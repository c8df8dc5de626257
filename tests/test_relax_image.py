"""Relax (93e989e) in the relax image on the substitute base, CPU mode (issue 35): what its training entry imports
resolves there but for torchvision (sglang 0.5.10's sglang.srt.utils.common imports it at top level, and this runner
has no CPU torchvision: PyPI's x86_64 one is CUDA's and fails beside a CPU torch), Relax's pieces import (the session
service with its Ray Serve ingress, TransferQueue's fork, megatron.bridge beside the Megatron-LM tree, sglang_router),
and an image without TransferQueue's fork or sglang_router fails the recipes' check naming the module. The fastapi
pin is the one whose app Ray Serve 2.55.1 can pickle."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from docker_helpers import commit_edited, docker_client
from test_cpu_mode_docker import _image, python_in
from test_relax_imports import RELAX_REPOS
from trainbox.paths import REPO_ROOT
from upstream_helpers import find_shared_upstream

pytestmark = [pytest.mark.docker, pytest.mark.slow,
              pytest.mark.skipif(find_shared_upstream() is None, reason="../shared/upstream is missing")]

RECIPES = ["relax-qwen3-4b-4npu-colocate", "relax-qwen35-9b-4npu-colocate", "relax-qwen35-9b-8npu-async"]
CPU = {"TRAINBOX_DEVICE": "cpu"}


@pytest.fixture(scope="module")
def relax_img(tmp_path_factory):
    yield from _image("relax", RELAX_REPOS, tmp_path_factory)


ENTRY = r"""
import importlib.metadata as md, json, os
import relax
import relax.agentic.session.service                       # @serve.ingress(app) runs here (Ray Serve pickles the app)
from transfer_queue import StreamingTokenBudgetSampler     # the fork's (relax/core/controller.py); PyPI's lacks it
import importlib.util, megatron.core, megatron.training
# the bridge beside the Megatron-LM tree's packages (one namespace package); loading it imports
# transformer_engine.pytorch, which on Ascend is MindSpeed's adaptor's (it needs torch_npu, so CANN): found, not run
bridge = importlib.util.find_spec("megatron.bridge")
patched = "Unions of containers" in open(os.path.join(bridge.submodule_search_locations[0], "models", "conversion",
                                                      "utils.py")).read()   # Relax's megatron-bridge.patch
from sglang_router.launch_router import RouterArgs
print(json.dumps({"relax": os.path.dirname(relax.__file__), "bridge": list(bridge.submodule_search_locations),
                  "patched": patched,
                  "core": os.path.dirname(megatron.core.__file__), "fastapi": md.version("fastapi"),
                  "sglang": md.version("sglang"), "router": md.version("sglang-router"),
                  "transferqueue": md.version("transferqueue"), "ray": md.version("ray")}))
"""


def test_relax_s_pieces_import_in_the_image(relax_img):
    proc = python_in(relax_img, ENTRY, env=CPU, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["relax"] == "/opt/src/relax/relax"  # the baked tree (a mounted CODE_DIR goes first on PYTHONPATH)
    assert got["core"].startswith("/opt/src/megatron-lm/") and got["bridge"] and got["patched"]
    assert got["fastapi"] == "0.139.1" and got["ray"] == "2.55.1" and got["sglang"] == "0.5.10"


# fastapi 0.139.2 added a threading.Lock to fastapi.routing._IncludedRouter (its effective-routes cache); a lock
# cannot be pickled, so Ray Serve's ingress refuses the app. The same app with such a lock put back fails here: the
# pin is what makes Relax's import pass, not luck.
INGRESS = r"""
import sys, threading
from fastapi import FastAPI
from ray import serve
app = FastAPI()
@app.get("/x")
def x():
    return {}
if sys.argv[1] == "lock":
    app.router._trainbox_probe_lock = threading.Lock()
try:
    serve.ingress(app)(type("D", (), {}))
except Exception as exc:
    print("FAIL", str(exc).splitlines()[0])
else:
    print("OK")
"""


def test_the_fastapi_pin_is_one_ray_serve_can_pickle(relax_img):
    ok = python_in(relax_img, INGRESS, "plain", env=CPU, timeout=300)
    assert ok.returncode == 0 and ok.stdout.strip().splitlines()[-1] == "OK", ok.stdout + ok.stderr[-2000:]
    bad = python_in(relax_img, INGRESS, "lock", env=CPU, timeout=300)
    assert bad.stdout.strip().splitlines()[-1].startswith("FAIL Failed to serialize the ASGI app"), \
        bad.stdout + bad.stderr[-2000:]


def launch_check(recipe: str, image: str) -> tuple[int, str, dict | None]:
    proc = subprocess.run([sys.executable, "-m", "trainbox.cli", "launch", "check", recipe, "--args", "--image", image,
                           "--json"], capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    return proc.returncode, proc.stderr, (json.loads(proc.stdout)["recipes"][0] if proc.stdout.strip() else None)


@pytest.mark.parametrize("recipe", RECIPES)
def test_relax_s_entry_closure_lacks_only_torchvision(relax_img, recipe):
    """Everything Relax's entry imports resolves in the image but torchvision (see the module docstring): the
    recipes are expect_fail in ci/smoke-offline.yaml for that, and this turns red when it changes either way."""
    rc, err, row = launch_check(recipe, relax_img)
    assert rc == 1 and row is not None, err[-3000:]
    assert [m["module"] for m in row["args"]["imports"]["missing"]] == ["torchvision"], row["args"]["imports"]["missing"]
    assert row["args"]["imports"]["missing"][0]["chain"][:4] == ["relax.entrypoints.train", "relax.utils.arguments",
                                                         "relax.backends.sglang.arguments", "sglang.srt.server_args"]
    assert row["args"]["stubs"] == ["torch_npu"]


def _image_without(tag: str, paths: list[str]) -> str:
    """`tag` with `paths` removed (as if the stack no longer held them), committed as a throwaway image."""
    script = "set -e; sp=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); " \
        + "; ".join(f"rm -rf \"$sp\"/{p}" for p in paths)
    return commit_edited(tag, f"trainbox-test/relax-without:{uuid.uuid4().hex[:12]}", script)


@pytest.mark.parametrize("module,paths", [
    ("transfer_queue", ["transfer_queue", "[Tt]ransfer[Qq]ueue-*.dist-info"]),
    ("sglang_router", ["sglang_router", "sglang_router-*.dist-info"]),
])
def test_without_the_fork_or_the_router_the_check_fails_naming_it(relax_img, module, paths):
    without = _image_without(relax_img, paths)
    try:
        rc, err, row = launch_check(RECIPES[0], without)
    finally:
        subprocess.run([docker_client().docker, "rmi", "-f", without], capture_output=True)
    assert rc == 1 and row is not None, err[-3000:]
    assert module in [m["module"] for m in row["args"]["imports"]["missing"]], row["args"]["imports"]["missing"]
