"""`trainbox launch check --args`: a recipe's command through its framework's own parser, without starting the job.

Host runs use SpecForge's real scripts/train_domino.py at 61f9cb01 (../shared/upstream); docker runs use the cpu
stack's image and its cpu-ddp job, whose parser is argparse in launchers/jobs/cpu_ddp.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from upstream_helpers import checkout, find_shared_upstream

from trainbox.specs.kinds import TREE_ROOT
from trainbox.launch.recipecheck import plan
from trainbox.launch.job import resolve
from trainbox.launch.recipe import RecipeError, list_recipes, load_recipe
from trainbox.runtime.errors import TrainboxError
from trainbox.specs.stack import load_stack

SPECFORGE = "specforge-domino-qwen35-4b-npu"


def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "trainbox.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def recipe_file(tmp_path: Path, name: str, data: dict) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


# -- the recipe keys -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, needle", [
    ({"check": {"args": "none"}}, "why: say in one line"),
    ({"check": {"stub": ["torch npu"]}}, "expected a module name"),
    # a stand-in only for what needs the device: a package the stack lacks is installed, not stood in for
    ({"check": {"stub": ["torch_npu", "sglang"]}}, "'sglang' is not a device-only module"),
    ({"check": {"entry": "-m 1bad"}}, "expected `-m MODULE`"),
    ({"check": {"argz": "parse"}}, "argz"),
    ({"check": {"imports": "none", "why": "mounted"}}, "imports: none means the entry is not in the image"),
    ({"code": {"input": "TARGET_MODEL_PATH2", "component": "specforge"}}, "is not a path input"),
    ({"code": {"input": "NUM_EPOCHS", "component": "specforge"}}, "is not a path input"),
])
def test_bad_check_and_code_keys_are_refused_naming_the_key(tmp_path, extra, needle):
    with pytest.raises(RecipeError, match="(?s)" + needle.replace("(", r"\(").replace("`", "`")):
        load_recipe(recipe_file(tmp_path, "bad", {"extends": SPECFORGE, **extra}))


def test_code_input_defaults_to_the_image_tree_and_is_not_mounted(tmp_path):
    data = yaml.safe_load((Path(load_recipe(SPECFORGE).source_file)).read_text())
    data["inputs"]["CODE_DIR"].pop("default", None)
    data["code"] = {"input": "CODE_DIR", "component": "specforge"}
    recipe = load_recipe(recipe_file(tmp_path, "sf", data))
    assert recipe.inputs["CODE_DIR"].default == f"{TREE_ROOT}/specforge"
    assert recipe.inputs["CODE_DIR"].required is False
    job = resolve(str(tmp_path / "sf.yaml"), sets={"TARGET_MODEL_PATH": str(tmp_path),
                                                   "TRAIN_DATA_PATH": str(tmp_path), "OUTPUT_DIR": str(tmp_path / "o")})
    assert f"{TREE_ROOT}/specforge" not in job.mounts  # the image's copy: nothing from the host over it
    given = resolve(str(tmp_path / "sf.yaml"), sets={"TARGET_MODEL_PATH": str(tmp_path), "CODE_DIR": str(tmp_path),
                                                     "TRAIN_DATA_PATH": str(tmp_path),
                                                     "OUTPUT_DIR": str(tmp_path / "o")})
    assert str(tmp_path) in given.mounts  # a checkout the user gives is mounted as before


def test_every_code_component_is_a_tree_in_the_recipes_stack():
    """A recipe's `code.component` must be a git component installed as a tree in its stack: the in-image path
    the recipe defaults to exists only then."""
    for name in list_recipes():
        recipe = load_recipe(name)
        if recipe.code is None:
            continue
        comps = load_stack(recipe.stack).components
        comp = comps.get(recipe.code.component)
        assert comp is not None, f"{name}: code.component {recipe.code.component!r} is not in stack {recipe.stack}"
        assert comp.source == "git" and comp.install == "tree", f"{name}: {recipe.code.component} is not a git tree"


# -- the plan: entry and arguments as the launcher runs them ------------------------------------------------

def test_plan_takes_a_torchrun_script_under_the_workdir(tmp_path):
    check = plan(resolve(SPECFORGE, sets={"CODE_DIR": "/src/sf"}, require_inputs=False, host_paths=False))
    assert check.entry == ["--script", "/src/sf/scripts/train_domino.py"]
    assert check.args[:2] == ["--target-model-path", "/stand-in/target_model_path"]
    assert "--num-anchors" in check.args and check.workdir == "/src/sf"


def test_plan_takes_python_dash_m_and_a_console_script_needs_an_entry(tmp_path):
    base = {"description": "d", "stack": "cpu", "launcher": "exec", "devices_per_node": 1}
    mod = recipe_file(tmp_path, "mod", {**base, "command": ["python3 -m pkg.train --lr 1e-5"]})
    assert plan(resolve(str(mod), require_inputs=False, host_paths=False)).entry == ["--module", "pkg.train"]
    con = recipe_file(tmp_path, "con", {**base, "command": ["megatron sft --lr 1e-5"]})
    with pytest.raises(TrainboxError, match="check.entry"):
        plan(resolve(str(con), require_inputs=False, host_paths=False))
    ok = recipe_file(tmp_path, "ok", {**base, "command": ["megatron sft --lr 1e-5"],
                                      "check": {"entry": "-m swift.cli._megatron.sft", "replaces": "megatron sft"}})
    check = plan(resolve(str(ok), require_inputs=False, host_paths=False))
    assert check.entry == ["--module", "swift.cli._megatron.sft"] and check.args == ["--lr", "1e-5"]
    wrong = recipe_file(tmp_path, "wrong", {**base, "command": ["megatron rlhf --lr 1e-5"],
                                            "check": {"entry": "-m swift.cli._megatron.sft",
                                                      "replaces": "megatron sft"}})
    with pytest.raises(TrainboxError, match="is not how the command starts"):
        plan(resolve(str(wrong), require_inputs=False, host_paths=False))


MOUNTED_WHY = "the workload's source is not in the image (a mounted checkout)"


def _mounted(tmp_path: Path) -> Path:
    """A Relax recipe as if Relax were not in the image: a mounted checkout, neither check possible."""
    return recipe_file(tmp_path, "relax-mounted", {"extends": "relax-qwen3-4b-4npu-colocate", "code": None,
                                                   "check": {"args": "none", "imports": "none", "why": MOUNTED_WHY}})


def test_a_mounted_workload_plans_from_its_entry_alone_and_says_why_nothing_ran(tmp_path):
    """A workload that is a mounted checkout (check: args none, imports none): the plan needs only the entry (the
    command's ${MODEL_ARGS[@]} comes from a script in that checkout), and the result names the reason instead of
    passing."""
    from trainbox.launch.recipecheck import run_with_code, summary

    check = plan(resolve(str(_mounted(tmp_path)), require_inputs=False, host_paths=False))
    assert check.entry == ["--module", "relax.entrypoints.train"] and check.args == [] and check.sources == []
    assert not check.parse and not check.imports
    out = run_with_code(check, "/nonexistent/relax")  # nothing to run: no container, no engine asked
    assert out["imports"]["skipped"] and out["args"]["skipped"]
    assert out["status"] == "not checked" and out["ok"] is False
    assert summary(out) == f"relax-mounted: not checked: {MOUNTED_WHY}"


def test_a_source_script_s_array_is_filled_in_where_the_command_names_it(tmp_path):
    """Relax's recipes take MODEL_ARGS from a script in Relax's tree (`source:`): the args check sources it inside
    the image, as the job script does, and puts the array's words where ${MODEL_ARGS[@]} stands."""
    from trainbox.launch.recipecheck import ARRAY_WORD

    check = plan(resolve("relax-qwen3-4b-4npu-colocate", require_inputs=False, host_paths=False))
    assert check.sources == [(f"{TREE_ROOT}/relax/scripts/models/qwen3-4B.sh", False)]
    assert ARRAY_WORD.format("MODEL_ARGS") in check.args and check.args[0] == "--resource"
    argv = check.argv(imports=False)
    assert argv[:2] == ["bash", "-c"] and check.argv(imports=True)[0] == "python3"
    script = tmp_path / "m.sh"
    script.write_text('echo sourced; MODEL_ARGS=(--num-layers 36 --rotary-base "1 000")\n')
    inner = argv[argv.index("--") + 1:]
    echo = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]
    proc = subprocess.run([*argv[:4], f"?{tmp_path}/absent.sh", str(script), "--", *echo, *inner[inner.index("--") + 1:]],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "sourced\n", proc.stderr
    words = json.loads(proc.stdout)
    at = check.args.index(ARRAY_WORD.format("MODEL_ARGS"))
    assert words[at:at + 4] == ["--num-layers", "36", "--rotary-base", "1 000"] and words[:at] == check.args[:at]


@pytest.mark.slow
def test_not_checked_is_never_printed_as_ok(tmp_path):
    """The CLI line and --json of a recipe that could not be checked say `not checked` with the reason; the exit
    status stays 0 (nothing failed), and the smoke decides whether that is accepted."""
    name, path = "relax-mounted", str(_mounted(tmp_path))
    p = cli("launch", "check", path, "--args")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"not checked  {name}: {MOUNTED_WHY}"), p.stdout
    assert not any(line.startswith("ok") for line in (p.stdout + p.stderr).splitlines())
    p = cli("launch", "check", path, "--args", "--json")
    out = json.loads(p.stdout)
    assert out["recipes"][0]["status"] == "not checked" and out["recipes"][0]["ok"] is False
    assert out["not_checked"] == [path] and "ok " not in p.stderr  # as the recipe was named


