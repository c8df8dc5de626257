"""What a trial run came to (host module): the steps the monitor recorded, or where and why the job stopped.

The step monitor (trainbox.runtime.trialmon) leaves, per process, steps-RANK.jsonl, error-RANK.json and
stopped-RANK.json in the trial's monitor directory. From those (and, where a process died without reaching
Python's excepthook, the traceback in the job's output) comes one line:

    passed N steps (loss A -> B, finite)
    stopped at FILE:LINE: Exception: message (what it means)

FILE:LINE is the innermost frame of the workload or its frameworks, not of Python's or torch's own files (the
frame raising inside torch is named too, as `raised in`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

# Exceptions whose message says what the trial cannot get past here, and what that means. First match wins.
MEANINGS: list[tuple[str, str]] = [
    (r"import of ([\w.]+) halted; None in sys.modules",
     "CPU mode hides {0} (it needs CANN or a GPU driver to load): this code imports it without a CPU fallback"),
    (r"No module named '(torch_npu|acl|tbe|te)\b",
     "Ascend's device-only stack (torch_npu needs CANN and an NPU): hidden in CPU mode, so this path needs the card"),
    (r"No module named '(transformer_engine|flash_attn|apex)",
     "a CUDA-only extension the code imports without a CPU fallback"),
    (r"No module named '([A-Za-z0-9_.]+)'", "the image lacks the Python module {0}: add its distribution to the stack"),
    (r"requires the (\w+) library but it was not found",
     "the image lacks {0}, which transformers requires for what this line registers or builds"),
    (r"Torch not compiled with CUDA|Found no NVIDIA driver|CUDA driver|no CUDA GPUs|cuda.*is not available",
     "the code asks for a CUDA device here, with no CPU path"),
    (r"device_id cuda|cuda:\d.*(accelerator|compil)|backend nccl|NCCL",
     "the code binds a CUDA device / NCCL here: it has no CPU (Gloo) path at this point"),
    (r"npu|NPU|Ascend", "the code asks for an Ascend NPU here, with no CPU path"),
    (r"[Gg]loo.*(not supported|does not support|unsupported)|not supported by.*[Gg]loo|ProcessGroupGloo",
     "the Gloo backend lacks a collective this code uses (NCCL/HCCL only)"),
    (r"flex_attention|FlexAttention", "FlexAttention has no CPU path in this torch"),
    (r"(?i)out of memory|Cannot allocate memory", "the trial ran out of memory on this host: shrink the overlay"),
    (r"(?i)connection|resolve|urlopen|HTTPSConnection|offline", "the code reaches for the network (a model hub?)"),
    (r"KeyError: '([^']+)'|KeyError\('([^']+)'", "a field the code reads is missing from the data or config: {0}"),
]

# Files that are not where a workload stops, only where it is told so (the frame named is their caller).
_INTERNAL = re.compile(r"(/lib/python3\.\d+/(?!site-packages)|/site-packages/torch/|<frozen |<string>"
                       r"|/site-packages/transformers/utils/import_utils\.py)")


def meaning(exc_type: str, message: str) -> str:
    text = f"{exc_type}: {message}"
    for pattern, what in MEANINGS:
        m = re.search(pattern, text)
        if m:
            groups = [g for g in m.groups() if g] if m.groups() else []
            return what.format(*(groups or [""]))
    return ""


def _short(path: str) -> str:
    """A frame's file without the image's install prefix (site-packages/, /opt/src/, a trial's copy of the tree)."""
    path = re.sub(r"^.*/trial/runs/[^/]+/code/", "", path)
    for marker in ("/site-packages/", "/dist-packages/", "/opt/src/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def frame_of(frames: list[dict]) -> tuple[dict | None, dict | None]:
    """(the innermost frame of the workload / its frameworks, the innermost frame overall)."""
    if not frames:
        return None, None
    own = [f for f in frames if not _INTERNAL.search(f.get("file", ""))]
    return (own[-1] if own else frames[-1]), frames[-1]


def read_monitor(d: Path) -> dict:
    steps: dict[str, list[dict]] = {}
    errors: list[dict] = []
    stopped: list[dict] = []
    exits: list[dict] = []
    for p in sorted(d.glob("steps-*.jsonl")):
        rank = p.name[len("steps-"):-len(".jsonl")]
        rows = []
        for line in p.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        steps[rank] = rows
    for kind, sink in (("error", errors), ("stopped", stopped), ("exit", exits)):
        for p in sorted(d.glob(f"{kind}-*.json")):
            try:
                sink.append(json.loads(p.read_text()))
            except ValueError:
                continue
    return {"steps": steps, "errors": errors, "stopped": stopped, "exits": exits}


_TB_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
_TB_LAST = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure)[\w]*): ?(.*)$")


def traceback_in(output: str) -> dict | None:
    """The last Python traceback printed in the job's output, as an error record (fallback for a process that
    died before the monitor's excepthook ran, or where the monitor was not loaded)."""
    # torchrun's --tee / per-rank prefixes ([default0]:, [rank0]:) off first
    lines = [re.sub(r"^\[(?:default|rank)?\d+\]:", "", ln) for ln in output.splitlines()]
    starts = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    frames, exc = [], None
    for ln in lines[starts[-1] + 1:]:
        m = _TB_FRAME.match(ln)
        if m:
            frames.append({"file": m.group(1), "line": int(m.group(2)), "function": m.group(3)})
            continue
        m = _TB_LAST.match(ln.strip())
        if m and frames:
            exc = {"type": m.group(1).rsplit(".", 1)[-1], "message": m.group(2)}
            break
    if not exc:
        return None
    return {**exc, "frames": frames, "rank": "?", "from": "output"}


