"""The one JSON reader for documents trainbox did not write just now (host module): a bundle's bundle.json, an
image's SBOM, build reports, image labels.

`json.loads` of 100,000 nested brackets raises RecursionError (a traceback, not a ValueError that callers catch),
and a document a few hundred levels deep parses but then breaks whatever walks it recursively. Here either is a
`JsonError`, a ValueError whose message is one line, so `except ValueError` at every caller already handles it.
"""

from __future__ import annotations

import json

# bundle.json (the stack's manifest inside) nests 6 levels, a CycloneDX SBOM 5; 64 leaves room for any honest one
MAX_JSON_DEPTH = 64


class JsonError(ValueError):
    """Not JSON, or JSON nested past MAX_JSON_DEPTH; the message is one line."""


def _depth_over(data, limit: int) -> bool:
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


def loads(text: str | bytes, max_depth: int = MAX_JSON_DEPTH):
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
    if _depth_over(data, max_depth):
        raise JsonError(f"nested more than {max_depth} levels deep")
    return data