# -- runs against the pinned SpecForge checkout, mounted read-only into trainbox's Debian base --------------------

needs_upstream = pytest.mark.skipif(find_shared_upstream() is None, reason="../shared/upstream is missing")


@pytest.fixture(scope="module")
def specforge(tmp_path_factory):
    return checkout("SpecForge", tmp_path_factory.mktemp("up"))


def _with_code(tmp_path: Path, edit=None) -> Path:
    data = yaml.safe_load(Path(load_recipe(SPECFORGE).source_file).read_text())
    data["code"] = {"input": "CODE_DIR", "component": "specforge"}
    data["check"] = {"stub": ["torch_npu"]}
    if edit:
        edit(data)
    return recipe_file(tmp_path, "specforge-check", data)


@needs_upstream
@pytest.mark.slow
@pytest.mark.docker
def test_the_recipe_parses_with_specforges_parser(specforge, tmp_path):
    p = cli("launch", "check", str(_with_code(tmp_path)), "--args", "--code", str(specforge), "--stub-missing",
            "--json")
    out = json.loads(p.stdout)
    assert p.returncode == 0, p.stderr
    row = out["recipes"][0]
    assert row["args"]["args"]["ok"] and row["args"]["args"]["parser"] == "train_domino.py"
    assert row["args"]["stubs"] == ["torch_npu"] and "accelerate" in row["args"]["args"]["stubbed"]
    # the parse ran, the imports did not (the plain image lacks the workload's packages): not checked, never ok
    assert row["status"] == "not checked" and not row["ok"] and row["args"]["image"] == "local/debian:bookworm"
    assert row["args"]["summary"] == ("specforge-check: not checked: imports not checked (--stub-missing: the image "
                                      "lacks the workload's packages); the arguments parse (stand-ins: torch_npu)")
    p = cli("launch", "check", str(_with_code(tmp_path)), "--args", "--code", str(specforge), "--stub-missing")
    assert p.returncode == 0 and p.stdout.startswith("not checked  specforge-check: imports not checked"), p.stdout


