"""Verify reports: report.json, JUnit XML (one test case per artifact x check), markdown."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

from enginekit.compare.gate import VerifyReport


def write_json(reports: list[VerifyReport], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"passed": all(r.passed for r in reports), "entries": [r.to_json() for r in reports]}
    path.write_text(json.dumps(data, indent=2, default=_json_default))
    return path


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def write_junit(reports: list[VerifyReport], path: Path) -> Path:
    suites = ET.Element("testsuites", name="enginekit verify")
    for r in reports:
        cases = [(a, c) for a in r.artifacts for c in a.checks]
        skipped = [a for a in r.artifacts if not a.ran]
        suite = ET.SubElement(suites, "testsuite", name=f"{r.subject} {r.precision}",
                              tests=str(len(cases) + len(skipped)),
                              failures=str(sum(not c.passed for _, c in cases)), skipped=str(len(skipped)))
        for artifact, check in cases:
            case = ET.SubElement(suite, "testcase", classname=f"{r.subject}.{artifact.name}", name=check.name)
            if not check.passed:
                ET.SubElement(case, "failure", message=str(check)).text = str(check)
        for artifact in skipped:
            case = ET.SubElement(suite, "testcase", classname=f"{r.subject}.{artifact.name}", name="run")
            ET.SubElement(case, "skipped", message=artifact.reason)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
    return path


def write_markdown(reports: list[VerifyReport], path: Path) -> Path:
    lines = ["# enginekit verify", ""]
    for r in reports:
        state = "PASS" if r.passed else "FAIL"
        lines += [f"## {r.subject} ({r.precision}): {state}", "",
                  f"references: `{r.references_key[:12]}` ({r.references_status})", "",
                  "| artifact | ran | checks | failed |", "| --- | --- | --- | --- |"]
        for a in r.artifacts:
            failed = "; ".join(f"{c.name} {c.value:.4g} (limit {c.op} {c.limit:g})" for c in a.checks if not c.passed)
            lines.append(f"| {a.name} | {'yes' if a.ran else 'no: ' + a.reason} | {len(a.checks)} | {failed or '-'} |")
        pictures = [p for a in r.artifacts for p in a.pictures]
        if pictures:
            lines += [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in pictures]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path
