"""Issue 22: every value that reaches a Dockerfile or a shell is inert.

Starts from the inputs that got through: an index URL `https://pypi.org/simple;/path/to/script;` (it ran the script
as root in the builder) and a newline in `wheels:` (a new Dockerfile instruction). Both are refused in one line,
exit 2, nothing written. Then a property: every build template rendered with hostile values the grammar accepts
(a query string, globs, `$(...)` in free text and build commands) keeps the shell structure of the same stack
rendered with plain values -- each RUN line, split with shlex, has the same operators and the same words, the
hostile value landing whole in the word where the plain one was.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from trainbox.cli import main
from trainbox.paths import STACKS_DIR
from trainbox.image.render import render_stack
from trainbox.specs.stack import StackError, load_stack

ISSUE_URL = "https://pypi.org/simple;/path/to/script;"


def _stack_dir(tmp: Path, doc: dict, name: str = "cpu") -> Path:
    d = tmp / "stacks"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(STACKS_DIR / "cpu.lock", d / f"{name}.lock")
    path = d / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False))
    return path


def _cpu() -> dict:
    return yaml.safe_load((STACKS_DIR / "cpu.yaml").read_text())


def _one_line_exit_2(capsys, argv: list[str]) -> str:
    rc = main(argv)
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert rc == 2, (rc, cap.out, cap.err)
    assert "Traceback" not in cap.err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("url", [
    ISSUE_URL,
    "https://pypi.org/simple&/tmp/x&",
    "https://pypi.org/simple$(id)",
    "https://pypi.org/simple(id)",
    "https://pypi.org/simple|id",
    "https://pypi.org/simple!x",
    "https://pypi.org/simple*",
    "https://pypi.org/simple'x'",
])
@pytest.mark.parametrize("index", ["pypi", "pytorch-cpu"])
def test_an_index_url_with_shell_syntax_is_refused(tmp_path, capsys, url, index):
    doc = _cpu()
    doc["indexes"][index] = url
    path = _stack_dir(tmp_path, doc)
    # `stack validate` says FAIL (it let this one pass before), with the status render gives: invalid input, 2
    assert main(["stack", "validate", "--strict", str(path)]) == 2
    assert f"indexes.{index}" in capsys.readouterr().err
    out = tmp_path / "out"
    err = _one_line_exit_2(capsys, ["render", str(path), "-o", str(out)])
    assert f"indexes.{index}" in err and "percent-encode" in err, err
    assert not out.exists(), "render wrote something for a refused stack"


def test_image_build_refuses_the_issue_url_before_any_build(tmp_path, capsys):
    """`image build` (not a dry run) stops at the stack: no engine call, no context staged, no tag."""
    doc = _cpu()
    doc["indexes"]["pypi"] = ISSUE_URL
    path = _stack_dir(tmp_path, doc)
    err = _one_line_exit_2(capsys, ["image", "build", str(path), "-o", str(tmp_path / "report.json")])
    assert "indexes.pypi" in err and not (tmp_path / "report.json").exists()


def test_the_issue_url_is_refused_through_set_too(tmp_path, capsys):
    path = _stack_dir(tmp_path, _cpu())
    with pytest.raises(StackError, match="percent-encode"):
        load_stack(path, sets={"numpy.url": ISSUE_URL})


def _git_build_component(**extra) -> dict:
    comp = {"source": "git", "git": "https://example.org/kernels.git", "commit": "a" * 40, "install": "build",
            "build": ["python setup.py bdist_wheel"], "wheels": "dist/*.whl"}
    comp.update(extra)
    return comp


@pytest.mark.parametrize("field,value", [
    ("wheels", "dist/*.whl\nRUN touch /tmp/pwned"),
    ("wheels", "dist/*.whl\rRUN touch /tmp/pwned"),
    ("wheels", "dist/$(id).whl"),
    ("wheels", "dist/*.whl; touch x"),
    ("wheels", "../*.whl"),
    ("build", ["make\nRUN touch /tmp/pwned"]),
    ("build", ["make\u2028RUN touch /tmp/pwned"]),
])
def test_a_newline_in_wheels_or_build_is_refused(tmp_path, capsys, field, value):
    doc = _cpu()
    doc["components"]["kernels"] = _git_build_component(**{field: value})
    path = _stack_dir(tmp_path, doc)
    assert main(["stack", "validate", str(path)]) == 2  # invalid input, as render says below
    capsys.readouterr()
    out = tmp_path / "out"
    err = _one_line_exit_2(capsys, ["render", str(path), "-o", str(out)])
    assert "components.kernels" in err and field in err, err
    assert not out.exists()


# --------------------------------------------------------------------------------------- the property

def _fields(v: dict) -> dict:
    """A stack that reaches every build template (system stage, builder with a git build, install with an
    extra index, env, labels) with the values `v` in the fields that end in a shell or a Dockerfile."""
    doc = _cpu()
    doc["description"] = v["description"]
    doc["indexes"]["pypi"] = v["pypi"]
    doc["indexes"]["pytorch-cpu"] = v["extra"]
    doc["env"]["HOSTILE"] = v["env"]
    doc["build_packages"] = [v["deb"]]
    doc["components"]["kernels"] = _git_build_component(git=v["git"], build=[v["build"]], wheels=v["wheels"])
    doc["components"]["numpy"]["extras"] = [v["extra_name"]]
    return doc


PLAIN = {"description": "PLAINDESC", "pypi": "https://plain.example/simple", "extra": "https://plain2.example/x",
         "env": "PLAINENV", "deb": "libplain", "git": "https://plain.example/git.git", "build": "PLAINBUILD",
         "wheels": "plainwheels", "extra_name": "plainextra"}
# accepted by the grammar, and each full of what a shell or a Dockerfile would act on
HOSTILE = {
    "description": 'say "hi" $(touch /tmp/pwned) ${PATH} `id` #; & | ( ) \'q\' ~ * ?',
    # (no user:password@: the grammar refuses credentials in a stack's URLs, test_build_credentials)
    "pypi": "https://pypi.example:8443/simple/?a=b#frag[1]~x,y+z=%24%28id%29",
    "extra": "https://e.example/~user/simple?x=1,2#top",
    "env": "$(touch /tmp/pwned); `id` && x || y > /tmp/f < /etc/passwd # c 'q' \"dq\"",
    "deb": "lib++-dev=1:2.3~rc1+b2",
    "git": "https://git.example/~o/r.git?ref=a#b[c]",
    "build": "echo \"$(id)\" 'single' && make -j$(nproc) > /tmp/log; touch /tmp/built # end \\ x",
    "wheels": "dist/[a-z]*?.whl",
    "extra_name": "Some_Extra.x-1",
}


def _runs(dockerfile: str) -> list[str]:
    """Each RUN instruction's shell command (continuations joined, --mount options dropped)."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    out = []
    for line in joined.splitlines():
        if line.startswith("RUN "):
            words = line[4:].lstrip()
            while words.startswith("--mount="):
                words = words.split(None, 1)[1]
            out.append(words)
    return out


