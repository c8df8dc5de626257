"""Patch markers and the MindSpeed import-order guard.

Runtime module: standard library only.

Patch markers: a device-specific replacement (say an NPU kernel for chunk_gated_delta_rule) is marked
with mark_patched(); generic code that would later install its own version asks is_patched() first, or
uses patch_attr(), which keeps a marked replacement in place. This is the bug of Twinkle #208, where
the sequence-parallel path overwrote the NPU-patched function.

MindSpeed: `mindspeed.megatron_adaptor` must be imported before anything imports megatron.core or
mcore_bridge, or its patches land on already-bound names and silently do nothing.
"""

from __future__ import annotations

import sys
import weakref

from trainbox.runtime.errors import TrainboxError

__all__ = [
    "MINDSPEED_ADAPTOR",
    "import_mindspeed_adaptor",
    "install_mindspeed_import_guard",
    "is_patched",
    "mark_patched",
    "megatron_modules_loaded",
    "patch_attr",
]

MARKER_ATTR = "__trainbox_patched__"
# Markers other projects already set; honoured so a trainbox-aware caller does not undo their patch.
FOREIGN_MARKERS = ("_twinkle_npu_patched",)
MINDSPEED_ADAPTOR = "mindspeed.megatron_adaptor"
# Modules that must not be imported before the MindSpeed adaptor.
_MEGATRON_MODULES = ("megatron.core", "mcore_bridge")

# Tags of objects that refuse attributes (builtins, some C callables) but accept weak references.
_side_table: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _target(obj):
    # A bound method refuses new attributes; its function takes them and is what gets patched in.
    return getattr(obj, "__func__", obj)


def mark_patched(obj=None, tag: str = "npu"):
    """Mark `obj` (function, class, module, instance) as a `tag` replacement; returns obj, so it also
    works as a decorator: @mark_patched or @mark_patched(tag="npu")."""
    if obj is None:
        return lambda fn: mark_patched(fn, tag)
    target = _target(obj)
    tags = set(getattr(target, MARKER_ATTR, ()) or ()) | {tag}
    try:
        setattr(target, MARKER_ATTR, frozenset(tags))
    except (AttributeError, TypeError):
        try:
            _side_table[target] = frozenset(_side_table.get(target, frozenset()) | {tag})
        except TypeError:
            raise TrainboxError(
                f"mark_patched: {obj!r} accepts neither attributes nor weak references; wrap it in a "
                "Python function and mark the wrapper"
            ) from None
    return obj


def _tags(obj) -> frozenset:
    target = _target(obj)
    try:
        tags = frozenset(getattr(target, MARKER_ATTR, ()) or ())
    except Exception:
        tags = frozenset()
    try:
        tags |= _side_table.get(target, frozenset())
    except TypeError:  # not weak-referenceable, so never in the side table
        pass
    if any(getattr(target, name, False) is True for name in FOREIGN_MARKERS):
        tags |= {"npu"}
    return tags


def is_patched(obj, tag: str | None = None) -> bool:
    """True when `obj` carries a patch marker (any tag, or `tag`)."""
    tags = _tags(obj)
    return bool(tags) if tag is None else tag in tags


def patch_attr(owner, name: str, replacement, *, tag: str | None = None, force: bool = False) -> bool:
    """Set owner.name = replacement unless the current value is a marked replacement (for `tag`, or any
    tag when None). With tag, the replacement is marked too. Returns True when it was installed."""
    current = getattr(owner, name, None)
    if current is not None and not force and is_patched(current, tag):
        return False
    if tag is not None:
        mark_patched(replacement, tag)
    setattr(owner, name, replacement)
    return True


def megatron_modules_loaded() -> list[str]:
    """Megatron modules already imported (sorted): megatron.core*, mcore_bridge*."""
    return sorted(m for m in sys.modules
                  if any(m == root or m.startswith(root + ".") for root in _MEGATRON_MODULES))


def _order_error(loaded, importing: bool = False) -> TrainboxError:
    what = (f"importing {loaded[0]} before" if importing else
            f"{', '.join(loaded[:3])} {'was' if len(loaded) == 1 else 'were'} imported before")
    return TrainboxError(
        f"{what} {MINDSPEED_ADAPTOR}: MindSpeed's NPU patches must be applied first. Import it at the very top of "
        "the entry script (`import mindspeed.megatron_adaptor`, or "
        "trainbox.runtime.markers.import_mindspeed_adaptor()), before anything that imports megatron.core or "
        "mcore_bridge (megatron.training, mcore_bridge, swift.megatron, ...)."
    )


def import_mindspeed_adaptor(required: bool = True):
    """Import mindspeed.megatron_adaptor, first checking that megatron.core / mcore_bridge were not
    imported before it (TrainboxError if they were). Returns the module; None when MindSpeed is not
    installed and not `required`."""
    module = sys.modules.get(MINDSPEED_ADAPTOR)
    if module is not None:
        return module
    loaded = megatron_modules_loaded()
    if loaded:
        raise _order_error(loaded)
    import importlib

    try:
        return importlib.import_module(MINDSPEED_ADAPTOR)
    except ModuleNotFoundError as exc:
        if exc.name not in ("mindspeed", MINDSPEED_ADAPTOR):
            raise
        if required:
            raise TrainboxError(f"{MINDSPEED_ADAPTOR} is not installed: the NPU Megatron stack needs MindSpeed "
                                "(build/stacks/npu-*.yaml component mindspeed)") from None
        return None


class _MindSpeedGuard:
    """sys.meta_path hook: importing megatron.core / mcore_bridge before the adaptor fails at once."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _MEGATRON_MODULES and MINDSPEED_ADAPTOR not in sys.modules:
            raise ImportError(str(_order_error([fullname], importing=True)), name=fullname)
        return None  # let the regular finders do the import

    def __repr__(self):
        return "<trainbox MindSpeed import-order guard>"


def install_mindspeed_import_guard() -> bool:
    """Make any later import of megatron.core / mcore_bridge fail with a clear message unless
    mindspeed.megatron_adaptor was imported first (the adaptor's own imports of megatron pass, since it
    is in sys.modules while it runs). Raises at once if megatron is already loaded without the adaptor.
    Returns False when a guard was already installed."""
    if MINDSPEED_ADAPTOR not in sys.modules:
        loaded = megatron_modules_loaded()
        if loaded:
            raise _order_error(loaded)
    if any(isinstance(f, _MindSpeedGuard) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _MindSpeedGuard())
    return True


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