@needs_upstream
@pytest.mark.slow
@pytest.mark.docker
def test_a_bogus_flag_fails_naming_the_flag_and_the_recipe(specforge, tmp_path):
    def bogus(data):
        data["command"] = [*data["command"], "--num-anchorz 16"]

    p = cli("launch", "check", str(_with_code(tmp_path, bogus)), "--args", "--code", str(specforge),
            "--stub-missing")
    assert p.returncode == 1
    assert "specforge-check: args: unrecognized arguments: --num-anchorz 16" in p.stderr


@needs_upstream
@pytest.mark.docker
def test_a_recipe_pythonpath_runs_nothing_on_the_host(specforge, tmp_path):
    """Issue 22's input: the recipe's env chooses a PYTHONPATH holding a sitecustomize.py (one outside the checkout,
    one inside it) that writes a marker. `launch check --args --code` used to run the parser on this host with that
    environment, and the marker appeared; now the parser runs in a container (network off, checkout read-only),
    and nothing is written here."""
    import docker_helpers

    docker_helpers.ensure_base()
    marker = tmp_path / "sitecustomize-ran"
    evil = tmp_path / "evil"
    evil.mkdir()
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran on the host')\n"
    (evil / "sitecustomize.py").write_text(code)
    checkout = tmp_path / "checkout"
    subprocess.run(["cp", "-a", str(specforge), str(checkout)], check=True)
    (checkout / "sitecustomize.py").write_text(code)

    def hostile(data):
        data["env"]["PYTHONPATH"] = f"{evil}:${{CODE_DIR}}"

    p = cli("launch", "check", str(_with_code(tmp_path, hostile)), "--args", "--code", str(checkout),
            "--stub-missing", "--json")
    assert not marker.exists(), "the recipe's sitecustomize.py ran on the host"
    row = json.loads(p.stdout)["recipes"][0]
    assert row["args"]["image"] == "local/debian:bookworm" and row["args"]["args"]["parser"] == "train_domino.py", row
    assert p.returncode == 0, p.stderr


