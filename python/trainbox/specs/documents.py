"""The document layer every user-written YAML file goes through: stacks, recipes, smoke profiles (host module).

A document is found by name or path (`named_file`), read as a mapping by the one YAML reader (`read_yaml`),
merged over the one it extends (`merge`), and its pydantic errors said one line each, naming file and key path
(`format_validation`). Each kind of document passes its own error class, so the exit codes stay its own.
"""

from __future__ import annotations

import copy
from pathlib import Path

from pydantic import ValidationError

from ..runtime.errors import TrainboxError
from ..yamlfile import load_yaml_file


def named_file(name_or_path: str | Path, directory: Path, what: str, error: type[TrainboxError] = TrainboxError,
               hint: str = "") -> Path:
    """A NAME in `directory` (NAME.yaml) or a path to a YAML file; `what` (stack, recipe) names it in errors.
    Shared by stacks and recipes so both look things up, and fail, the same way."""
    p = Path(name_or_path)
    try:
        p.is_file()
    except OSError as exc:  # a name too long for the file system, ...
        raise error(f"{str(p)[:80]}...: not a usable {what} name or path ({exc.strerror or exc})") from None
    if p.suffix in (".yaml", ".yml") or "/" in str(name_or_path) or p.is_file():
        if p.is_dir():
            raise error(f"{p}: is a directory, expected a {what} file")
        if not p.is_file():
            raise error(f"{p}: no such {what} file")
        return p
    path = directory / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(q.stem for q in directory.glob("*.yaml"))) or "none"
        raise error(f"unknown {what} {str(name_or_path)!r}: no {path} (known {what}s: {known}{hint})")
    return path


def read_yaml(path: Path, error: type[TrainboxError] = TrainboxError, what: str = "document") -> dict:
    """A YAML file whose top level is a mapping, read by trainbox.yamlfile (duplicate keys, size, encoding
    refused); errors name the file, line and column."""
    data = load_yaml_file(path, what, error)
    if not isinstance(data, dict):
        raise error(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


# A stack or recipe extends one or two others; a chain of hundreds is a hostile or generated file, and each level
# costs a read, a merge and (stacks) a validation. Counted in files, the one that is loaded included.
MAX_EXTENDS_DEPTH = 16


def extends_too_deep(path: Path, chain: list[Path], error: type[TrainboxError] = TrainboxError) -> TrainboxError:
    """The one-line refusal of an `extends:` chain longer than MAX_EXTENDS_DEPTH files."""
    names = [p.stem for p in chain]
    shown = " -> ".join(names[:3] + ["..."] + names[-2:])
    return error(f"{path}: extends: a chain of more than {MAX_EXTENDS_DEPTH} files ({shown}); a file may extend at "
                 f"most {MAX_EXTENDS_DEPTH - 1} others in turn: merge some of them into one")


def merge(parent: dict, child: dict) -> dict:
    """Child keys win; mappings merge recursively (so a child can change one pin's version only)."""
    out = copy.deepcopy(parent)
    for k, v in child.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def format_validation(path: Path, exc: ValidationError, unknown: str = "unknown keys are rejected") -> str:
    """One line per pydantic error: file, dotted key path, what was expected."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"unknown key (check the spelling; {unknown})"
        elif err["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"{path}: {loc}: {msg.removeprefix('Value error, ')}")
    return "\n".join(lines)
