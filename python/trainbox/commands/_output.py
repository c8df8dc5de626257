"""How commands print: JSON documents with a schema version, and tables that fit where they go (stdlib only).

A table on a terminal uses its full width (rich, when installed); piped or redirected it is plain text, one row
per line, columns separated by two spaces and never truncated, so `grep`, `awk` and `cut` see every value.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

from ._args import JSON_SCHEMA
from ..runtime.redact import printable


def json_doc(doc: dict[str, Any], schema: int = JSON_SCHEMA) -> str:
    """`doc` as JSON text with "schema" first (no Python reprs: anything else must be made JSON first)."""
    return json.dumps({"schema": schema, **doc}, indent=2)


def emit_json(doc: dict[str, Any], schema: int = JSON_SCHEMA) -> None:
    print(json_doc(doc, schema))


def plain_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_cell(c) for c in r] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *cells)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [list(head), *cells]]
    return "\n".join(lines)


def print_table(head: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None,
                stream=None) -> None:
    stream = stream or sys.stdout
    if stream.isatty():
        try:
            from rich.console import Console
            from rich.table import Table
        except ModuleNotFoundError:
            pass
        else:
            t = Table(title=title, expand=False)
            for h in head:
                t.add_column(h, overflow="fold")
            for r in rows:
                t.add_row(*(_cell(c) for c in r))
            Console(file=stream).print(t)
            return
    if title:
        print(f"# {title}", file=stream)
    print(plain_table(head, rows), file=stream)


def _cell(value: Any) -> str:
    if value is None or value == [] or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return printable(",".join(str(v) for v in value))
    return printable(value)  # cells come from image labels, SBOMs, stack files: never raw control characters