def _tokens(cmd: str) -> list[str]:
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    return list(lex)


def _instructions(dockerfile: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", dockerfile)
    return [ln.split()[0] for ln in joined.splitlines() if ln.strip() and not ln.startswith("#")]


def _render(tmp: Path, values: dict) -> str:
    path = _stack_dir(tmp, _fields(values))
    return render_stack(load_stack(path)).dockerfile


def test_every_template_keeps_its_shell_structure_with_hostile_values(tmp_path):
    plain = _render(tmp_path / "plain", PLAIN)
    hostile = _render(tmp_path / "hostile", HOSTILE)
    assert _instructions(plain) == _instructions(hostile)
    assert "install_source" in plain and "apt-get" in plain and "pip install" in plain  # builder, apt, install
    p_runs, h_runs = _runs(plain), _runs(hostile)
    assert len(p_runs) == len(h_runs) >= 4
    for p_cmd, h_cmd in zip(p_runs, h_runs):
        p_tok, h_tok = _tokens(p_cmd), _tokens(h_cmd)
        assert len(p_tok) == len(h_tok), f"word count changed:\n{p_cmd}\n{h_cmd}"
        for pw, hw in zip(p_tok, h_tok):
            # the value itself where the shell removed the quotes; its quoted form inside a $(...) word
            raw, quoted = pw, pw
            for k in PLAIN:
                raw, quoted = raw.replace(PLAIN[k], HOSTILE[k]), quoted.replace(PLAIN[k], shlex.quote(HOSTILE[k]))
            assert hw in (raw, quoted), f"word {pw!r} became {hw!r}"
    # the words a value lands in are exactly the value (after the shell removes the quotes)
    words = {w for cmd in h_runs for w in _tokens(cmd)}
    for k in ("build", "wheels", "git", "deb"):
        assert HOSTILE[k] in words, k
    assert "/tmp/pwned" not in "".join(w for w in words if w not in (HOSTILE["build"],) and "pwned" not in w)


def test_the_index_url_is_one_quoted_word_in_every_install_step(tmp_path):
    text = _render(tmp_path, HOSTILE)
    quoted = shlex.quote(HOSTILE["pypi"])
    lines = [ln for ln in text.splitlines() if "PIP_INDEX_URL=" in ln]
    # torch's own layer and the other pins (the secret, else the stack's URL); the source component's build (the
    # stack's URL only: it runs the component's own code, which never sees the credentials)
    assert len(lines) == 3, lines
    assert sum(f"|| echo {quoted})\"" in ln for ln in lines) == 2, lines
    assert sum(f"export PIP_INDEX_URL={quoted} " in ln for ln in lines) == 1, lines


def test_a_control_character_is_refused_whatever_template_prints_it(tmp_path):
    """The environment's finalize: even a field that bypassed the grammar cannot put a newline into a build file."""
    from trainbox.image.render import _env
    from trainbox.runtime.errors import TrainboxError

    tpl = _env().from_string("RUN echo {{ value }}\n")
    assert tpl.render(value="ok") == "RUN echo ok\n"
    for bad in ("x\nRUN touch /tmp/pwned", "x\r", "x\x00", "x\u2028y", "x\x1b[2J"):
        with pytest.raises(TrainboxError, match="control characters"):
            tpl.render(value=bad)
    stack = load_stack(_stack_dir(tmp_path, _fields(PLAIN)))
    # past the schema (copies made without validation): still refused when rendered
    comp = stack.components["kernels"].model_copy(update={"wheels": "dist/*.whl\nRUN touch /tmp/pwned"})
    bad = stack.model_copy(update={"components": {**stack.components, "kernels": comp}})
    with pytest.raises(TrainboxError, match="control characters"):
        render_stack(bad)
    bad = stack.model_copy(update={"indexes": {**stack.indexes, "pypi": "https://x\nRUN touch /tmp/pwned"}})
    with pytest.raises(TrainboxError, match="control characters"):
        render_stack(bad)


# ------------------------------------------------------------------------ unpacking in the builder

@pytest.mark.parametrize("kind,name,link", [
    ("file", "../../tmp/trainbox-escape", ""),
    ("file", "/tmp/trainbox-escape-abs", ""),
    ("symlink", "wheels", "/etc"),
    ("symlink", "ok", "inside.whl"),  # even one inside: an archive of wheels needs no link
    ("hardlink", "passwd", "/etc/passwd"),
    ("device", "null", ""),
])
def test_the_builder_unpacks_archives_with_its_own_member_checks(tmp_path, monkeypatch, kind, name, link):
    """install_source runs in the builder, whose Python (Debian's 3.11.2) has no tar extraction filter: the
    members are checked by hand, so a `../`, absolute, link or device member is refused, whatever the Python."""
    import argparse
    import hashlib
    import io
    import tarfile

    from trainbox.runtime import install_source as inst

    monkeypatch.delattr(tarfile, "data_filter", raising=False)  # the builder's Python
    staged = tmp_path / "sources" / "demo"
    staged.mkdir(parents=True)
    archive = staged / "wheels.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        good = tarfile.TarInfo("inside.whl")
        good.size = 2
        tar.addfile(good, io.BytesIO(b"PK"))
        ti = tarfile.TarInfo(name)
        ti.type = {"file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                   "device": tarfile.CHRTYPE}[kind]
        ti.linkname = link
        tar.addfile(ti, io.BytesIO(b"") if kind == "file" else None)
    args = argparse.Namespace(sources_dir=tmp_path / "sources", component="demo",
                              sha256=hashlib.sha256(archive.read_bytes()).hexdigest())
    with pytest.raises(inst.SourceFailed, match="refused: .*nothing was unpacked"):
        inst._install_archive(args, tmp_path / "work")
    assert not Path("/tmp/trainbox-escape").exists() and not Path("/tmp/trainbox-escape-abs").exists()
    assert not (tmp_path / "work" / "archive").exists()


# ------------------------------------------------------------------------ YAML that ended in a traceback

def test_a_20000_deep_yaml_list_is_one_line(tmp_path, capsys):
    path = tmp_path / "stacks" / "deep.yaml"
    path.parent.mkdir()
    path.write_text("name: deep\nsystem_packages: " + "[" * 20000 + "]" * 20000 + "\n")
    err = _one_line_exit_2(capsys, ["render", str(path), "-o", str(tmp_path / "out")])
    # trainbox's own bound (64 levels) where the parser reads that deep; PyYAML 6.0.4's libyaml parser stops
    # first (at 1000 levels) with its own words. Either way: one line naming the file, exit 2, nothing written.
    assert re.search(r"nested more than 64 levels deep|malformed YAML: exceeded maximum nesting depth", err), err
    assert str(path) in err
    assert not (tmp_path / "out").exists()


def test_a_5001_digit_nodes_is_one_line(tmp_path, capsys):
    from trainbox.paths import REPO_ROOT
    from trainbox.launch.recipe import RecipeError, load_recipe

    path = tmp_path / "cpu-ddp.yaml"
    path.write_text((REPO_ROOT / "launchers/recipes/cpu-ddp.yaml").read_text()
                    .replace("launcher: torchrun\n", "launcher: torchrun\nnodes: " + "9" * 5001 + "\n"))
    with pytest.raises(RecipeError, match=r"cpu-ddp.yaml: malformed YAML: .*4300") as exc:
        load_recipe(path)
    assert len(str(exc.value).splitlines()) == 1


# ------------------------------------------------------------------------ recipe path inputs with reach

@pytest.mark.parametrize("default", ["/var/run/docker.sock", "/run/containerd/containerd.sock",
                                     "/var/lib/docker/volumes", "SOCKET"])
def test_the_docker_socket_as_a_recipe_path_input_is_refused(tmp_path, default):
    """A recipe input defaulting to the engine's socket was mounted into the job (read-only does not protect
    the API): refused, as is any host control path or a socket anywhere (a link to one included)."""
    import socket

    from trainbox.launch.job import resolve
    from trainbox.paths import REPO_ROOT
    from trainbox.runtime.errors import TrainboxError

    if default == "SOCKET":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(tmp_path / "engine.sock"))
        (tmp_path / "innocent").symlink_to(tmp_path / "engine.sock")
        default = str(tmp_path / "innocent")
    recipe = tmp_path / "cpu-ddp.yaml"
    recipe.write_text((REPO_ROOT / "launchers/recipes/cpu-ddp.yaml").read_text().replace(
        "  OUTPUT_DIR:\n", f"  SOCK:\n    description: the engine\n    kind: path\n    mount: ro\n"
        f"    default: {default}\n    required: false\n  OUTPUT_DIR:\n", 1))
    with pytest.raises(TrainboxError, match="host control path") as exc:
        resolve(str(recipe), host_paths=True, check_paths=False, require_inputs=False)
    assert len(str(exc.value).splitlines()) == 1


def test_compiled_components_build_without_the_index_credentials(tmp_path):
    """`install: build` commands are the stack's own shell: the RUN that runs them mounts no pip_index_url secret
    (it read the credentials and copied them into the image), while the pinned-wheel install keeps it."""
    text = re.sub(r"\\\n", " ", _render(tmp_path, PLAIN))
    runs = [ln for ln in text.splitlines() if ln.startswith("RUN ")]
    build = [r for r in runs if "--component kernels" in r]
    pip = [r for r in runs if "--require-hashes" in r]
    assert len(build) == 1 and len(pip) == 2  # torch's own layer, the other pins
    assert "id=pip_index_url" not in build[0] and all("id=pip_index_url" in r for r in pip)
    assert "export PIP_INDEX_URL=https://plain.example/simple " in build[0]  # the stack's own URL: no credentials


# ------------------------------------------------------------------------ links to files that are not ours

@pytest.mark.parametrize("via", ["extends", "stack", "recipe"])
def test_a_link_to_a_secret_file_is_refused_without_echoing_it(tmp_path, capsys, via):
    """`extends:` a sibling that links to a shadow-like file, or a stack or recipe that is such a link: refused
    before it is read, so none of its lines appears in the error."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$y$j9T$SECRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    d = tmp_path / "stacks"
    d.mkdir()
    if via == "extends":
        (d / "parent.yaml").symlink_to(secret)
        (d / "child.yaml").write_text("name: child\nextends: parent\n")
        argv = ["render", str(d / "child.yaml"), "-o", str(tmp_path / "out")]
    elif via == "stack":
        (d / "cpu.yaml").symlink_to(secret)
        argv = ["render", str(d / "cpu.yaml"), "-o", str(tmp_path / "out")]
    else:
        (d / "job.yaml").symlink_to(secret)
        argv = ["launch", "render", str(d / "job.yaml"), "-o", str(tmp_path / "job.sh")]
    err = _one_line_exit_2(capsys, argv)
    assert "nothing was read" in err and "SECRETHASH" not in err and "daemon" not in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "job.sh").exists()
