"""The one YAML reader for every file users write (stacks, locks, recipes, smoke profiles), and the one JSON reader
for documents from elsewhere (a bundle's bundle.json, an image's SBOM and labels, build reports) (host module).

yaml.safe_load lets a repeated key win silently (`version: 2.3.5` then `version: 9.9.9` gives 9.9.9) and reads
anything of any size. This reader refuses duplicate keys (file and both lines named), files over a size bound,
directories, unreadable and non-UTF-8 files, and an unquoted value cut short by ` #` (`(PR #208)` makes the rest
of the line a comment), each as one TrainboxError line instead of a traceback.
"""

from __future__ import annotations

import copy
import json
import os
import re
import threading
from pathlib import Path

import yaml

from .runtime.errors import TrainboxError

# The largest stack in the tree is a few KiB and a lock some tens; 1 MiB leaves room without letting a stray
# 50 MB file through to pydantic.
MAX_YAML_BYTES = 1 << 20
# A stack or recipe nests a few levels; deeper is a hostile or broken file (libyaml parses 20,000 levels happily,
# and the schema would then print one error per level).
MAX_YAML_DEPTH = 64
# Nodes after aliases are expanded: the largest lock is ~1,600. Aliases make a billion-laughs file of under 1 KiB
# (9 aliases of 9 aliases ... 8 levels: 43 million nodes) that loads in no time as shared objects and then hangs
# whatever walks it (the depth check, pydantic, deepcopy); counted on the parsed nodes, before anything is built.
MAX_YAML_NODES = 100_000


