"""One grammar for every `trainbox` command (stdlib only: it loads in images too).

The conventions, the way docker, git and kubectl keep theirs:

- The object a command acts on is positional: `trainbox stack show STACK`, `trainbox image build STACK`,
  `trainbox render [STACK...]`. A stack that only qualifies another object keeps the option form
  (`trainbox run RECIPE --stack S`, `trainbox patches edit COMPONENT --stack S`).
- Paths a command writes are `-o/--output`.
- `--json` prints one JSON document on stdout with a "schema" version; notes go to stderr.
- Exit status: 0 ok, 1 a check found problems (or the build/job failed), 2 usage or invalid input,
  130 interrupted, 141 output pipe closed early (e.g. `| head`).

Old spellings stay for one release as deprecated aliases that print a note on stderr.
"""

from __future__ import annotations

import argparse
import sys

from ..runtime.errors import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE

JSON_SCHEMA = 1
_ALIAS_PREFIX = "_alias__"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose subcommands report unknown arguments with their own usage.

    argparse hands a subcommand's leftovers back to the top-level parser, which then prints the top-level usage;
    here the innermost parser that saw them errors instead (and remembers itself for later usage errors)."""

    def format_usage(self) -> str:
        return self._required_shown(super().format_usage())

    def format_help(self) -> str:
        return self._required_shown(super().format_help())

    def _required_shown(self, text: str) -> str:
        # a positional that also has a deprecated --option spelling is optional to argparse, required to us
        for _dest, metavar in self.get_default("_required") or []:
            text = text.replace(f"[{metavar}]", metavar)
        return text

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error("unrecognized arguments: " + " ".join(extras))
        if not hasattr(ns, "_cmd_parser"):
            ns._cmd_parser = self  # the innermost (sub)command's parser: its usage goes with later errors
        return ns, extras


class DeprecatedAlias(argparse.Action):
    """An old spelling: collects its values for `finish()` to merge into the new one, with a note on stderr."""

    def __init__(self, option_strings, dest, use: str = "", **kwargs):
        self.use = use
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"trainbox: warning: {option_string} is deprecated and goes away in the next release; use {self.use}",
              file=sys.stderr)
        setattr(namespace, self.dest, (getattr(namespace, self.dest, None) or []) + [values])


def deprecated(p: argparse.ArgumentParser, option: str, target: str, use: str, metavar: str = "VALUE") -> None:
    """Accept `option` as an old spelling of the argument stored in `target` (hidden from --help)."""
    p.add_argument(option, action=DeprecatedAlias, dest=_ALIAS_PREFIX + target, use=use, metavar=metavar,
                   default=None, help=argparse.SUPPRESS)


def add_stacks(p: argparse.ArgumentParser, dest: str = "stacks", default_all: bool = True,
               help: str | None = None) -> None:
    """STACK... positional (none = every stack when default_all), with `--stack` as the deprecated spelling."""
    p.add_argument(dest, nargs="*", metavar="STACK",
                   help=help or ("stack names (build/stacks/NAME.yaml) or stack files"
                                 + ("; default: every stack" if default_all else "")))
    deprecated(p, "--stack", dest, "a positional STACK", metavar="STACK")


def add_stack(p: argparse.ArgumentParser, dest: str = "stack", required: bool = True, help: str | None = None) -> None:
    """One STACK positional, with `--stack` as the deprecated spelling."""
    p.add_argument(dest, nargs="?", metavar="STACK",
                   help=help or "stack name (build/stacks/NAME.yaml) or a stack file" + (" (required)" if required
                                                                                          else ""))
    deprecated(p, "--stack", dest, "a positional STACK", metavar="STACK")
    if required:
        p.set_defaults(_required=list(p.get_default("_required") or []) + [(dest, "STACK")])


def add_output(p: argparse.ArgumentParser, help: str, old: tuple[str, ...] = (), metavar: str = "PATH") -> None:
    """`-o/--output PATH`, the one spelling of "write it here"; `old` spellings stay as deprecated aliases."""
    p.add_argument("-o", "--output", metavar=metavar, help=help)
    for opt in old:
        deprecated(p, opt, "output", "-o/--output", metavar=metavar)


def add_json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true",
                   help=f"print {what} as one JSON document (with a \"schema\" version) on stdout")


def finish(args: argparse.Namespace) -> None:
    """Merge deprecated spellings into their new ones and check positionals that are required.

    Errors are usage errors of the subcommand that was called: its usage, exit status 2."""
    parser = getattr(args, "_cmd_parser", None)
    for key in [k for k in vars(args) if k.startswith(_ALIAS_PREFIX)]:
        values = getattr(args, key)
        delattr(args, key)
        if not values:
            continue
        target = key[len(_ALIAS_PREFIX):]
        current = getattr(args, target, None)
        if isinstance(current, list):
            setattr(args, target, list(current or []) + values)
        elif current in (None, "") or current == values[-1]:
            setattr(args, target, values[-1])
        else:
            _usage(parser, f"{target.upper()} given twice ({current!r} and {values[-1]!r}); give it once")
    for dest, metavar in getattr(args, "_required", None) or []:
        if not getattr(args, dest, None):
            _usage(parser, f"the following arguments are required: {metavar}")


def _usage(parser: argparse.ArgumentParser | None, message: str) -> None:
    if parser is None:
        print(f"trainbox: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    parser.error(message)


def group_help(p: argparse.ArgumentParser):
    """The handler of a command group called without a subcommand: its help, exit status 2."""
    def show(_args) -> int:
        p.print_help(sys.stderr)
        return EXIT_USAGE
    return show


def exits(p: argparse.ArgumentParser, problems: str | None = None, **others: str) -> None:
    """Declare a command's exit statuses: they end its --help and fill the README's command reference.

    `problems` is what exit status 1 means for this command (None: it has no check that can fail);
    `others` maps further codes, e.g. exits(p, "a patch fails", **{"3": "..."})."""
    codes = {EXIT_OK: "ok"}
    if problems:
        codes[EXIT_PROBLEMS] = problems
    codes[EXIT_USAGE] = "usage or invalid input"
    codes.update({int(k): v for k, v in others.items()})
    p.set_defaults(_exit_codes=codes)
    text = "Exit status: " + "; ".join(f"{c} {m}" for c, m in sorted(codes.items())) + "."
    p.epilog = f"{p.epilog}\n\n{text}" if p.epilog else text
