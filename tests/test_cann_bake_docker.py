"""`trainbox image build` bakes the CANN environment the base's set_env scripts export into the image as ENV
(trainbox.image.toolkits.cann), so that a Kubernetes `command:` that bypasses the entrypoint gets it too.

Stand-ins (no CANN and no cann base here): a CANN tree of set_env.sh scripts written by this test (the
toolkit's, BiSheng's / AscendNPU-IR's and ATB's) in an image on the substitute base local/debian:bookworm.
The record is written the way the NPU Dockerfile writes it (`python3 -m trainbox.runtime.cann_env --write`,
the real module sourcing the stand-in scripts), and the bake is the one `trainbox image build` runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from docker_helpers import TEST_LABEL, docker_client
from trainbox.image.toolkits import cann as cann_bake
from trainbox.paths import REPO_ROOT
from trainbox.runtime.errors import TrainboxError

pytestmark = pytest.mark.docker

BASE = "local/debian:bookworm"
HOME = "/usr/local/Ascend/ascend-toolkit/latest"
QUOTES = 'a "b" $c \\d `e`'  # survives baking byte for byte (no single quote: the stand-in quotes it so)
SCRIPTS = {
    # stand-in for the toolkit's set_env.sh
    "ascend-toolkit/set_env.sh": f"""export ASCEND_TOOLKIT_HOME={HOME}