def _rank_key(rec: dict) -> tuple:
    r = str(rec.get("rank", ""))
    return (0, int(r)) if r.isdigit() else (1, 0)


def stopped_line(err: dict) -> tuple[str, dict]:
    frame, raised = frame_of(err.get("frames") or [])
    where = f"{_short(frame['file'])}:{frame['line']}" if frame else "(no frame)"
    msg = " ".join(str(err.get("message", "")).split())
    if len(msg) > 200:  # the first sentence carries it; the log has the rest
        msg = msg[:200].rsplit(". ", 1)[0] + " ..."
    what = meaning(err.get("type", ""), msg)
    inside = ""
    if raised and frame and raised is not frame:
        inside = f", raised in {_short(raised['file'])}:{raised['line']}"
    line = f"stopped at {where}: {err.get('type')}: {msg}" + (f" ({what}{inside})" if what else
                                                             (f" ({inside[2:]})" if inside else ""))
    return line, {"file": frame["file"] if frame else None, "line": frame["line"] if frame else None,
                  "function": frame["function"] if frame else None, "type": err.get("type"), "message": msg,
                  "meaning": what or None, "raised_in": raised, "rank": err.get("rank")}


def judge(mon: dict, rc: int, want: int, output: str, timed_out: bool) -> dict:
    """The result document's core: passed / stopped, the one line, the steps of rank 0."""
    ranks = sorted(mon["steps"], key=lambda r: _rank_key({"rank": r}))
    lead = mon["steps"].get("0") or (mon["steps"][ranks[0]] if ranks else [])
    losses = [s.get("loss") for s in lead if s.get("loss") is not None]
    bad = [s for rows in mon["steps"].values() for s in rows if not s.get("finite", True)]
    out = {"steps": lead, "ranks_stepping": len([r for r in ranks if r.isdigit()]), "exit_code": rc}
    errors = sorted(mon["errors"], key=_rank_key)
    if bad:
        s = bad[0]
        out.update(result="stopped", line=f"stopped at step {s['step']} (rank {s['rank']}): loss is {s['loss']} "
                   "(not finite)")
        return out
    if len(lead) >= want and (rc == 0 or mon["stopped"]) and not errors:
        span = f"loss {losses[0]:.4g} -> {losses[-1]:.4g}, finite" if losses else "no scalar loss seen by backward()"
        how = " (stopped by the trial after its last step)" if mon["stopped"] else ""
        out.update(result="passed", line=f"passed {len(lead)} steps ({span}){how}")
        return out
    workers = [e for e in errors if str(e.get("rank", "")).isdigit()]
    launcher = [e for e in errors if e not in workers]
    exited = _exited(launcher, output)
    err = workers[0] if workers else None if exited else launcher[0] if launcher else traceback_in(output)
    if err:
        line, where = stopped_line(err)
        out.update(result="stopped", line=line, stopped_at=where)
    elif exited:
        out.update(result="stopped", line=f"stopped: rank {exited[0]} exited with status {exited[1]} after "
                   f"{len(lead)} step(s), no Python exception (its last words: {exited[2]})")
    elif timed_out:
        out.update(result="stopped", line=f"stopped: timed out after {len(lead)} step(s) (trial.timeout)")
    elif rc == 0:
        out.update(result="stopped", line=f"stopped: the job ended after {len(lead)} of {want} steps, without error "
                   "(the overlay's data or epochs give fewer steps)")
    else:
        tail = [ln for ln in output.splitlines() if ln.strip()][-1:] or ["no output"]
        out.update(result="stopped", line=f"stopped: exit {rc} after {len(lead)} step(s), no Python exception "
                   f"recorded (killed? last output: {tail[0][:200]})")
    if out.get("stopped_at") is not None:
        out["line"] += f" [after {len(lead)} step(s)]" if lead else ""
    return out


_NOISE = re.compile(r"^(\[trainbox trial\]|[WEI]\d{4} |trainbox launcher:|\s*$)")


def _exited(launcher: list[dict], output: str) -> tuple[str, str, str] | None:
    """(rank, exit status, its last output line) when torchrun reported a worker that exited without a Python
    exception (sys.exit(1), a check of the job's own): torchrun's ChildFailedError names the root cause."""
    failed = next((e for e in launcher if e.get("type") == "ChildFailedError"), None)
    if failed is None:
        return None
    msg = failed.get("message", "")
    root = msg.split("Root Cause", 1)[-1]
    rank = re.search(r"rank\s*:\s*(\d+)", root)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", root)
    lines = output.splitlines()
    cut = next((i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln or
                "failed (exitcode" in ln), len(lines))
    words = [ln.strip() for ln in lines[:cut] if not _NOISE.match(ln)]
    return (rank.group(1) if rank else "?", code.group(1) if code else "?", (words[-1:] or ["none"])[0][:240])


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


__all__ = ["MEANINGS", "frame_of", "judge", "meaning", "read_monitor", "stopped_line", "traceback_in"]
