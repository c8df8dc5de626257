"""Every `trainbox ...` command line of a Markdown file, checked against the CLI's own parser (test helper).

A line is taken from fenced and indented code blocks (continuation lines joined, the trailing `# comment` read for
`trainbox ...` too) and from inline code. Each is parsed by `trainbox.cli.build_parser()` exactly as the command
would parse it, then checked against the shipped stacks and recipes: named stacks and recipes exist, `--set NAME=`
names an input (or environment variable) of the recipe, `--set COMPONENT.FIELD=` a component of the stack, and no
deprecated spelling is used. Upper-case words (STACK, DIR, S) are placeholders; `[...]` marks optional parts, which
are checked as if given. The generated command reference is left out: it is the parser's own output.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
from dataclasses import dataclass

from trainbox.cli import build_parser
from trainbox.cli_reference import BEGIN, END
from trainbox.commands._args import finish

PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
_INLINE = re.compile(r"`(trainbox\s[^`]*)`")
_FENCE = re.compile(r"^\s*(```|~~~)")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Example:
    line: int  # 1-based line of the README where it starts
    text: str  # the command as written (continuations joined)
    inline: bool  # from inline code: may name a command without its required arguments


def _drop_generated(lines: list[str]) -> list[str]:
    out, inside = [], False
    for line in lines:
        if line.strip().startswith(BEGIN):
            inside = True
        if not inside:
            out.append(line)
        else:
            out.append("")  # keep line numbers
        if line.strip().startswith(END):
            inside = False
    return out


def _code_lines(lines: list[str]) -> tuple[list[tuple[int, str]], list[str]]:
    """(line number, code line) of every code block, and the prose with code lines blanked."""
    code, prose, fenced = [], [], False
    for i, line in enumerate(lines, 1):
        if _FENCE.match(line):
            fenced = not fenced
            prose.append("")
            continue
        indented = line.startswith("    ") and (not prose or not prose[-1].strip() or prose[-1] == "\0")
        if fenced or indented:
            code.append((i, line))
            prose.append("\0")  # marks a blanked code line, so that the next indented line continues the block
        else:
            prose.append(line)
    return code, ["" if p == "\0" else p for p in prose]


def _commands_in(code: str) -> list[str]:
    """`trainbox ...` commands in one shell line: after env assignments, and after `&&`, `;`, `|`."""
    out = []
    for part in re.split(r"&&|\|\||;|\|", code):
        try:
            words = shlex.split(part)  # keeps VAR="$(cmd args)" one word
        except ValueError:
            words = part.split()
        while words and _ENV.match(words[0]):
            words.pop(0)
        if words and words[0] == "trainbox":
            out.append(" ".join(shlex.quote(w) if any(c.isspace() for c in w) else w for w in words))
    return out


def extract(text: str) -> list[Example]:
    lines = _drop_generated(text.splitlines())
    code, prose = _code_lines(lines)
    found: list[Example] = []
    joined: list[tuple[int, str]] = []
    for i, line in code:
        if joined and joined[-1][1].endswith("\\"):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
        else:
            joined.append((i, line.rstrip()))
    for i, line in joined:
        command, _, comment = line.partition(" #") if not line.lstrip().startswith("#") else ("", "", line)
        found += [Example(i, c, False) for c in _commands_in(command)]
        comment = comment.lstrip("# ")
        found += [Example(i, m.group(1), True) for m in _INLINE.finditer(comment)]
        if comment.startswith("trainbox "):
            found.append(Example(i, comment.split(";")[0], False))
    text = "\n".join(prose)
    for m in _INLINE.finditer(text):
        found.append(Example(text.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()), True))
    return sorted(found, key=lambda e: e.line)


def argv(example: Example) -> list[str]:
    """The words the command line would pass: optional brackets opened, `...` dropped, stopped at a redirect."""
    words = []
    for w in shlex.split(example.text.replace("[", " ").replace("]", " ")):
        if w in (">", ">>", "2>", "<") or w.startswith((">", "2>")):
            break
        w = w.removesuffix("...")
        if w:
            words.append(w)
    return words[1:]  # without "trainbox"


@functools.cache
def _parser():
    return build_parser()  # parsing leaves no state in it: one for every line


def _parse(words: list[str]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = _parser().parse_args(words)
            finish(args)
        except SystemExit:
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            return None, lines[-1] if lines else "usage error"
    if "deprecated" in err.getvalue():
        return None, err.getvalue().strip().splitlines()[0]
    return args, None


def check(example: Example) -> str | None:
    """Why the example would not run as written (None when it parses and names what exists)."""
    words = argv(example)
    args, problem = _parse(words)
    if problem:
        if example.inline and ("arguments are required" in problem or "expected one argument" in problem):
            return None  # prose naming a command or option, e.g. `trainbox run`, `trainbox image build --bundle`
        return problem
    if not getattr(args, "func", None):
        return "names a command group without a subcommand"
    try:
        return _names(args)
    except Exception as exc:  # the tool's own refusal (TrainboxError and kin), in its words
        return f"{type(exc).__name__}: {exc}"


def _given(value) -> list[str]:
    values = value if isinstance(value, list) else [value] if value else []
    return [v for v in values if not PLACEHOLDER.match(v) and not v.endswith((".yaml", ".yml"))]


def _names(args) -> str | None:
    from trainbox.launch.recipe import list_recipes
    from trainbox.specs.stack import list_stacks

    stacks, recipes = set(list_stacks()), set(list_recipes())
    stack_names = _given(getattr(args, "stack", None)) + _given(getattr(args, "stacks", None))
    if getattr(args, "stack_cmd", None) == "diff":
        stack_names += _given(args.a) + _given(args.b)
    recipe_names = _given(getattr(args, "recipe", None)) + _given(getattr(args, "recipes", None))
    for name in stack_names:
        if name not in stacks:
            return f"no stack {name!r} (build/stacks/: {', '.join(sorted(stacks))})"
    for name in recipe_names:
        if name not in recipes:
            return f"no recipe {name!r} (launchers/recipes/)"
    sets = [s for s in getattr(args, "sets", None) or [] if "=" in s]
    if not sets:
        return None
    if hasattr(args, "recipe") or hasattr(args, "recipes"):
        return _recipe_sets(args, recipe_names, sets)
    return _stack_sets(args, stack_names or sorted(stacks), sets)


def _recipe_sets(args, recipe_names: list[str], sets: list[str]) -> None:
    from trainbox.launch.job import load_stack_info, parse_sets, split_sets
    from trainbox.launch.recipe import load_recipe

    for name in recipe_names:
        recipe = load_recipe(name)
        split_sets(recipe, load_stack_info(getattr(args, "stack", None) or recipe.stack), parse_sets(sets))
    return None


def _stack_sets(args, stack_names: list[str], sets: list[str]) -> None:
    from trainbox.specs.stack import load_stack, parse_sets

    for name in stack_names:
        mine = []
        for item in sets:
            prefix, colon, rest = item.partition(":")
            if colon and "=" not in prefix:  # smoke's STACK:COMPONENT.FIELD=VALUE
                if prefix == name:
                    mine.append(rest)
            else:
                mine.append(item)
        if mine:
            load_stack(name, sets=parse_sets(mine))
    return None
