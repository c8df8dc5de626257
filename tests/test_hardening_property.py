"""Issue 14, property test: generated hostile strings in every stack and recipe field, and through --set.

Each value holds newlines, quotes, `$()`, backticks, `{{ }}`, unicode controls ... and a command that would create
a marker file. For every field the value is either refused at validation, or what it reaches is inert: the
Dockerfile keeps exactly the instructions of the clean stack and passes hadolint; the launcher script passes
`bash -n` and shellcheck, and run with stub commands it never creates the marker. The generator is seeded
(TRAINBOX_FUZZ_SEED to vary it, TRAINBOX_FUZZ_N for more values).
"""

from __future__ import annotations

import copy
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainbox.launch import StackInfo, check_script, render_script
from trainbox.paths import STACKS_DIR
from trainbox.launch.recipe import RecipeError, load_recipe
from trainbox.image.render import render_stack
from trainbox.runtime.errors import TrainboxError
from trainbox.specs.stack import StackError, load_stack

SEED = int(os.environ.get("TRAINBOX_FUZZ_SEED", "14"))
N = int(os.environ.get("TRAINBOX_FUZZ_N", "12"))
HADOLINT = shutil.which("hadolint")
SHELLCHECK = shutil.which("shellcheck")


def hostile_values(marker: Path, n: int = N, seed: int = SEED) -> list[str]:
    """`n` seeded hostile strings, each carrying a command that would create `marker` if it ran."""
    m = str(marker)
    fragments = [
        f"$(touch {m})", f"`touch {m}`", f"; touch {m}", f"\ntouch {m}\n", f"\nRUN touch {m}\nENV X",
        f"' ; touch {m} ; '", f'" ; touch {m} ; "', f"${{IFS}}touch${{IFS}}{m}", f"|| touch {m}", f"&& touch {m}",
        "{{ 7*7 }}", "{% if true %}x{% endif %}", "{# c #}", "\\", "\\\n", "\r", "\t", "\x00", "\u202e", "\u200b",
        "\u2028", "\x1b[2J", "$HOME", "${PATH}", "#", " ", "é", "-", "--", "..", "/", "=", ",",
    ]
    rng = random.Random(seed)
    out = [f"$(touch {m})", f"x\nRUN touch {m}", f"`touch {m}`"]  # the issue's own examples always come first
    while len(out) < n:
        base = rng.choice(["", "2.9.0", "abc", "FOO", "https://example.org/simple", "debian:bookworm"])
        parts = [base] + [rng.choice(fragments) for _ in range(rng.randint(1, 3))]
        rng.shuffle(parts)
        out.append("".join(parts))
    return out[:n]


# ------------------------------------------------------------------------------------------ stacks

_SPECIAL = set("\n\r\t\x00'\"$`\\;|&<>(){} #*?!~")


def plain(value: str) -> bool:
    """No character a shell or a Dockerfile would act on (the generator also makes harmless values)."""
    return not (_SPECIAL & set(value)) and all(c.isprintable() and c.isascii() for c in value)

