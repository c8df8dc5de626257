"""The step monitor of `trainbox trial`: per optimizer step, the loss and the time, and where a process stopped.

Runtime module, standard library only, and standalone: `trainbox trial` mounts this one file into the job's
container and a .pth line loads it by path at every interpreter start (torchrun's agent, each worker), so it
works in images built before it existed. It does nothing unless TRAINBOX_TRIAL_DIR is set.

What it records, in TRAINBOX_TRIAL_DIR (one file per process, JSON lines / JSON):
  steps-<rank>.jsonl  one line per optimizer step: {"rank", "step", "loss", "seconds", "finite"}. The step is
                      torch's global optimizer step post-hook (every torch.optim optimizer, whatever wraps it);
                      the loss is the mean of the scalars `.backward()` was called on since the previous step
                      (gradient accumulation gives several), null where the framework never calls it on a scalar.
  error-<rank>.json   the exception a process died of: type, message, the frames (file, line, function)
  exit-<rank>.json    the container's peak memory when the process ended normally (cgroup high-water mark)
  stopped-<rank>.json the monitor ended the process after TRAINBOX_TRIAL_STOP_AFTER steps (the workload has no
                      step limit of its own): a pass, not a failure
Rank 0 (or a process without a rank) also prints `[trainbox trial] step N loss X time Ys` to stderr.

torch is never imported here: the hooks go in when the workload imports torch (a meta-path finder that wraps
the loader of the `torch` module once).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import traceback

ENV_DIR = "TRAINBOX_TRIAL_DIR"
ENV_STOP = "TRAINBOX_TRIAL_STOP_AFTER"
PREFIX = "[trainbox trial]"

_state = {"step": 0, "losses": [], "last": None, "installed": False}
_lock = threading.Lock()


def _rank() -> str:
    for var in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return os.environ[var]
    return f"pid{os.getpid()}"  # torchrun's agent, a helper process: no rank


def _write(name: str, text: str, append: bool = False) -> None:
    d = os.environ.get(ENV_DIR)
    if not d:
        return
    try:
        with open(os.path.join(d, name), "a" if append else "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError:
        pass  # a monitor must never be what stops the job


def _say(msg: str) -> None:
    if _rank() in ("0",) or not os.environ.get("RANK"):
        sys.stderr.write(f"{PREFIX} {msg}\n")
        sys.stderr.flush()


def _cgroup_peak_mb() -> float | None:
    """The container's peak memory so far (cgroup v2 memory.peak, v1 max_usage_in_bytes), MB; None if unreadable."""
    for path in ("/sys/fs/cgroup/memory.peak", "/sys/fs/cgroup/memory/memory.max_usage_in_bytes"):
        try:
            with open(path, encoding="ascii") as fh:
                return round(int(fh.read().strip()) / 2**20, 1)
        except (OSError, ValueError):
            continue
    return None


def _on_backward(tensor) -> None:
    try:
        if tensor.numel() == 1:
            with _lock:
                _state["losses"].append(float(tensor.detach().float().cpu().item()))
    except Exception:  # noqa: BLE001 - an odd tensor (meta, sparse): no loss recorded for it
        pass


def _on_step(*_args, **_kwargs) -> None:
    now = time.monotonic()
    with _lock:
        _state["step"] += 1
        step = _state["step"]
        losses, _state["losses"] = _state["losses"], []
        last, _state["last"] = _state["last"], now
    loss = sum(losses) / len(losses) if losses else None
    seconds = now - (last if last is not None else _START)
    finite = loss is None or math.isfinite(loss)
    rec = {"rank": _rank(), "step": step, "loss": loss, "seconds": round(seconds, 3), "finite": finite,
           "backward_calls": len(losses), "cgroup_peak_mb": _cgroup_peak_mb()}
    _write(f"steps-{_rank()}.jsonl", json.dumps(rec) + "\n", append=True)
    _say(f"step {step} loss {'n/a' if loss is None else f'{loss:.6g}'} time {seconds:.2f}s")
    limit = os.environ.get(ENV_STOP, "")
    if limit.isdigit() and step >= int(limit) > 0:
        _write(f"stopped-{_rank()}.json", json.dumps({"rank": _rank(), "step": step}) + "\n")
        _say(f"stopping after {step} steps (TRAINBOX_TRIAL_STOP_AFTER)")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # every rank stops at the same step: no collective is left waiting


def _patch_torch(torch) -> None:
    if _state["installed"]:
        return
    _state["installed"] = True
    try:
        import importlib

        importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(_on_step)
    except Exception as exc:  # noqa: BLE001 - a torch without the global hook: say so, record no steps
        _say(f"no optimizer step hook in this torch ({exc})")
    original = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        _on_backward(self)
        return original(self, *args, **kwargs)

    backward.__doc__ = original.__doc__
    torch.Tensor.backward = backward


class _TorchHook:
    """Meta-path finder: when `torch` is imported, its loader's exec_module (on that one loader instance) also
    installs the hooks right after torch has loaded; the finder then leaves sys.meta_path."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or _state["installed"]:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
            try:
                _patch_torch(module)
            except Exception as exc:  # noqa: BLE001 - the job runs on, without step records
                _say(f"step hooks not installed: {exc}")

        try:
            spec.loader.exec_module = exec_and_patch
        except AttributeError:  # a loader that takes no attributes: no hooks rather than no torch
            return None
        return spec


def frames(tb) -> list[dict]:
    return [{"file": f.filename, "line": f.lineno, "function": f.name} for f in traceback.extract_tb(tb)]


def _record_exception(exc_type, exc, tb) -> None:
    if exc_type in (KeyboardInterrupt,) or (exc_type is SystemExit and not exc.code):
        return
    rec = {"rank": _rank(), "type": exc_type.__name__, "module": exc_type.__module__,
           "message": str(exc)[:2000], "frames": frames(tb), "argv": sys.argv[:8],
           "after_steps": _state["step"], "cgroup_peak_mb": _cgroup_peak_mb()}
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        rec["cause"] = {"type": type(cause).__name__, "message": str(cause)[:1000],
                        "frames": frames(cause.__traceback__)[-3:]}
    _write(f"error-{_rank()}.json", json.dumps(rec) + "\n")


def install() -> bool:
    """Hooks in when TRAINBOX_TRIAL_DIR is set; the .pth line calls this at every interpreter start."""
    if not os.environ.get(ENV_DIR) or getattr(sys, "_trainbox_trial", False):
        return False
    sys._trainbox_trial = True
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        _record_exception(exc_type, exc, tb)
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook
    import atexit

    # the container's memory high-water mark when a process ends, steps or not (the trial's peak memory)
    atexit.register(lambda: _write(f"exit-{_rank()}.json", json.dumps({"rank": _rank(), "steps": _state["step"],
                                                                      "cgroup_peak_mb": _cgroup_peak_mb()}) + "\n"))
    if "torch" in sys.modules:
        _patch_torch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchHook())
    return True


_START = time.monotonic()

if __name__ == "trainbox_trial_monitor":  # loaded by path from the .pth line
    install()

if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