class YamlTooBig(yaml.YAMLError):
    """A document past MAX_YAML_DEPTH or MAX_YAML_NODES (its message is the one-line reason)."""


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """SafeLoader that refuses a mapping key given twice, and a document too deep or too big once its aliases are
    expanded. libyaml's parser where PyYAML has it: the pure-Python one takes ~10x as long, and a lock file is
    tens of KiB read on every stack load."""

    def get_single_data(self):
        node = self.get_single_node()
        if node is None:
            return None
        _check_expanded(node)
        return self.construct_document(node)


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expanded(root: yaml.Node) -> None:
    """Depth and node count of the document as its aliases expand it, each distinct node visited once (an alias
    is the very node object it names): linear in the file, however large the expansion."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    todo: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_: set[int] = set()
    while todo:
        node, done = todo.pop()
        key = id(node)
        if done:
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            open_.discard(key)
            if depth[key] > MAX_YAML_DEPTH:
                raise YamlTooBig(f"nested more than {MAX_YAML_DEPTH} levels deep; a stack or recipe needs a few "
                                 "levels")
            if size[key] > MAX_YAML_NODES:
                raise YamlTooBig(f"more than {MAX_YAML_NODES} values once its aliases (*name) are expanded; a "
                                 "stack, lock or recipe holds a few thousand (an alias bomb?)")
            continue
        if key in size:
            continue
        if key in open_:  # `&a [*a]`: an alias inside the node it names never ends
            raise YamlTooBig(f"an alias refers to a node that contains it (line {node.start_mark.line + 1}); "
                             "it would nest without end")
        open_.add(key)
        todo.append((node, True))
        todo.extend((k, False) for k in _children(node) if id(k) not in size)


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    own = {id(k) for k, _v in node.value if k.tag != "tag:yaml.org,2002:merge"}
    loader.flatten_mapping(node)  # `<<: *anchor` merges first: overriding a merged key stays allowed
    seen: dict = {}
    for key_node, _value in node.value:
        if id(key_node) not in own:
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the base constructor reports it
            break
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first given on line {first}); a repeated key would "
                "silently win, so remove one of them", key_node.start_mark)
        seen[key] = key_node.start_mark.line + 1
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _location(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark else ""


# text, blanks, then `#` and a word character on the same line: `(PR #208)`, `issue #5`. A comment is written
# `# text`; only files with such a line are scanned token by token (the scan costs as much as the parse).
_SUSPECT = re.compile(r"[^\s#][ \t]+#\w")


def _cut_values(text: str, where: str, error: type[TrainboxError]) -> None:
    """Refuse a plain (unquoted) value followed on its line by ` #word`: YAML ends the value there and drops the
    rest as a comment, so `description: Fix (PR #208), 8 x A3` silently reads as `Fix (PR`."""
    lines = text.splitlines()
    # libyaml's scanner where PyYAML has it (same tokens and marks, a tenth of the time): a stack or recipe that
    # cites `PR #5` in a comment is scanned on every load
    for tok in yaml.scan(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if not (isinstance(tok, yaml.ScalarToken) and tok.plain and tok.end_mark.line < len(lines)):
            continue
        rest = lines[tok.end_mark.line][tok.end_mark.column:]
        if re.match(r"[ \t]+#\w", rest):
            raise error(f"{where}:{tok.end_mark.line + 1}: the value {tok.value!r} is cut short: YAML reads "
                        f"'{rest.strip()[:40]}' as a comment. Quote the whole value (\"...\"), or write a comment "
                        "as '# text'")


_OPENS = (yaml.BlockSequenceStartToken, yaml.BlockMappingStartToken, yaml.FlowSequenceStartToken,
          yaml.FlowMappingStartToken)
_CLOSES = (yaml.BlockEndToken, yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken)


def _tokens_too_deep(text: str) -> bool:
    """Nesting past MAX_YAML_DEPTH, found in the tokens before anything is composed: libyaml's composer recurses in
    C (`- - - ... x` 50,000 levels deep, 100 KB, kills the interpreter with SIGSEGV) and its time grows with the
    square of the flow depth (`[[[[...`: 20,000 levels 1.7 s, 1 MiB hours). The scan stops at the bound; for an
    honest lock it costs a tenth of the parse."""
    level = 0
    loader = _UniqueKeyLoader(text)
    try:
        while loader.check_token():
            tok = loader.get_token()
            if isinstance(tok, _OPENS):
                level += 1
                if level > MAX_YAML_DEPTH:
                    return True
            elif isinstance(tok, _CLOSES):
                level -= 1
    finally:
        loader.dispose()
    return False


# Documents parsed before, by their text: one command loads a stack's lock, its parent's and the stacks it extends
# several times over (resolve, findings, render), and parsing with the checks above is the costly part of loading
# a stack (13 ms for relax.yaml, a copy of the result 0.3 ms). Only successes are kept, so every refusal is made
# (and worded for its own `where`) again; each caller gets a copy of its own, so none sees another's edits.
_PARSED: dict[str, object] = {}
_PARSED_MAX = 128  # documents; a stack or lock is KiBs to tens of KiB
_PARSED_TEXT_MAX = 256 << 10  # a larger document is parsed each time
_PARSED_LOCK = threading.Lock()


def parse_yaml(text: str, where: str, error: type[TrainboxError] = TrainboxError):
    """Parse YAML text (duplicate keys and cut-short values refused); errors name `where` (a path) and the line."""
    with _PARSED_LOCK:
        hit = _PARSED.get(text, _PARSED)
    if hit is not _PARSED:
        return copy.deepcopy(hit)
    data = _parse_yaml(text, where, error)
    if len(text) <= _PARSED_TEXT_MAX:
        kept = copy.deepcopy(data)  # before the caller can change `data`
        with _PARSED_LOCK:
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.pop(next(iter(_PARSED)))  # the oldest first
            _PARSED[text] = kept
    return data


def _parse_yaml(text: str, where: str, error: type[TrainboxError]):
    try:
        if _tokens_too_deep(text):
            raise RecursionError
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        if _SUSPECT.search(text):
            _cut_values(text, where, error)
        return data
    except YamlTooBig as exc:
        raise error(f"{where}: malformed YAML: {exc}") from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"{where}{_location(exc)}: malformed YAML: {problem}") from None
    except RecursionError:  # the pure-Python parser recurses per level; libyaml's result is measured above
        raise error(f"{where}: malformed YAML: nested more than {MAX_YAML_DEPTH} levels deep; a stack or recipe "
                    "needs a few levels") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (Python's int limit)
        raise error(f"{where}: malformed YAML: {' '.join(str(exc).split())[:200]}") from None


def read_text_file(path: Path, what: str, error: type[TrainboxError] = TrainboxError,
                   limit: int = MAX_YAML_BYTES) -> str:
    """A user-written text file as str, or one clear error: missing, a directory, too big, not UTF-8."""
    path = Path(path)
    try:
        if path.is_symlink() and Path(os.path.realpath(path)).suffix != path.suffix:
            # a link to /etc/shadow must not be parsed and its lines echoed back in "unknown key" errors
            raise error(f"{path}: a link to {os.path.realpath(path)}, which is not a {path.suffix or what} file; "
                        "nothing was read from it")
        if path.is_dir():
            raise error(f"{path}: is a directory, expected a {what} file")
        size = path.stat().st_size
        if size > limit:
            raise error(f"{path}: {size} bytes; a {what} file may hold at most {limit} bytes")
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read this {what} file ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x}); save the {what} file "
                    "as UTF-8") from None


def load_yaml_file(path: Path, what: str, error: type[TrainboxError] = TrainboxError):
    """Read and parse one user-written YAML file (see the module doc for what is refused)."""
    return parse_yaml(read_text_file(path, what, error), str(path), error)


# -- JSON from elsewhere ------------------------------------------------------------------------------------
# `json.loads` of 100,000 nested brackets raises RecursionError (a traceback, not the ValueError callers catch),
# and a document a few hundred levels deep parses but then breaks whatever walks it recursively. Here either is
# a `JsonError`, a ValueError with a one-line message, so `except ValueError` at every caller handles it.

# bundle.json (the stack's manifest inside) nests 6 levels, a CycloneDX SBOM 5; 64 leaves room for any honest one
MAX_JSON_DEPTH = 64


class JsonError(ValueError):
    """Not JSON, or JSON nested past MAX_JSON_DEPTH; the message is one line."""


def _json_depth_over(data, limit: int) -> bool:
    todo = [(data, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > limit:
            return True
        if isinstance(value, dict):
            todo.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            todo.extend((v, depth + 1) for v in value)
    return False


def json_loads(text: str | bytes, max_depth: int = MAX_JSON_DEPTH):
    """Parse JSON text; JsonError (one line) for malformed JSON, bytes that are not UTF-8, or nesting too deep."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonError(f"not UTF-8 text (byte {text[exc.start]:#04x} at offset {exc.start})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise JsonError(f"nested more than {max_depth} levels deep") from None
    except json.JSONDecodeError as exc:
        raise JsonError(f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise JsonError(f"not valid JSON: {' '.join(str(exc).split())[:200]}") from None
    if _json_depth_over(data, max_depth):
        raise JsonError(f"nested more than {max_depth} levels deep")
    return data