# where in a stack document each field lives; VALUE is replaced by the hostile string
STACK_FIELDS = {
    "name": lambda d, v: d.__setitem__("name", v),
    "description": lambda d, v: d.__setitem__("description", v),
    "base.image": lambda d, v: d["base"].__setitem__("image", v),
    "base.python": lambda d, v: d["base"].__setitem__("python", v),
    "base.substitute": lambda d, v: d["base"].__setitem__("substitute", v),
    "base.cann": lambda d, v: d["base"].__setitem__("cann", v),
    "system_packages": lambda d, v: d.__setitem__("system_packages", ["git", v]),
    "build_packages": lambda d, v: d.__setitem__("build_packages", [v]),
    "indexes.value": lambda d, v: d["indexes"].__setitem__("pytorch-cpu", v),
    "indexes.key": lambda d, v: d["indexes"].__setitem__(v, "https://example.org/simple"),
    "components.key": lambda d, v: d["components"].__setitem__(v, {"source": "pypi", "version": "1.0"}),
    "components.name": lambda d, v: d["components"]["numpy"].__setitem__("name", v),
    "components.version": lambda d, v: d["components"]["numpy"].__setitem__("version", v),
    "components.extras": lambda d, v: d["components"]["numpy"].__setitem__("extras", [v]),
    "components.note": lambda d, v: d["components"]["numpy"].__setitem__("note", v),
    "components.patches": lambda d, v: d["components"]["numpy"].__setitem__("patches", v),
    "components.git": lambda d, v: d["components"].__setitem__(
        "demo", {"source": "git", "git": v, "commit": "0" * 40, "install": False}),
    "components.ref": lambda d, v: d["components"].__setitem__(
        "demo", {"source": "git", "git": "https://example.org/r.git", "ref": v, "install": False}),
    "components.url": lambda d, v: d["components"].__setitem__(
        "demo", {"source": "url", "url": v, "sha256": ["0" * 64]}),
    "components.subdirectory": lambda d, v: d["components"].__setitem__(
        "demo", {"source": "git", "git": "https://example.org/r.git", "commit": "0" * 40, "subdirectory": v,
                 "install": False}),
    "env.key": lambda d, v: d["env"].__setitem__(v, "1"),
    "env.value": lambda d, v: d["env"].__setitem__("HOSTILE", v),
}
# --set COMPONENT.FIELD=VALUE reaches these
SET_FIELDS = ["numpy.version", "numpy.index", "torch.url", "torch.git", "torch.ref", "torch.commit", "numpy.sha256"]


def _instructions(dockerfile: str) -> list[str]:
    """The instruction keywords in order (continuation lines joined; comments dropped)."""
    return [line.split()[0].upper() for line in _lines(dockerfile)]