export ASCEND_HOME_PATH=${{ASCEND_TOOLKIT_HOME}}
export LD_LIBRARY_PATH=${{ASCEND_TOOLKIT_HOME}}/lib64:${{ASCEND_TOOLKIT_HOME}}/lib64/plugin/opskernel:${{LD_LIBRARY_PATH}}
export PYTHONPATH=${{ASCEND_TOOLKIT_HOME}}/python/site-packages:${{PYTHONPATH}}
export PATH=${{ASCEND_TOOLKIT_HOME}}/bin:${{ASCEND_TOOLKIT_HOME}}/compiler/ccec_compiler/bin:$PATH
export ASCEND_OPP_PATH=${{ASCEND_TOOLKIT_HOME}}/opp
export TB_STANDIN_QUOTES='{QUOTES}'
""",
    # stand-in for BiSheng's (AscendNPU-IR) set_env.sh under the toolkit home: bishengir-compile on PATH
    "ascend-toolkit/latest/share/info/ascendnpu-ir/bin/set_env.sh":
        'export PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd):$PATH"\n',
    # stand-in for ATB's set_env.sh: imports torch to learn the C++ ABI unless told --cxx_abi
    "nnal/atb/set_env.sh": 'abi=""; for a in "$@"; do case $a in --cxx_abi=*) abi="${a#--cxx_abi=}";; esac; done\n'
                           '[ -n "$abi" ] || export TB_STANDIN_IMPORTED_TORCH=1\n'
                           'export ATB_HOME_PATH=/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_${abi:-0}\n',
}
DOCKERFILE = f"""FROM {BASE}
COPY Ascend /usr/local/Ascend
COPY trainbox /opt/trainbox/python/trainbox
ENV PYTHONPATH=/opt/trainbox/python
RUN mkdir -p /etc/trainbox && python3 -m trainbox.runtime.cann_env --write /etc/trainbox/cann-env.json
ENTRYPOINT ["python3", "-m", "trainbox.runtime.entrypoint"]
CMD ["bash"]
"""


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """(client, tag): an image with the stand-in CANN tree and the build's record, not yet baked."""
    client = docker_client()
    ctx = tmp_path_factory.mktemp("cann-standin")
    for rel, body in SCRIPTS.items():
        p = ctx / "Ascend" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body)
    shutil.copytree(REPO_ROOT / "python/trainbox/runtime", ctx / "trainbox/runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "python/trainbox/__init__.py", ctx / "trainbox/__init__.py")
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    tag = f"trainbox-test/cann-bake:{uuid.uuid4().hex[:10]}"
    proc = subprocess.run([client.docker, "build", "--network", "none", "--label", TEST_LABEL, "-t", tag, str(ctx)],
                          env=dict(os.environ, DOCKER_BUILDKIT="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield client, tag
    for t in (tag, tag + "-b", tag + "-bad"):
        client.run("rmi", "-f", t, check=False)


def env_of(client, image, *opts) -> dict:
    out = client.run("run", "--rm", "--network", "none", "--label", TEST_LABEL, *opts, image, "env", "-0").stdout
    return dict(item.decode().partition("=")[::2] for item in out.split(b"\0") if item)


def test_the_record_is_baked_as_env_for_a_command_that_bypasses_the_entrypoint(standin):
    client, tag = standin
    layers = len(client.inspect(tag)["RootFS"]["Layers"])
    assert "ATB_HOME_PATH" not in env_of(client, tag, "--entrypoint", "")  # not baked yet
    said = []
    result = cann_bake.bake(client, [tag, tag + "-b"], said.append)
    assert result["baked"] >= 8 and {"PATH", "LD_LIBRARY_PATH", "ATB_HOME_PATH", "ASCEND_OPP_PATH"} <= set(
        result["names"]), result
    assert said and "as ENV" in said[0]

    bypass = env_of(client, tag, "--entrypoint", "")  # what a Kubernetes `command:` gets
    assert bypass["ASCEND_TOOLKIT_HOME"] == HOME and bypass["ASCEND_OPP_PATH"] == f"{HOME}/opp"
    path = bypass["PATH"].split(":")
    assert path[0] == f"{HOME}/share/info/ascendnpu-ir/bin" and f"{HOME}/bin" in path  # BiSheng, then toolkit
    assert bypass["LD_LIBRARY_PATH"].startswith(f"{HOME}/lib64:")
    assert bypass["ATB_HOME_PATH"].endswith("cxx_abi_1") and "TB_STANDIN_IMPORTED_TORCH" not in bypass
    assert bypass["TB_STANDIN_QUOTES"] == QUOTES
    record = json.loads(client.run("run", "--rm", "--network", "none", "--label", TEST_LABEL, "--entrypoint", "cat",
                                   tag, "/etc/trainbox/cann-env.json").stdout)
    assert {k: bypass.get(k) for k in record["env"]} == record["env"]

    info = client.inspect(tag)
    assert len(info["RootFS"]["Layers"]) == layers  # metadata only
    assert info["Config"]["Entrypoint"] == ["python3", "-m", "trainbox.runtime.entrypoint"]
    assert info["Config"]["Cmd"] == ["bash"] and info["Config"]["Labels"][cann_bake.BAKED_LABEL] == str(
        result["baked"])
    assert client.image_id(tag + "-b") == info["Id"]
    assert not client.run("ps", "-a", "-q", "--filter", f"ancestor={tag}", check=False).stdout.strip()

    # the entrypoint still applies the record: a no-op now, the same environment
    proc = client.run("run", "--rm", "--network", "none", "--label", TEST_LABEL, "-e", "TRAINBOX_DEBUG=1", tag,
                      "env", "-0")
    via = dict(i.decode().partition("=")[::2] for i in proc.stdout.split(b"\0") if i)
    assert {k: via.get(k) for k in record["env"]} == record["env"]
    assert "set by the scripts: none" in proc.stderr.decode()

    again = cann_bake.bake(client, [tag], said.append)  # `image build` on an image that is up to date
    assert again == {"baked": result["baked"], "already": True}


def test_a_value_that_did_not_survive_fails_naming_the_variable(standin):
    client, tag = standin
    with pytest.raises(TrainboxError, match="ASCEND_OPP_PATH is '/elsewhere' in the image's ENV, but .* records"):
        client.tag(tag, tag + "-bad")
        cid = client.run("create", "--network", "none", tag + "-bad").stdout.decode().strip()
        try:
            client.run("commit", "--change", "ENV ASCEND_OPP_PATH=/elsewhere", cid, tag + "-bad")
        finally:
            client.run("rm", "-f", cid, check=False)
        cann_bake.check_baked(client, tag + "-bad", {"env": {"ASCEND_OPP_PATH": f"{HOME}/opp"}})


#: what this build leaves out of npu-910b: pins the bake has nothing to do with. Every layer on the stand-in base is
#: cold in a cold run: the whole stack took 6 minutes of one, without these 2 minutes beside a cold smoke build.
#: torch, torch_npu and triton-ascend stay: the stack's rules refuse an npu stack without them, and the record is
#: written by the venv's Python beside them.
NOT_NEEDED_FOR_THE_BAKE = ("transformers", "scipy", "megatron-core", "mcore-bridge", "ml-dtypes", "tornado", "absl-py",
                           "cloudpickle")


@pytest.mark.slow
def test_image_build_of_the_npu_stack_bakes_what_the_base_scripts_export(tmp_path):
    """The whole flow: Dockerfile.npu's steps (npu-910b, the smoke pins, less NOT_NEEDED_FOR_THE_BAKE) on a base
    holding the stand-in CANN tree: the build records the scripts' environment, `image build` bakes it, a bypassing
    command sees it."""
    from docker_helpers import NPU_OVERRIDES, build_options, kept_base, wheelhouse_dir

    from trainbox.image.build import build

    client = docker_client()
    # The stand-in CANN base: the substitute Debian with the stand-in tree, and python3-venv because a stack
    # built on a base other than its declared substitute uses the base's own Python (as a cann base ships one).
    # Kept between runs (kept_base), so that a warm engine answers the npu-910b layers built on it.
    base = kept_base("trainbox-test/cann-standin-base",
                     "RUN apt-get -o Acquire::Retries=5 update && DEBIAN_FRONTEND=noninteractive "
                     "apt-get install -y --no-install-recommends python3-venv && rm -rf /var/lib/apt/lists/*\n"
                     "COPY Ascend /usr/local/Ascend\n",
                     {f"Ascend/{rel}": body for rel, body in SCRIPTS.items()})
    tags = []
    try:
        sets = dict(NPU_OVERRIDES, **{f"{name}.install": "false" for name in NOT_NEEDED_FOR_THE_BAKE})
        out = build(build_options(stack="npu-910b", base=base, sets=sets,
                                  wheelhouse=str(wheelhouse_dir()), report=str(tmp_path / "report.json")))
        tags = out.tags
        baked = out.report["cann_env"]
        assert baked.get("already") or {"PATH", "LD_LIBRARY_PATH", "ASCEND_TOOLKIT_HOME", "ATB_HOME_PATH"} <= set(
            baked["names"]), baked
        bypass = env_of(client, out.tag, "--entrypoint", "")  # a Kubernetes `command:`
        assert bypass["ASCEND_TOOLKIT_HOME"] == HOME and bypass["ATB_HOME_PATH"].endswith("cxx_abi_1")
        assert bypass["PATH"].startswith(f"{HOME}/share/info/ascendnpu-ir/bin:") and "/opt/venv/bin" in bypass["PATH"]
        assert bypass["TB_STANDIN_QUOTES"] == QUOTES and bypass["VIRTUAL_ENV"] == "/opt/venv"
        assert client.inspect(out.tag)["Config"]["Entrypoint"][-1] == "trainbox-entrypoint"
    finally:
        for t in tags:
            client.run("rmi", "-f", t, check=False)
