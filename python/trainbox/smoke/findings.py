"""Doctor findings in a smoke container: which are expected without an accelerator or on a substitute base."""

from __future__ import annotations

from .model import (
    EXPECTED_IN_SMOKE_CONTAINER,
    EXPECTED_ON_SUBSTITUTE,
    EXPECTED_WITHOUT_ACCELERATOR,
)


def classify_doctor(report: dict, device: str, substituted: bool) -> dict:
    """Split a doctor report's FAIL/WARN findings into expected ones (this runner / the substitute base must
    produce them) and unexpected ones. Returns the step's details."""
    no_acc = set(EXPECTED_WITHOUT_ACCELERATOR.get(device, ()))
    on_sub = set(EXPECTED_ON_SUBSTITUTE.get(device, ())) if substituted else set()
    expected, unexpected, warnings = [], [], []
    for c in report.get("checks") or []:
        status = str(c.get("status", "")).upper()
        if status not in ("FAIL", "WARN"):
            continue
        cid = c.get("id")
        f = {"id": cid, "status": status, "message": c.get("message"), "fix": c.get("fix")}
        if cid in on_sub:
            expected.append({**f, "why": "substitute base: no CANN toolkit in it"})
        elif cid in no_acc:
            why = f"no {device.upper()} is given to the smoke container"
            if cid == "torch.import" and device == "npu":
                why = ("torch auto-loads torch_npu, which cannot load without the NPU driver" +
                       (" and CANN (substitute base)" if substituted else "") + " in the smoke container")
            expected.append({**f, "why": why})
        elif cid in EXPECTED_IN_SMOKE_CONTAINER:
            expected.append({**f, "why": "the smoke container keeps the engine's default limits (`trainbox run` "
                                         "raises them for real jobs)"})
        elif status == "FAIL":
            unexpected.append(f)
        else:
            warnings.append(f)
    return {"summary": report.get("summary"), "context": report.get("context"), "expected": expected,
            "unexpected": unexpected, "warnings": warnings}