def _lines(dockerfile: str) -> list[str]:
    """The instructions, continuation lines joined, comments dropped (a Dockerfile ends a line only at \n)."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    return [line.strip() for line in joined.split("\n") if line.strip() and not line.lstrip().startswith("#")]


def _pairs(text: str) -> dict[str, str]:
    """The KEY=VALUE words of an ENV or LABEL instruction, each value as the builder reads it (BuildKit's shell
    lexer: "..." keeps everything but \\" \\\\ \\$ escapes, '...' is literal, \\x outside quotes is x). An
    unescaped $ would be expanded by the builder: it reads back as NUL + $, which no accepted value holds."""
    pairs, i, n = {}, 0, len(text)
    while i < n:
        while i < n and text[i] in " \t":
            i += 1
        key_end = text.index("=", i)
        key, i, val = text[i:key_end], key_end + 1, []
        while i < n and text[i] not in " \t":
            c = text[i]
            if c == '"':
                i += 1
                while text[i] != '"':
                    if text[i] == "\\" and text[i + 1] in '"$\\':
                        i += 1
                    elif text[i] == "$":
                        val.append("\0")
                    val.append(text[i])
                    i += 1
                i += 1
            elif c == "'":
                close = text.index("'", i + 1)
                val.append(text[i + 1:close])
                i = close + 1
            else:
                if c == "\\":
                    i += 1
                elif c == "$":
                    val.append("\0")
                val.append(text[i])
                i += 1
        pairs[key] = "".join(val)
    return pairs


def _parse(dockerfile: str) -> list[tuple[str, str | dict[str, str]]]:
    """Each instruction: ENV and LABEL as their decoded pairs, the others as their text."""
    out: list[tuple[str, str | dict[str, str]]] = []
    for line in _lines(dockerfile):
        word, _, rest = line.partition(" ")
        out.append((word.upper(), _pairs(rest) if word.upper() in ("ENV", "LABEL") else line))
    return out


@pytest.fixture(scope="module")
def clean_stack():
    doc = yaml.safe_load((STACKS_DIR / "cpu.yaml").read_text())
    return doc, _parse(render_stack(load_stack("cpu")).dockerfile)


def _write_stack(tmp: Path, doc: dict) -> Path:
    name = "cpu"
    d = tmp / "stacks"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(STACKS_DIR / "cpu.lock", d / f"{name}.lock")
    path = d / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return path


# Where a free-text stack field is meant to arrive in the Dockerfile: (instruction, key). A note reaches nothing.
FREE_TEXT_TARGETS = {"description": ("LABEL", "org.opencontainers.image.description"),
                     "env.value": ("ENV", "HOSTILE"), "components.note": None}


def _check_dockerfile(tmp: Path, text: str, clean: list, where: str, arrives: dict | None = None) -> None:
    """The Dockerfile as the builder parses it is the clean one, except that each (instruction, key) in `arrives`
    now holds its value, byte for byte (a new key in the last such instruction); it passes hadolint."""
    want = copy.deepcopy(clean)
    for (word, key), value in (arrives or {}).items():
        last = [i for i, (w, _) in enumerate(want) if w == word][-1]
        owner = next((i for i, (w, a) in enumerate(want) if w == word and key in a), last)
        want[owner][1][key] = value
    assert _parse(text) == want, f"{where}: the Dockerfile is not the clean one with the value where it belongs"
    _hadolint(tmp, text, where)


def _hadolint(tmp: Path, text: str, where: str) -> None:
    if HADOLINT:
        df = tmp / "Dockerfile"
        df.write_text(text)
        proc = subprocess.run([HADOLINT, "--no-color", "--failure-threshold", "error", str(df)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, f"{where}: hadolint: {proc.stdout}{proc.stderr}"


def _stack_outcome(path: Path, sets=None):
    try:
        stack = load_stack(path, sets=sets)
    except StackError:
        return "refused", None
    try:
        return "rendered", render_stack(stack).dockerfile
    except TrainboxError:
        return "refused", None  # e.g. a moved pin without hashes: nothing is produced either


@pytest.mark.parametrize("field", sorted(STACK_FIELDS))
def test_hostile_stack_fields_are_refused_or_inert(tmp_path, clean_stack, field):
    doc0, clean = clean_stack
    marker = tmp_path / "PWNED"
    outcomes = {}
    for i, value in enumerate(hostile_values(marker)):
        doc = copy.deepcopy(doc0)
        doc.setdefault("env", {})
        STACK_FIELDS[field](doc, value)
        path = _write_stack(tmp_path / f"case{i}", doc)  # a hostile name also fails "name = file name"
        outcome, text = _stack_outcome(path)
        outcomes[value] = outcome
        if text is None:
            continue
        # a structured field accepts only plain values: nothing a shell or a Dockerfile acts on gets through
        assert field in FREE_TEXT_TARGETS or plain(value), f"{field}={value!r} was accepted"
        target = FREE_TEXT_TARGETS.get(field)
        if field in FREE_TEXT_TARGETS:
            _check_dockerfile(tmp_path, text, clean, f"{field}={value!r}", {target: value} if target else None)
        else:  # a plain structured value: its destination is not this test's; the instructions stay the same
            assert _instructions(text) == [w for w, _ in clean], f"{field}={value!r}: the instructions changed"
            _hadolint(tmp_path, text, f"{field}={value!r}")
    assert not marker.exists()
    if field in FREE_TEXT_TARGETS:  # free text is taken, quoted: the generator's hostile values get through
        assert [v for v, o in outcomes.items() if o == "rendered" and not plain(v)], outcomes


@pytest.mark.parametrize("field", SET_FIELDS)
def test_hostile_set_values_are_refused(tmp_path, clean_stack, field):
    doc0, clean = clean_stack
    marker = tmp_path / "PWNED"
    path = _write_stack(tmp_path, copy.deepcopy(doc0))
    for value in hostile_values(marker):
        if "\x00" in value:
            continue  # cannot be a command-line argument at all
        outcome, text = _stack_outcome(path, sets={field: value})
        assert outcome == "refused" or plain(value), f"--set {field}={value!r} was accepted"
        if text is not None:
            assert _instructions(text) == [w for w, _ in clean], f"--set {field}={value!r}: the instructions changed"
            _hadolint(tmp_path, text, f"--set {field}={value!r}")
    assert not marker.exists()


def test_the_issue_env_key_adds_no_dockerfile_instruction(tmp_path, clean_stack):
    doc = copy.deepcopy(clean_stack[0])
    doc["env"]["FOO=1\nRUN touch /tmp/pwned\nENV BAR"] = "1"
    with pytest.raises(StackError, match=r"env.*environment variable name"):
        load_stack(_write_stack(tmp_path, doc))


def test_free_text_is_escaped_for_the_dockerfile(tmp_path, clean_stack):
    doc = copy.deepcopy(clean_stack[0])
    doc["description"] = 'say "hi" $(touch x) ${PATH} `id`'
    doc["env"]["HOSTILE"] = '$(touch x)"'
    text = render_stack(load_stack(_write_stack(tmp_path, doc))).dockerfile
    assert 'HOSTILE="\\$(touch x)\\""' in text
    assert '"say \\"hi\\" \\$(touch x) \\${PATH} `id`"' in text
    _check_dockerfile(tmp_path, text, clean_stack[1], "escaping",
                      {("LABEL", "org.opencontainers.image.description"): doc["description"],
                       ("ENV", "HOSTILE"): doc["env"]["HOSTILE"]})
    doc["env"]["HOSTILE"] = "a\\"  # a backslash before the closing quote: parsers disagree, so refused
    with pytest.raises(StackError, match="backslash"):
        load_stack(_write_stack(tmp_path, doc))


# ------------------------------------------------------------------------------------------ recipes

RECIPE = """\
description: a job
stack: cpu
launcher: torchrun
devices_per_node: 2
torchrun: {standalone: true}
inputs:
  DATA:
    description: data
    kind: path
    default: /data
  NAME:
    description: a name
    default: x
env:
  A: "1"
command:
  - train.py --data ${DATA} --name ${NAME}
"""

RECIPE_FIELDS = {
    "description": lambda d, v: d.__setitem__("description", v),
    "stack": lambda d, v: d.__setitem__("stack", v),
    "inputs.key": lambda d, v: d["inputs"].__setitem__(v, {"description": "d", "default": "1"}),
    "inputs.description": lambda d, v: d["inputs"]["NAME"].__setitem__("description", v),
    "inputs.default": lambda d, v: d["inputs"]["NAME"].__setitem__("default", v),
    "env.key": lambda d, v: d["env"].__setitem__(v, "1"),
    "env.value": lambda d, v: d["env"].__setitem__("A", v),
    "command.word": lambda d, v: d.__setitem__("command", [["train.py", v]]),
    "command.line": lambda d, v: d.__setitem__("command", ["train.py " + v]),
    "workdir": lambda d, v: d.__setitem__("workdir", v),
    "source.path": lambda d, v: d.__setitem__("source", [{"path": v, "optional": True}]),
    # the check fails, so that the hint is shown
    "preflight.hint": lambda d, v: d.__setitem__("preflight", [{"name": "n", "python": "raise SystemExit(1)",
                                                                 "hint": v}]),
    "preflight.python": lambda d, v: d.__setitem__("preflight", [{"name": "n", "python": v, "hint": "h"}]),
    "upstream": lambda d, v: d.__setitem__("upstream", [v]),
}

# Stand-ins for the programs the script starts: each records its argv, environment and working directory (one
# folder per call under $STUB_LOG). python3 -c (the preflight checks) runs the real interpreter and records its
# exit code; python3 -m (the entry's import check, which needs the image) and torchrun only record.
STUB = """#!/bin/bash
rec="$STUB_LOG/${EPOCHREALTIME/./}-$$-${0##*/}"
mkdir -p "$rec"
printf '%s\\0' "$@" > "$rec/argv"
env -0 > "$rec/env"
pwd -P > "$rec/cwd"
rc=0
if [[ ${0##*/} == python3 && ${1:-} == -c ]]; then "$REAL_PYTHON" "$@" || rc=$?; fi
echo "$rc" > "$rec/rc"
exit "$rc"
"""


@pytest.fixture
def stub_path(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("torchrun", "python3"):
        (bindir / name).write_text(STUB)
        (bindir / name).chmod(0o755)
    return bindir


def _read(path: Path) -> str:
    return path.read_bytes().decode()  # no newline translation: a carriage return must stay one


def _records(log: Path) -> list[dict]:
    out = []
    for d in sorted(log.iterdir()):
        env = dict(kv.split("=", 1) for kv in _read(d / "env").split("\0") if "=" in kv)
        out.append({"name": d.name.rsplit("-", 1)[1], "argv": _read(d / "argv").split("\0")[:-1],
                    "env": env, "cwd": (d / "cwd").read_text().strip(), "rc": int((d / "rc").read_text())})
    return out


def _run_script(tmp: Path, script: str, stub_path: Path, marker: Path, where: str):
    """Check the script's syntax, run it with the stand-ins; nothing may execute. Returns (process, records).
    Each script is kept (scripts/N.sh) for _shellcheck, which lints a test's scripts in one run."""
    scripts = tmp / "scripts"
    scripts.mkdir(exist_ok=True)
    path = scripts / f"{len(list(scripts.iterdir()))}.sh"
    path.write_text(script)
    (tmp / "where").mkdir(exist_ok=True)
    (tmp / "where" / path.name).write_text(where)
    assert check_script(script, None) == [], where  # bash -n
    log = tmp / "log"
    shutil.rmtree(log, ignore_errors=True)
    log.mkdir()
    env = {"PATH": f"{stub_path}:/usr/bin:/bin", "HOME": str(tmp), "TRAINBOX_LAUNCHERS": str(tmp),
           "STUB_LOG": str(log), "REAL_PYTHON": sys.executable, "LANG": "C.UTF-8"}
    proc = subprocess.run(["bash", str(path)], cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
    assert not marker.exists(), f"{where}: the marker file appeared: something ran"
    return proc, _records(log)


def _shellcheck(tmp: Path) -> None:
    """shellcheck over every script _run_script ran in this test (one process: it starts slowly)."""
    if not SHELLCHECK or not (tmp / "scripts").is_dir():
        return
    scripts = sorted((tmp / "scripts").iterdir())
    # excluded: the findings that say a value is literal data, i.e. inert (SC2016 "expressions don't
    # expand in single quotes", SC2089/SC2090 "quotes in this variable will be treated literally")
    proc = subprocess.run([SHELLCHECK, "--shell=bash", "--severity=warning", "--exclude=SC2016,SC2089,SC2090",
                           "--format=gcc", *map(str, scripts)], capture_output=True, text=True)
    bad = {Path(line.split(":", 1)[0]).name for line in proc.stdout.splitlines()}
    assert proc.returncode == 0, [(tmp / "where" / n).read_text() for n in sorted(bad)] + [proc.stdout]


def _job(proc, records, where: str) -> dict:
    """The one torchrun call of a script that ran to its command."""
    assert proc.returncode == 0, f"{where}: {proc.stderr}"
    runs = [r for r in records if r["name"] == "torchrun"]
    assert len(runs) == 1, f"{where}: torchrun ran {len(runs)} times"
    return runs[0]


def _recipe_outcome(tmp: Path, doc: dict):
    d = tmp / "recipes"
    d.mkdir(exist_ok=True)
    path = d / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    try:
        return load_recipe(path)
    except (RecipeError, TrainboxError):
        return None


# The clean recipe's command as torchrun receives it (the layout's own flags come first).
CLEAN_CMD = ["train.py", "--data", "/data", "--name", "x"]


def _cmd(job: dict) -> list[str]:
    return job["argv"][job["argv"].index("train.py"):]


def _clean_job(script: str, proc, records, value: str, where: str) -> None:
    """Free text the script only shows (comments, usage): the job runs exactly as the clean recipe's."""
    job = _job(proc, records, where)
    assert _cmd(job) == CLEAN_CMD and job["env"]["A"] == "1", where
    assert value in script, f"{where}: the text is not in the script"


def _prepare_recipe_field(tmp: Path, field: str, value: str) -> None:
    """What must exist for a value to be used: the working directory, the file to source."""
    if field == "workdir":
        (tmp / value).mkdir(parents=True, exist_ok=True)
    if field == "source.path":
        (tmp / value).parent.mkdir(parents=True, exist_ok=True)
        (tmp / value).write_text("export SOURCED=yes\n")


def _expect_recipe_field(tmp: Path, field: str, value: str, script: str, proc, records, where: str) -> None:
    """Where each recipe field's value is meant to arrive, byte for byte, in the command that ran."""
    if field in ("description", "inputs.description", "upstream"):
        return _clean_job(script, proc, records, value, where)
    if field == "preflight.python":
        check = [r for r in records if r["name"] == "python3" and r["argv"][:1] == ["-c"]]
        assert [r["argv"] for r in check] == [["-c", value]], where
        if check[0]["rc"]:
            assert proc.returncode == 2 and "preflight n failed: h" in proc.stderr, where
            assert not [r for r in records if r["name"] == "torchrun"], where
            return
        return _clean_job(script, proc, records, value, where)
    if field == "preflight.hint":  # the check fails on purpose: the hint is the message
        assert proc.returncode == 2, where
        assert proc.stderr.rstrip("\n").endswith(f"error: preflight n failed: {value}"), where
        assert not [r for r in records if r["name"] == "torchrun"], where
        return None
    job = _job(proc, records, where)
    if field == "inputs.default":
        assert job["env"]["NAME"] == value and _cmd(job) == ["train.py", "--data", "/data", "--name", value], where
    elif field == "env.value":
        assert job["env"]["A"] == value, where
    elif field == "command.word":
        assert _cmd(job) == ["train.py", value], where
    elif field == "command.line":
        assert _cmd(job) == ["train.py", *shlex.split(value)], where
    elif field == "workdir":
        assert job["cwd"] == os.path.realpath(tmp / value), where
    elif field == "source.path":
        assert job["env"].get("SOURCED") == "yes", where
    else:  # names and the stack: only plain values may pass, and then they reach the job unchanged
        assert plain(value), f"{where}: accepted"
        if field == "env.key":
            assert job["env"][value] == "1", where
        elif field == "inputs.key":
            assert job["env"][value] == "1", where
    return None


@pytest.mark.parametrize("field", sorted(RECIPE_FIELDS))
def test_hostile_recipe_fields_are_refused_or_inert(tmp_path, stub_path, field):
    marker = tmp_path / "PWNED"
    base = yaml.safe_load(RECIPE)
    stack = StackInfo("cpu", "cpu", {"OMP_NUM_THREADS": "1"})
    checked = 0
    for i, value in enumerate(hostile_values(marker)):
        doc = copy.deepcopy(base)
        RECIPE_FIELDS[field](doc, value)
        recipe = _recipe_outcome(tmp_path, doc)
        if recipe is None:
            continue
        try:
            script = render_script(recipe, stack)
        except TrainboxError:
            continue
        _prepare_recipe_field(tmp_path, field, value)
        proc, records = _run_script(tmp_path, script, stub_path, marker, f"{field}={value!r}")
        _expect_recipe_field(tmp_path, field, value, script, proc, records, f"{field}={value!r}")
        checked += 1
    _shellcheck(tmp_path)
    # free text and command words are taken (quoted); a name or the stack is refused unless plain
    if field not in ("env.key", "inputs.key", "stack"):
        assert checked, f"{field}: no value got through, so nothing was checked"


@pytest.mark.parametrize("name", ["NAME", "DATA", "A", "OMP_NUM_THREADS"])
def test_hostile_launch_set_values_stay_inert(tmp_path, stub_path, name):
    marker = tmp_path / "PWNED"
    recipe = _recipe_outcome(tmp_path, yaml.safe_load(RECIPE))
    stack = StackInfo("cpu", "cpu", {"OMP_NUM_THREADS": "1"})
    checked = 0
    for value in hostile_values(marker):
        try:
            script = render_script(recipe, stack, {name: value})
        except TrainboxError:
            continue  # refused (a NUL, a malformed kind)
        where = f"--set {name}={value!r}"
        job = _job(*_run_script(tmp_path, script, stub_path, marker, where), where)
        assert job["env"][name] == value, where  # a --set value is fixed: exported byte for byte
        flag = {"NAME": "--name", "DATA": "--data"}.get(name)
        if flag:
            cmd = _cmd(job)
            assert cmd[cmd.index(flag) + 1] == value, where
        checked += 1
    _shellcheck(tmp_path)
    assert checked, f"--set {name}: no value got through, so nothing was checked"


@pytest.mark.parametrize("key", ["FOO=1", "X$(touch M)", "A B", "1A", "A\nB"])
def test_stack_env_key_never_reaches_a_script_unchecked(key):
    # second line of defence: a stack env key that bypassed the schema is refused by the template
    recipe = load_recipe("cpu-ddp")
    with pytest.raises(TrainboxError, match="shell variable name"):
        render_script(recipe, StackInfo("cpu", "cpu", {key: "1"}))


def test_generator_is_hostile_enough():
    values = hostile_values(Path("/tmp/M"), n=200)
    joined = "".join(values)
    for needle in ("\n", "'", '"', "$(", "`", "{{", "\u202e", "\x00"):
        assert needle in joined
    assert len(set(values)) > 150
