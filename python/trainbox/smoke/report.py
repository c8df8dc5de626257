"""The smoke report for people (the matrix) and for CI (JUnit XML)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ..paths import REPO_ROOT
from .model import FAIL, NOT_CHECKED, PASS, SKIPPED, XFAIL, XPASS
from .proc import log_tail


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
        lines += _recipe_lines(s)
        if s["steps"] and (d := next((st for st in s["steps"] if st["step"] == "doctor"), None)):
            for f in (d.get("details") or {}).get("expected", []):
                lines.append(f"expected  {s['stack']}/doctor {f['id']} {f['status']}: {f['why']}")
    lines.append(f"\n{report['summary']['pass']} passed, {report['summary']['fail']} failed, "
                 f"{report['summary']['skipped']} skipped in {report['duration_s']:.0f}s")
    return "\n".join(lines)


def _args_rows(stack: dict) -> list[dict]:
    st = next((st for st in stack["steps"] if st["step"] == "args"), None)
    return list(((st or {}).get("details") or {}).get("recipes") or [])


def _recipe_lines(stack: dict) -> list[str]:
    """The args step's recipes that are neither a plain pass nor already in its failure reason: XFAIL (a gap the
    profile names) and an accepted `not checked`, each with why."""
    out = []
    for r in _args_rows(stack):
        if r.get("result") == XFAIL:
            out.append(f"XFAIL {stack['stack']}/args {r['name']}: {r.get('why')} (saw: {r.get('summary')})")
        elif r.get("result") == NOT_CHECKED:
            out.append(f"not checked  {stack['stack']}/args {r['summary']} ({r.get('why')})")
    return out


def _recipe_cases(suite: ET.Element, stack: dict) -> None:
    """One testcase per recipe of the args step: XFAIL and an accepted `not checked` as skipped (with why), XPASS
    and FAIL as failures."""
    for r in _args_rows(stack):
        case = ET.SubElement(suite, "testcase", classname=f"trainbox.smoke.{stack['stack']}.args", name=r["name"],
                             time="0")
        result, why, summary = r.get("result"), r.get("why"), r.get("summary") or ""
        if result == XFAIL:
            ET.SubElement(case, "skipped", type="xfail", message=f"XFAIL: {why}"[:500]).text = summary
        elif result == NOT_CHECKED:
            ET.SubElement(case, "skipped", type="not checked", message=f"not checked: {summary}"[:500])
        elif result in (XPASS, FAIL):
            label = "XPASS" if result == XPASS else "FAIL"
            ET.SubElement(case, "failure", type=label, message=f"{label}: {summary}"[:500]).text = \
                "\n".join(x for x in (summary, why) if x)
        else:
            ET.SubElement(case, "system-out").text = summary


def junit_xml(report: dict) -> bytes:
    """JUnit XML: one testsuite per stack, one testcase per step; failures carry the reason and the log tail."""
    rows = [r for s in report["stacks"] for r in _args_rows(s)]
    root = ET.Element("testsuites", name="trainbox smoke",
                      tests=str(len(report["stacks"]) * len(report["steps"]) + len(rows)),
                      failures=str(report["summary"]["fail"] + sum(r.get("result") in (FAIL, XPASS) for r in rows)),
                      skipped=str(report["summary"]["skipped"] + sum(r.get("result") in (XFAIL, NOT_CHECKED)
                                                                    for r in rows)),
                      errors="0", time=f"{report['duration_s']:.2f}")
    for s in report["stacks"]:
        steps, mine = s["steps"], _args_rows(s)
        suite = ET.SubElement(root, "testsuite", name=s["stack"], tests=str(len(steps) + len(mine)),
                              failures=str(sum(st["status"] == FAIL for st in steps)
                                           + sum(r.get("result") in (FAIL, XPASS) for r in mine)),
                              skipped=str(sum(st["status"] == SKIPPED for st in steps)
                                          + sum(r.get("result") in (XFAIL, NOT_CHECKED) for r in mine)), errors="0",
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
                    tail = log_tail(REPO_ROOT / st["log"])
                    if tail:
                        body.append(tail)
                fail.text = "\n".join(body)
            elif st["status"] == SKIPPED:
                ET.SubElement(case, "skipped", message=(st["reason"] or "skipped")[:500])
            elif st["reason"]:
                ET.SubElement(case, "system-out").text = st["reason"]
        _recipe_cases(suite, s)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