# -- in the image -------------------------------------------------------------------------------------------

@pytest.mark.docker
def test_in_the_image_imports_and_args_are_checked_and_a_bogus_flag_fails(cpu_image, tmp_path):
    p = cli("launch", "check", "cpu-ddp", "--args", "--image", cpu_image, "--json")
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)["recipes"][0]
    imports = row["args"]["imports"]
    assert imports["ok"] and imports["missing"] == [] and imports["modules"] > 300  # torch's closure, not one line
    assert row["args"]["args"]["parser"] == "cpu_ddp.py" and row["status"] == "ok"

    bogus = recipe_file(tmp_path, "ddp-bogus", {"extends": "cpu-ddp", "command": [
        "${TRAINBOX_LAUNCHERS}/jobs/cpu_ddp.py --steps ${STEPS} --output-dir ${OUTPUT_DIR} --stepz 3"]})
    p = cli("launch", "check", str(bogus), "--args", "--image", cpu_image)
    assert p.returncode == 1 and "ddp-bogus: args: unrecognized arguments: --stepz 3" in p.stderr

    missing = recipe_file(tmp_path, "ddp-missing", {"extends": "cpu-ddp", "check": {"args": "none", "why": "w"},
                                                    "command": ["${TRAINBOX_LAUNCHERS}/jobs/nope.py"]})
    p = cli("launch", "check", str(missing), "--args", "--image", cpu_image)
    assert p.returncode == 1 and "ddp-missing: imports: cannot read the entry" in p.stderr


