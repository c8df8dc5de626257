"""`trainbox launch check --args`: a recipe's command, as its launcher would start it, through the framework's
own argument parser, in the recipe's image (or against a checkout mounted read-only into a container: never on
this host), without starting the job (host module). The parse itself is trainbox.runtime.argcheck, which ships in every image.

Two checks per recipe:
  imports  the entry's import closure resolves in the image (trainbox.runtime.importclosure): a package the image
           lacks fails here, naming the module, the file that imports it and its distribution
  args     the rendered arguments parse with the framework's parser, with the recipe's `check.stub` stand-ins
           (only device-only modules: trainbox.runtime.deviceonly); recipes with `check.args: none` take none
Each recipe ends `ok`, `fail`, or `not checked` (the entry is not in the image, `check.imports: none`, or the
host lacks the image's packages): a recipe that was not checked is never reported ok.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .recipe import REF_RE, Recipe, parse_words
from ..runtime.errors import TrainboxError
from .job import Job

PYTHONS = re.compile(r"^(python|python3(\.\d+)?)$")
CHECK_LABEL = "io.trainbox.check"
_STAND_IN = {"path": "/stand-in/{name}", "int": "1", "port": "29500", "host": "127.0.0.1"}


@dataclass
class ArgsCheck:
    """What runs: `python3 -m trainbox.runtime.argcheck` with these options, in `workdir`, with `env`."""

    recipe: str
    entry: list[str]  # ["--script", PATH] or ["--module", MOD]
    args: list[str]  # the command's arguments after the entry
    workdir: str | None
    env: dict[str, str] = field(default_factory=dict)
    stubs: list[str] = field(default_factory=list)
    parse: bool = True  # False: the entry takes no arguments (recipe check.args: none)
    strict: bool = False  # leftovers of parse_known_args fail (recipe check.strict)
    why: str | None = None
    imports: bool = True  # False: the entry is not in the image (recipe check.imports: none)
    # the recipe's `source:` scripts whose arrays the arguments take (`${NAME[@]}`), in order: (path, optional)
    sources: list[tuple[str, bool]] = field(default_factory=list)

    def argv(self, imports: bool, stub_missing: bool = False) -> list[str]:
        out = self._argv(imports, stub_missing)
        if imports or not self.sources:
            return out
        # the arrays live in scripts inside the image (or the mounted checkout): bash there sources them, as the
        # launcher's job script does, and puts each array's words where the command names it
        return ["bash", "-c", _WITH_ARRAYS, "argcheck", *[("?" if opt else "") + p for p, opt in self.sources],
                "--", *out]

    def _argv(self, imports: bool, stub_missing: bool = False) -> list[str]:
        out = ["python3", "-m", "trainbox.runtime.argcheck", "--json"] + (["--stub-missing"] if stub_missing else [])
        for mod in self.stubs:
            out += ["--stub", mod]
        if self.workdir:
            out += ["--path", self.workdir]
        out += ["--imports"] if imports else ["--strict"] if self.strict else []
        return out + self.entry + ["--", *([] if imports else self.args)]


#: a command word that stands for a `source` script's array (expand()); only a whole word can
ARRAY_WORD = "@trainbox-array:{}@"
# bash -c: source each script ("?PATH": only when present) with strict mode off, its output kept off stdout (the
# check's JSON), then run the command with each array marker replaced by that array's words. The names are the
# recipe's validated `arrays:` identifiers.
_WITH_ARRAYS = (
    'while [ "$1" != -- ]; do f=${1#\\?}; if [ "$f" != "$1" ] && [ ! -e "$f" ]; then shift; continue; fi; '
    'set +eu; . "$f" 1>&2 || exit 2; shift; done; shift; out=(); '
    'for a in "$@"; do case "$a" in @trainbox-array:*@) n=${a#@trainbox-array:}; n=${n%@}; '
    'eval "out+=(\\"\\${$n[@]}\\")";; *) out+=("$a");; esac; done; exec "${out[@]}"')


def _values(job: Job, code_dir: str | None) -> dict[str, str]:
    """Every name a command word may reference: inputs (given, default or a stand-in), the layout, the env."""
    recipe = job.recipe
    values = {**job.stack.env, **job.env}
    for name, spec in job.inputs.items():
        given = job.sets.get(name)
        values[name] = str(given if given is not None else spec.default if spec.default is not None
                           else _STAND_IN.get(spec.kind, "stand-in").format(name=name.lower()))
    if code_dir and recipe.code:
        values[recipe.code.input] = code_dir
    values.update({k: str(v) for k, v in recipe.layout().items()})
    for key, value in recipe.env.items():
        values[key] = expand(value, values)
    return values


def expand(word: str, values: dict[str, str], arrays: frozenset[str] = frozenset()) -> str:
    """`word` with ${NAME} filled in; a whole word ${NAME[@]} naming one of `arrays` (a `source` script's) becomes
    its marker, which the check's bash replaces by the array's words in the image."""
    m = REF_RE.fullmatch(word)
    if m and m.group(2) == "[@]" and m.group(1) in arrays:
        return ARRAY_WORD.format(m.group(1))

    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        if m.group(2) == "[@]":
            raise TrainboxError(f"{word!r}: the args check expands an array a `source` script defines only as a "
                                "word of its own")
        return values.get(m.group(1), "")

    return REF_RE.sub(one, word)


def _entry(recipe: Recipe, words: list[str], workdir: str | None) -> tuple[list[str], list[str]]:
    """(argcheck's --script/--module option, the arguments) from the command as the launcher runs it."""
    where = f"recipe {recipe.name}"
    if recipe.check.entry:
        stands_for = recipe.check.replaces.split() if recipe.check.replaces else words[:1]
        if words[:len(stands_for)] != stands_for:
            raise TrainboxError(f"{where}: check.replaces: {' '.join(stands_for)!r} is not how the command starts "
                                f"({' '.join(words[:3])!r} ...)")
        words = recipe.check.entry.split() + words[len(stands_for):]
    elif recipe.launcher != "torchrun" and words and PYTHONS.match(os.path.basename(words[0])):
        words = words[1:]
    if len(words) >= 2 and words[0] == "-m":
        return ["--module", words[1]], words[2:]
    if words and words[0].endswith(".py"):
        script = words[0] if os.path.isabs(words[0]) or not workdir else os.path.join(workdir, words[0])
        return ["--script", script], words[1:]
    raise TrainboxError(f"{where}: command starts with {words[0] if words else ''!r}, neither a .py script nor "
                        "`-m MODULE`: name the entry whose parser reads the arguments in check.entry "
                        "(and the words it stands for in check.replaces)")


def entry_words(recipe: Recipe) -> list[str] | None:
    """argcheck's --script/--module option for the recipe's entry, as unexpanded words (the job script's
    preflight renders them; a script path stays relative to the workdir it runs in). None: no Python entry."""
    words = [w for item in recipe.command for w in parse_words(item)]
    try:
        return _entry(recipe, words, None)[0]
    except TrainboxError:
        return None


def plan(job: Job, code_dir: str | None = None) -> ArgsCheck:
    recipe = job.recipe
    if code_dir and not recipe.code:
        raise TrainboxError(f"recipe {recipe.name}: --code needs the recipe's `code:` key (which input is the "
                            "workload's checkout)")
    values = _values(job, code_dir)
    items = recipe.command if recipe.check.args == "parse" else recipe.command[:1]  # no arguments: the entry only
    arrays = frozenset(a for s in recipe.source for a in s.arrays)
    words = [expand(w, values, arrays) for item in items for w in parse_words(item)]
    used = {w for w in words if w.startswith("@trainbox-array:")}
    sources = [(expand(s.path, values), s.optional) for s in recipe.source
               if any(ARRAY_WORD.format(a) in used for a in s.arrays)]
    workdir = expand(recipe.workdir, values) if recipe.workdir else None
    entry, args = _entry(recipe, words, workdir)
    env = {k: values[k] for k in recipe.env}
    return ArgsCheck(recipe.name, entry, args, workdir, env, list(recipe.check.stub), recipe.check.args == "parse",
                     recipe.check.strict, recipe.check.why, recipe.check.imports == "entry", sources)


def _result(proc_out: str, proc_err: str, rc: int, what: str) -> dict:
    from ..yamlfile import json_loads  # bounded: the report comes out of an image

    text = proc_out[proc_out.find("{"):] if "{" in proc_out else ""
    try:
        doc = json_loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        return doc
    except ValueError:
        tail = (proc_err.strip().splitlines() or proc_out.strip().splitlines() or [f"exit {rc}"])[-1]
        return {"ok": False, "error": f"{what} did not report (exit {rc}): {tail}"}


OK, FAIL, NOT_CHECKED = "ok", "fail", "not checked"


def _run_checks(check: ArgsCheck, run_one, skip_imports: str | None = None) -> dict:
    """The imports check, then the parse, each through run_one(imports) -> result. A check the recipe (or
    `skip_imports`) rules out is reported skipped with the reason, and the recipe is then `not checked`, never ok;
    an entry that takes no arguments has nothing to parse (checked: its imports ran)."""
    out = {"recipe": check.recipe, "stubs": check.stubs}
    for name, imports in (("imports", True), ("args", False)):
        if name == "args" and not check.parse:
            out[name] = {"ok": True, "skipped": True, "why": check.why, "nothing_to_parse": True}
        elif name == "imports" and not check.imports:
            out[name] = {"ok": False, "skipped": True, "why": check.why}
        elif name == "imports" and skip_imports:
            out[name] = {"ok": False, "skipped": True, "why": skip_imports}
        else:
            out[name] = run_one(imports)
    failed = [n for n in ("imports", "args") if not out[n].get("ok") and not out[n].get("skipped")]
    unchecked = out["imports"].get("skipped")
    out["status"] = FAIL if failed else NOT_CHECKED if unchecked else OK
    out["ok"] = out["status"] == OK
    if out["status"] == NOT_CHECKED:
        out["why"] = out["imports"].get("why") or "not checked"
    return out


#: where `--code` mounts trainbox's own runtime (argcheck) in the container, read-only
CHECK_PYTHON = "/opt/trainbox-check/python"


def _container(image: str, check: ArgsCheck, opts: list[str], stub_missing: bool, timeout: float):
    """run_one for _run_checks: argcheck in a throwaway container (no network, no capabilities), the image's own
    entrypoint in front."""
    from ..image.engine import find_client

    client = find_client()
    opts = ["run", "--rm", "--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--label", f"{CHECK_LABEL}={check.recipe}", *opts]
    if check.workdir:
        opts += ["-w", check.workdir]

    def one(imports: bool) -> dict:
        proc = client.run(*opts, image, *check.argv(imports, stub_missing=stub_missing and not imports),
                          timeout=timeout, check=False)
        return _result(proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"),
                       proc.returncode, f"the {'imports' if imports else 'args'} check in {image}")

    return one


def run_in_image(check: ArgsCheck, image: str, timeout: float = 300) -> dict:
    """Both checks in a throwaway container with no network, the image's own entrypoint in front."""
    env = [a for key, value in sorted(check.env.items()) for a in ("-e", f"{key}={value}")]
    return {**_run_checks(check, _container(image, check, env, False, timeout)), "image": image}


def run_with_code(check: ArgsCheck, code_dir: str, image: str | None = None, stub_missing: bool = False,
                  timeout: float = 300) -> dict:
    """Both checks against a checkout (`--code DIR`), in a container: the recipe's image (`--image`) or a plain
    Python one (trainbox's Debian base), with the checkout mounted read-only at its own path, trainbox's runtime
    beside it, the network off. Never on this host: the recipe's environment (a PYTHONPATH it chooses, and so a
    sitecustomize.py) and the checkout's code run only in there. `stub_missing`: modules the image lacks become
    stand-ins too (the parser stays the framework's own)."""
    from ..image.base import DEFAULT_TAG
    from ..paths import REPO_ROOT

    image = image or DEFAULT_TAG
    for path in (code_dir, str(REPO_ROOT / "python")):
        if "," in path or not os.path.isabs(path):
            raise TrainboxError(f"--code {code_dir}: an absolute path without ',' is needed to mount it")
    pythonpath = ":".join(p for p in (check.env.get("PYTHONPATH", ""), CHECK_PYTHON) if p)
    opts = ["--read-only", "--tmpfs", "/tmp",
            "--mount", f"type=bind,source={code_dir},target={code_dir},readonly",
            "--mount", f"type=bind,source={REPO_ROOT / 'python'},target={CHECK_PYTHON},readonly"]
    for key, value in sorted({**check.env, "PYTHONPATH": pythonpath}.items()):
        opts += ["-e", f"{key}={value}"]
    skip = "--stub-missing: the image lacks the workload's packages" if stub_missing else None
    if not (check.imports and not skip) and not check.parse:
        return {**_run_checks(check, None, skip), "image": image}  # nothing to run: no engine needed
    from ..image.engine import find_client

    if not find_client().image_exists(image):
        raise TrainboxError(f"--code runs the parser in a container: no image {image}; make it with `trainbox base "
                            "bootstrap`, or pass --image with the recipe's image")
    return {**_run_checks(check, _container(image, check, opts, stub_missing, timeout), skip), "image": image}


def summary(result: dict) -> str:
    """One line: what passed, the first failure, or why the recipe was not checked; with the recipe named."""
    name = result["recipe"]
    for step in ("imports", "args"):
        r = result.get(step) or {}
        if not r.get("ok") and not r.get("skipped"):
            return f"{name}: {step}: {r.get('error') or 'failed'}"
    stubs = f" (stand-ins: {', '.join(result['stubs'])})" if result.get("stubs") else ""
    imports, args = result.get("imports") or {}, result["args"]
    how = "no arguments to parse" if args.get("skipped") else f"the arguments parse{stubs}"
    if imports.get("skipped"):
        if args.get("skipped"):
            return f"{name}: not checked: {imports.get('why')}"
        # e.g. --stub-missing on a host without the image's packages: the parse ran, the imports did not
        return f"{name}: not checked: imports not checked ({imports.get('why')}); {how}"
    closure = f"{imports['modules']} modules of the entry's import closure resolve" if "modules" in imports \
        else "imports load"
    device = f" (device-only, not followed: {', '.join(imports['device_only'])})" if imports.get("device_only") \
        else ""
    return f"{name}: {closure}{device}, {how}"


__all__ = ["ArgsCheck", "CHECK_LABEL", "FAIL", "NOT_CHECKED", "OK", "entry_words", "expand", "plan", "run_in_image",
           "run_with_code", "summary"]
