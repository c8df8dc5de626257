"""`trainbox stack diff`: what two stacks' builds would differ in, key by key (host module)."""

from __future__ import annotations

from typing import Any

from .stack import Stack


def _diff_view(stack: Stack) -> dict:
    """Everything a build of the stack depends on, as plain JSON data (what `stack diff` compares)."""
    comps = {}
    for key, c in stack.components.items():
        view = c.model_dump(exclude={"platforms", "sha256", "note"}, exclude_none=True)
        if c.source == "pypi":  # the pin and hashes in force per platform (stack file, per-platform pins, lock)
            view.pop("version"), view.pop("index")
            view["pins"] = {p: c.pin_for(p).model_dump() for p in stack.platforms}
        elif c.sha256:
            view["sha256"] = c.sha256
        comps[key] = view
    return {
        "device": stack.device, "python": stack.python, "platforms": stack.platforms,
        "base": stack.base.model_dump(exclude_none=True), "indexes": stack.indexes,
        "system_packages": stack.system_packages, "build_packages": stack.build_packages,
        "components": comps, "env": stack.env,
        "lock": {"state": "none" if not stack.lock else "fresh" if stack.lock_is_fresh() else "stale"},
    }


def diff_stacks(a: Stack, b: Stack) -> list[dict]:
    """[{key, a, b, change}] for every dotted key whose value differs; a side that lacks it has None."""
    out: list[dict] = []
    missing = object()

    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k, missing), y.get(k, missing), f"{path}.{k}" if path else str(k))
        elif x != y:
            change = "added" if x is missing else "removed" if y is missing else "changed"
            out.append({"key": path, "a": None if x is missing else x, "b": None if y is missing else y,
                        "change": change})

    walk(_diff_view(a), _diff_view(b), "")
    return out
