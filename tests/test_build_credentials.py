"""The index credentials reach only the steps that install hash-pinned files from the index (issue 37): never a
step that runs a component's own build code (`install: build` commands of a url or git component, a git tree's
setup.py or PEP 517 backend, a compiled sdist), which could print them, or copy them into a wheel or a layer."""

from __future__ import annotations

import re

import pytest

from trainbox.image.render import render_stack
from trainbox.specs.stack import list_stacks, load_stack

SECRET_MOUNT = "id=pip_index_url"


def _runs(dockerfile: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", dockerfile)
    return [re.sub(r"\s+", " ", ln) for ln in joined.splitlines() if ln.startswith("RUN ")]


def _may_see_the_secret(run: str) -> bool:
    """A pip install from the index of hash-pinned files, and nothing else: the venv's pin steps
    (partials/pip_pinned.j2) and a source component's build-requirements step (install_source --mode build-env)."""
    if "trainbox.runtime.install_source" in run:
        return bool(re.search(r"install_source --component \S+ --mode build-env ", run)) and " --build " not in run
    return "python -m pip install" in run and "--require-hashes" in run and "--no-deps" in run


@pytest.mark.parametrize("name", list_stacks())
def test_only_pinned_installs_from_the_index_see_the_credentials(name):
    runs = _runs(render_stack(load_stack(name)).dockerfile)
    for run in runs:
        if SECRET_MOUNT in run or "/run/secrets/pip_index_url" in run or "/tmp/secrets/pip_index_url" in run:
            assert _may_see_the_secret(run), run[:400]
            assert SECRET_MOUNT in run  # the file is read only where the secret is mounted


def test_specforge_sglang_build_runs_without_the_credentials():
    """The case issue 37 found: sglang (source: url, install: build) ran `pip wheel` with the secret mounted."""
    text = render_stack(load_stack("specforge")).dockerfile
    runs = _runs(text)
    sglang = [r for r in runs if "--component sglang " in r]
    build = [r for r in sglang if "--mode build " in r]
    env = [r for r in sglang if "--mode build-env " in r]
    assert len(build) == 1 and len(env) == 1
    assert SECRET_MOUNT not in build[0] and "pip_index_url" not in build[0]
    # its build requirements come from their own stage, mounted read-only: that stage alone saw the secret
    assert "--mount=type=bind,from=build-env-sglang,source=/out/build-env,target=/tmp/trainbox/build-env" in build[0]
    assert "--build-env /tmp/trainbox/build-env" in build[0] and "--build-req" not in build[0]
    assert "export PIP_INDEX_URL=https://pypi.org/simple " in build[0]  # the stack's own URL: no credentials
    assert SECRET_MOUNT in env[0] and "--build-req 'setuptools==" in env[0] and "--build-env /out/build-env" in env[0]
    side = text[text.index("FROM system AS build-env-sglang"):text.index("FROM system AS builder")]
    assert "--component sglang \\\n      --mode build-env" in side


@pytest.mark.parametrize("name", ["npu-910b-megatron", "twinkle", "swift"])
def test_git_wheel_builds_get_their_build_requirements_from_a_step_before(name):
    runs = _runs(render_stack(load_stack(name)).dockerfile)
    builds = [r for r in runs if "install_source" in r and "--mode pip " in r and "--wheel-out " in r]
    assert builds, "a git component built into a wheel"
    for run in builds:
        assert SECRET_MOUNT not in run and "--build-env /out/build-env " in run
        key = re.search(r"--component (\S+) ", run).group(1)
        assert any(f"--component {key} --mode build-env " in r and SECRET_MOUNT in r for r in runs), key
        # the builder only installs the wheel built there: no credentials, no tree, no build code of its own
        install = [r for r in runs if f"--component {key} " in r and "--wheel-in " in r]
        assert len(install) == 1 and "pip_index_url" not in install[0] and "source=build/sources" not in install[0]


# ------------------------------------------------------------------------ credentials never in clear

import io  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import yaml  # noqa: E402

from trainbox.image.run import BuildFailed, _fail, write_report  # noqa: E402
from trainbox.image.engine import ConsoleProgress, Step  # noqa: E402
from trainbox.paths import STACKS_DIR  # noqa: E402
from trainbox.runtime.redact import redact, url_secrets  # noqa: E402
from trainbox.specs.stack import StackError  # noqa: E402

TOKEN = "s3cr3t-T0KEN"
INDEX = f"https://ci-bot:{TOKEN}@pypi.internal.example/simple"


@pytest.mark.parametrize("text, shown", [
    (f"Looking in indexes: {INDEX}", "Looking in indexes: https://ci-bot:****@pypi.internal.example/simple"),
    (f"x https://{TOKEN}@git.example/r.git y", "x https://****@git.example/r.git y"),
    ("ssh://git@github.com/o/r.git", "ssh://git@github.com/o/r.git"),
    ("https://pypi.org/simple", "https://pypi.org/simple"),
    (f"'{INDEX}'", "'https://ci-bot:****@pypi.internal.example/simple'"),
])
def test_redact_masks_a_urls_credentials(text, shown):
    assert redact(text) == shown


def test_redact_masks_the_given_secrets_without_their_url():
    assert redact(f"echo {TOKEN}; done", url_secrets(INDEX)) == "echo ****; done"
    assert url_secrets(f"https://{TOKEN}@h/simple") == [TOKEN]  # a token as the user name is the secret


def _failed_result(lines: list[str]):
    step = SimpleNamespace(name="[builder 7/9] RUN install_source --component sglang", log=lines)
    return SimpleNamespace(failed=step, error="process did not complete successfully: exit code: 1",
                           output_tail=lines, returncode=1)


def test_a_failed_build_never_prints_or_writes_the_token(tmp_path):
    """A build command that printed $PIP_INDEX_URL (or the bare token): the error line and the report mask it."""
    plan = SimpleNamespace(tag="trainbox/specforge:abc")
    report_path = tmp_path / "report.json"
    with pytest.raises(BuildFailed) as exc:
        _fail(plan, _failed_result([f"PIP_INDEX_URL={INDEX}", f"token {TOKEN}"]), {"stack": "specforge"},
              report_path, url_secrets(INDEX))
    assert TOKEN not in str(exc.value) and "ci-bot:****@" in str(exc.value)
    text = report_path.read_text()
    assert TOKEN not in text and "ci-bot:****@" in text
    assert json.loads(text)["error"]["last_lines"][1] == "token ****"


def test_a_report_masks_any_urls_credentials(tmp_path):
    write_report({"base": {"used": "x"}, "note": f"index {INDEX}"}, tmp_path / "r.json")
    assert TOKEN not in (tmp_path / "r.json").read_text()


def test_the_build_console_masks_the_token():
    out = io.StringIO()
    progress = ConsoleProgress(stream=out, verbose=True, secrets=url_secrets(INDEX))
    progress("log", Step(vertex=1, name="[builder 7/9] RUN x", index=7), f"{INDEX} {TOKEN}")
    assert TOKEN not in out.getvalue() and "****" in out.getvalue()


@pytest.mark.parametrize("where, change", [
    ("indexes.pypi", lambda d: d["indexes"].__setitem__("pypi", INDEX)),
    ("indexes.pytorch-cpu", lambda d: d["indexes"].__setitem__(
        "pytorch-cpu", f"https://{TOKEN}@download.pytorch.org/whl/cpu")),
    ("indexes.pypi", lambda d: d["indexes"].__setitem__("pypi", f"http://user:{TOKEN}@127.0.0.1:8080/simple")),
    ("indexes.pypi", lambda d: d["indexes"].__setitem__("pypi", f"https://:{TOKEN}@pypi.example/simple")),
])
def test_credentials_in_a_stack_url_are_refused_without_printing_them(tmp_path, capsys, where, change):
    """They would be written into a Dockerfile RUN line or build arg (the image's history): refused, in one line
    that names the key and masks the credentials."""
    from trainbox.cli import main

    d = tmp_path / "stacks"
    shutil.copytree(STACKS_DIR, d)
    data = yaml.safe_load((d / "cpu.yaml").read_text())
    change(data)
    (d / "cpu.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(StackError) as exc:
        load_stack(d / "cpu.yaml")
    assert where in str(exc.value) and "holds credentials" in str(exc.value) and TOKEN not in str(exc.value)
    assert main(["render", str(d / "cpu.yaml"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert TOKEN not in err and "holds credentials" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("field, value", [
    ("git", f"https://{TOKEN}@github.com/o/r.git"),
    ("git", f"https://x-access-token:{TOKEN}@github.com/o/r.git"),
    ("git", f"ssh://git:{TOKEN}@github.com/o/r.git"),
    ("url", f"https://u:{TOKEN}@files.example/x-1.0.tar.gz"),
])
def test_credentials_in_a_source_url_are_refused(tmp_path, field, value):
    from trainbox.specs.grammar import check_git_url, check_url

    with pytest.raises(ValueError, match="holds credentials") as exc:
        check_git_url(value) if field == "git" else check_url(value, ("https",))
    assert TOKEN not in str(exc.value)
    assert check_git_url("git@github.com:o/r.git") and check_git_url("ssh://git@github.com/o/r.git")
