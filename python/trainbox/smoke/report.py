"""The smoke report for people (the matrix) and for CI (JUnit XML)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ..paths import REPO_ROOT
from .model import FAIL, PASS, SKIPPED
from .proc import _tail


def format_matrix(report: dict) -> str:
    """The summary: stack x step (status and duration), then every failure and skip with its reason."""
    steps = report["steps"]
    width = max([len("stack")] + [len(s["stack"]) for s in report["stacks"]])
    cell = 14

    def fmt(st: dict) -> str:
        mark = {PASS: "pass", FAIL: "FAIL", SKIPPED: "skip"}[st["status"]]
        return f"{mark} {st['duration_s']:.1f}s" if st["status"] != SKIPPED else mark

    lines = ["", "trainbox smoke: " + ("all steps passed" if report["ok"] else
                                       f"{report['summary']['fail']} step(s) FAILED"), ""]
    lines.append(f"{'stack':<{width}}  " + "".join(f"{s:<{cell}}" for s in steps) + "total")
    for s in report["stacks"]:
        by = {st["step"]: st for st in s["steps"]}
        total = sum(st["duration_s"] for st in s["steps"])
        lines.append(f"{s['stack']:<{width}}  " + "".join(f"{fmt(by[n]) if n in by else '-':<{cell}}" for n in steps)
                     + f"{total:.1f}s")
    lines.append("")
    for s in report["stacks"]:
        b = s["base"]
        if b.get("used"):
            sub = f" (substitute for {b['image']})" if b.get("substituted") else ""
            lines.append(f"base  {s['stack']}: built on {b['used']}{sub}: {b.get('reason')}")
        for st in s["steps"]:
            if st["status"] == PASS:
                if (st.get("details") or {}).get("note"):
                    lines.append(f"note  {s['stack']}/{st['step']}: {st['details']['note']}")
                continue
            mark = "FAIL" if st["status"] == FAIL else "skip"
            reason = (st["reason"] or "").replace("\n", "\n        ")
            lines.append(f"{mark}  {s['stack']}/{st['step']}: {reason}" + (f"  [log {st['log']}]"
                                                                         if st["status"] == FAIL and st["log"] else ""))
        if s["steps"] and (d := next((st for st in s["steps"] if st["step"] == "doctor"), None)):
            for f in (d.get("details") or {}).get("expected", []):
                lines.append(f"expected  {s['stack']}/doctor {f['id']} {f['status']}: {f['why']}")
    lines.append(f"\n{report['summary']['pass']} passed, {report['summary']['fail']} failed, "
                 f"{report['summary']['skipped']} skipped in {report['duration_s']:.0f}s")
    return "\n".join(lines)


def junit_xml(report: dict) -> bytes:
    """JUnit XML: one testsuite per stack, one testcase per step; failures carry the reason and the log tail."""
    root = ET.Element("testsuites", name="trainbox smoke", tests=str(len(report["stacks"]) * len(report["steps"])),
                      failures=str(report["summary"]["fail"]), skipped=str(report["summary"]["skipped"]),
                      errors="0", time=f"{report['duration_s']:.2f}")
    for s in report["stacks"]:
        steps = s["steps"]
        suite = ET.SubElement(root, "testsuite", name=s["stack"], tests=str(len(steps)),
                              failures=str(sum(st["status"] == FAIL for st in steps)),
                              skipped=str(sum(st["status"] == SKIPPED for st in steps)), errors="0",
                              time=f"{sum(st['duration_s'] for st in steps):.2f}",
                              timestamp=report["started_at"])
        props = ET.SubElement(suite, "properties")
        for k, v in (("device", s.get("device")), ("image", s.get("image")),
                     ("base.image", s["base"].get("image")), ("base.used", s["base"].get("used")),
                     ("base.substituted", s["base"].get("substituted")), ("base.reason", s["base"].get("reason")),
                     *((f"override.{k}", v) for k, v in s.get("overrides", {}).items())):
            if v is not None:
                ET.SubElement(props, "property", name=k, value=str(v))
        for st in steps:
            case = ET.SubElement(suite, "testcase", classname=f"trainbox.smoke.{s['stack']}", name=st["step"],
                                 time=f"{st['duration_s']:.2f}")
            if st["status"] == FAIL:
                msg = (st["reason"] or "failed").splitlines()[0][:500]
                fail = ET.SubElement(case, "failure", message=msg, type="SmokeStepFailed")
                body = [st["reason"] or ""]
                if st.get("log"):
                    body.append(f"log: {st['log']}")
                    tail = _tail(REPO_ROOT / st["log"])
                    if tail:
                        body.append(tail)
                fail.text = "\n".join(body)
            elif st["status"] == SKIPPED:
                ET.SubElement(case, "skipped", message=(st["reason"] or "skipped")[:500])
            elif st["reason"]:
                ET.SubElement(case, "system-out").text = st["reason"]
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


