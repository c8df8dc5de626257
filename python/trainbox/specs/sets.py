"""The one `--set NAME=VALUE` grammar (host module). Each command then says what NAME may be: a pin
(`COMPONENT.FIELD`, trainbox.specs.stack), a per-stack pin (`STACK:COMPONENT.FIELD`, smoke) or a recipe input /
environment key (trainbox.launch)."""

from __future__ import annotations

from ..runtime.errors import TrainboxError


def split_assignment(item: str, expected: str, example: str) -> tuple[str, str]:
    """`NAME=VALUE` -> (NAME, VALUE), both as given (the value may hold `=`, spaces, anything)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise TrainboxError(f"--set {item!r}: expected {expected}, e.g. --set {example}")
    return key, value


def parse_assignments(items: list[str] | None, expected: str = "NAME=VALUE",
                      example: str = "MODEL_DIR=/data/Qwen3-4B") -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, value = split_assignment(item, expected, example)
        out[key] = value
    return out
