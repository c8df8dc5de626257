"""Read the stack manifest that an image carries at /etc/trainbox/stack.json (runtime: stdlib only).

The manifest is written by `trainbox.image.render` at build time and read by the container entrypoint and
`trainbox doctor`. Its shape (schema 1)::

    {"schema": 1, "trainbox_version": "0.1.0", "stack": "npu-910b", "device": "npu", "python": "3.11",
     "base": {"image": "...", "cann": "8.5.1" | null, "substituted": null | "local/debian:bookworm"},
     "components": {"torch": {"name": "torch", "source": "pypi", "version": "2.9.0+cpu", ...}, ...},
     "left_out": {"sgl-kernel-npu": "needs cann-toolkit, which the substitute base ... does not have"},
     "env": {"USE_MCORE_GDN": "0", ...},
     "patches": {...}, "overrides": {...}}

`TRAINBOX_MANIFEST` points at another file (tests, a bare host, a mounted manifest).
"""

from __future__ import annotations

import json
import os

from .errors import TrainboxError

DEFAULT_PATH = "/etc/trainbox/stack.json"
SCHEMA = 1
DEVICES = ("npu", "cuda", "cpu")


class ManifestError(TrainboxError):
    """The manifest exists but cannot be used (unreadable, not JSON, wrong shape)."""


def manifest_path(path: str | os.PathLike | None = None) -> str:
    """The manifest file to read: the argument, else $TRAINBOX_MANIFEST, else /etc/trainbox/stack.json."""
    if path:
        return os.fspath(path)
    return os.environ.get("TRAINBOX_MANIFEST") or DEFAULT_PATH


def load_manifest(path: str | os.PathLike | None = None) -> dict | None:
    """Return the manifest as a dict, or None when there is no manifest file (a bare host).

    Raises ManifestError when the file exists but is unreadable, not JSON, or not a schema-1 manifest,
    so callers never act on half a manifest.
    """
    p = manifest_path(path)
    try:
        with open(p, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ManifestError(f"{p}: cannot read the stack manifest ({exc.strerror}); fix its permissions "
                            "or point TRAINBOX_MANIFEST at a readable copy") from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{p}: the stack manifest is not UTF-8 text (byte {exc.start}); rebuild the "
                            "image or point TRAINBOX_MANIFEST at a valid manifest") from None
    try:
        data = json.loads(text)
    except RecursionError:  # thousands of nested brackets: not a manifest, and not a traceback either
        raise ManifestError(f"{p}: the stack manifest is nested thousands of levels deep, not a manifest trainbox "
                            "wrote; rebuild the image or point TRAINBOX_MANIFEST at a valid manifest") from None
    except ValueError as exc:
        raise ManifestError(f"{p}: the stack manifest is not valid JSON ({exc}); rebuild the image or "
                            "point TRAINBOX_MANIFEST at a valid manifest") from exc
    validate(data, p)
    return data


def validate(data: object, where: str = "manifest") -> None:
    """Check the parts of the manifest that the runtime relies on; raise ManifestError naming the key."""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: expected a JSON object at the top level, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise ManifestError(f"{where}: key 'schema' is {schema!r}, this trainbox reads schema {SCHEMA}; "
                            "rebuild the image with this trainbox version or install the matching trainbox")
    device = data.get("device")
    if device is not None and device not in DEVICES:
        raise ManifestError(f"{where}: key 'device' is {device!r}, expected one of {', '.join(DEVICES)}")
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ManifestError(f"{where}: key 'env' must map names to string values")
    comps = data.get("components", {})
    if not isinstance(comps, dict) or not all(isinstance(c, dict) for c in comps.values()):
        raise ManifestError(f"{where}: key 'components' must map component keys to objects")
    base = data.get("base", {})
    if base is not None and not isinstance(base, dict):
        raise ManifestError(f"{where}: key 'base' must be an object")


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