@pytest.mark.docker
def test_an_image_without_one_of_its_packages_fails_naming_the_module_and_its_importer(cpu_image, tmp_path):
    """The cpu stack's image less one package its entry's closure needs (typing_extensions: torch imports it at
    load, cpu_ddp.py imports torch): the check fails naming the module and the file of torch that imports it,
    though cpu_ddp.py itself never names it."""
    import os

    from docker_helpers import TEST_LABEL, docker_client

    client = docker_client()
    tag = f"trainbox-test/cpu-less-one:{os.getpid()}"
    (tmp_path / "Dockerfile").write_text(f"FROM {cpu_image}\nRUN python3 -m pip uninstall -y typing_extensions\n")
    proc = subprocess.run([client.docker, "build", "--network", "none", "--label", TEST_LABEL, "-t", tag,
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    try:
        p = cli("launch", "check", "cpu-ddp", "--args", "--image", tag, "--json")
        assert p.returncode == 1
        row = json.loads(p.stdout)["recipes"][0]
        assert row["status"] == "fail" and not row["ok"]
        imports = row["args"]["imports"]
        assert [m["module"] for m in imports["missing"]] == ["typing_extensions"]
        importer = imports["missing"][0]["imported_by"][0]
        assert "/site-packages/torch/" in importer and importer.split(":")[-1].isdigit()
        assert imports["missing"][0]["chain"][:2] == ["__main__", "torch"]
        assert "cpu-ddp: imports: 1 module(s) missing, first typing_extensions" in row["args"]["summary"]
        text = cli("launch", "check", "cpu-ddp", "--args", "--image", tag)
        assert text.returncode == 1 and "FAIL cpu-ddp" in text.stderr and "typing_extensions" in text.stderr
        assert not text.stdout.startswith("ok")
    finally:
        client.run("rmi", "-f", tag, check=False)


def test_the_job_script_preflight_imports_the_entry_and_explains_a_failure(tmp_path):
    """Inside the container, before the job starts, the rendered script imports what the entry imports: a missing
    package stops the job with the import named and what to do, and the entry itself never runs."""
    import os

    from trainbox.launch import load_stack_info
    from trainbox.launch.script import render_script

    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("import json\nimport nosuchpkg_for_preflight\nopen('RAN', 'w').write('x')\n")
    p = recipe_file(tmp_path, "needs-pkg", {"description": "d", "stack": "cpu", "launcher": "exec",
                                            "devices_per_node": 1, "workdir": str(work),
                                            "command": ["python3 train.py --lr 1"]})
    script = tmp_path / "job.sh"
    script.write_text(render_script(load_recipe(p), load_stack_info("cpu"), {}))
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "TRAINBOX_SKIP_PREFLIGHT": "0"})
    assert out.returncode != 0 and not (work / "RAN").exists()
    assert "nosuchpkg_for_preflight" in out.stderr
    assert "preflight entry failed" in out.stderr and "trainbox launch check needs-pkg --args" in out.stderr
    (work / "train.py").write_text("import json\nopen('RAN', 'w').write('x')\n")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and (work / "RAN").exists(), out.stderr


def test_args_check_without_the_image_names_it_and_the_command_that_builds_it(monkeypatch, capsys):
    """Issue 41 item 4: a missing image was "did not report (exit 125): See 'docker run --help'". The engine here
    is a stand-in that holds nothing (or only a hash-tagged substitute build)."""
    from types import SimpleNamespace

    from trainbox.image import engine, inventory
    from trainbox.cli import main

    monkeypatch.setattr(engine, "find_client", lambda: SimpleNamespace(image_exists=lambda ref: False))
    monkeypatch.setattr(inventory, "built_images", lambda stacks, client=None: [])
    assert main(["launch", "check", "twinkle-megatron-tp-8npu", "--args"]) == 1
    err = capsys.readouterr().err
    assert "no image trainbox/twinkle:latest here (stack twinkle)" in err
    assert "`trainbox image build twinkle`" in err and "--profile" in err and "ci/smoke-offline.yaml" in err
    assert "docker run --help" not in err
    assert main(["launch", "check", "specforge-domino-qwen35-4b-gpu", "--args"]) == 1
    err = capsys.readouterr().err
    assert "`trainbox image build specforge-cuda`" in err and "--profile" not in err  # the profile has no CUDA pins
    # the substitute build is tagged by its hash only: that tag is named
    monkeypatch.setattr(inventory, "built_images", lambda stacks, client=None: [
        SimpleNamespace(hash_tags=["trainbox/twinkle:0123456789ab"])])
    assert main(["launch", "check", "twinkle-megatron-tp-8npu", "--args"]) == 1
    assert "pass --image trainbox/twinkle:0123456789ab" in capsys.readouterr().err
