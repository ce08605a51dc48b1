"""Verify reports: report.json, JUnit XML (one test case per artifact x check), markdown."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

from enginekit.compare.comparison import of_part
from enginekit.verification.gate import VerifyReport
from enginekit.compare.metrics import STATISTICS
from enginekit.verification.ladder import letterbox_legend
from enginekit.fsutil import atomic_write_text, json_text


def write_json(reports: list[VerifyReport], path: Path, ladder: list | None = None) -> Path:
    checked = [r for r in reports if not r.excused]  # engines allowed to go unchecked count for nothing
    data = {"passed": bool(checked) and all(r.passed for r in checked), "entries": [r.to_json() for r in reports]}
    if ladder:
        data["ladder"] = ladder  # verify --data: per precision and artifact against the labels
    atomic_write_text(path, json_text(data, indent=2, default=_json_default) + "\n")  # strict JSON: NaN is null
    return path


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def write_junit(reports: list[VerifyReport], path: Path) -> Path:
    suites = ET.Element("testsuites", name="enginekit verify")
    names = suite_names(reports)
    for r, suite_name in zip(reports, names):
        cases = [(a, c) for a in r.artifacts for c in a.checks]
        skipped = [a for a in r.artifacts if not a.ran]
        suite = ET.SubElement(suites, "testsuite", name=suite_name,
                              tests=str(len(cases) + len(skipped)),
                              failures=str(sum(not c.passed for _, c in cases)), skipped=str(len(skipped)))
        keys = dict(((a.name, a.key) for a in r.artifacts if a.key))  # which artifacts were judged, by cache key
        if r.engine_key:
            keys["engine"] = r.engine_key  # the engine's entry, once (an artifact named so is the same entry)
        if keys:
            props = ET.SubElement(suite, "properties")
            for name, value in keys.items():
                ET.SubElement(props, "property", name=f"key:{name}", value=value)
        seen: dict[tuple, int] = {}
        for artifact, check in cases:
            # a test case keeps its name from run to run (CI follows it): what the check is, never its figures
            name = check.case_name
            n = seen[(artifact.name, name)] = seen.get((artifact.name, name), 0) + 1
            case = ET.SubElement(suite, "testcase", classname=f"{r.subject}.{artifact.name}",
                                 name=name if n == 1 else f"{name} #{n}")
            if not check.passed:
                ET.SubElement(case, "failure", message=str(check)).text = str(check)
        for artifact in skipped:
            case = ET.SubElement(suite, "testcase", classname=f"{r.subject}.{artifact.name}", name="run")
            ET.SubElement(case, "skipped", message=artifact.reason)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
    return path


def suite_names(reports: list[VerifyReport]) -> list[str]:
    """A JUnit suite's name per report, each once: "subject precision", with the engine it judged where two reports
    would share that name (two engines of one model and precision), else a count; stable from run to run."""
    base = [f"{r.subject} {r.precision}" for r in reports]
    out = []
    for i, (r, name) in enumerate(zip(reports, base)):
        if base.count(name) > 1:
            name = f"{name} (engine {r.engine_key[:12]})" if r.engine_key else f"{name} #{base[:i].count(name) + 1}"
        out.append(name)
    return [n if out.count(n) == 1 else f"{n} #{out[:i].count(n) + 1}" for i, n in enumerate(out)]


def write_markdown(reports: list[VerifyReport], path: Path, ladder: list | None = None) -> Path:
    lines = ["# enginekit verify", ""] + ladder_lines(reports, ladder or [])
    for r in reports:
        unchecked = [a.name for a in r.artifacts if a.ran and a.passed and not a.checked]
        state = "FAIL" if not r.passed else (f"PASS, not everything checked ({', '.join(unchecked)}: "
                                             "a reference output is the same for every input)" if unchecked else "PASS")
        lines += [f"## {r.subject} ({r.precision}): {state}", "",
                  f"references: `{r.references_key[:12]}` ({r.references_status})", "",
                  "| artifact | ran | checks | failed |", "| --- | --- | --- | --- |"]
        for a in r.artifacts:
            failed = "; ".join(c.name if c.condition else f"{c.name} {c.value:.4g} (limit {c.op} {c.limit:g})"
                               for c in a.checks if not c.passed)
            lines.append(f"| {a.name} | {'yes' if a.ran else 'no: ' + a.reason} | {len(a.checks)} | {failed or '-'} |")
        lines += [""] + part_lines(r) + task_lines(r)
        pictures = [p for a in r.artifacts for p in a.pictures]
        if pictures:
            lines += [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in pictures]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def ladder_lines(reports: list[VerifyReport], ladder: list) -> list[str]:
    """verify --data: the precision ladder against the labels (headline metric, drop, gate, size, latency)."""
    if not ladder:
        return []
    info = next((r.ground_truth for r in reports if r.ground_truth), {})
    metric = ladder[0]["metric"]
    lines = [f"## Against the labels of `{info.get('data', '?')}` ({info.get('split', 'val')}: "
             f"{info.get('images', '?')} images, {info.get('instances', '?')} instances)", "",
             f"| precision | artifact | letterbox | {metric} | drop | gate | size MB | p50 ms (bench) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in ladder:
        drop = "" if r["artifact"] == "PyTorch" or r["drop"] is None else f"{r['drop']:+.4f}"
        gate = ("reference" if r["artifact"] == "PyTorch" else "") if r["passed"] is None else \
            f"{'pass' if r['passed'] else 'FAIL'} (limit {r['limit']:g})"
        lat = r.get("latency_ms")
        latency = f"{lat['p50_ms']:.2f} ({lat['backend']})" if lat else ""
        lines.append(f"| {r['precision']} | {r['artifact']} | {r.get('letterbox') or ''} | {r['value']:.4f} | {drop} | {gate} | "
                     f"{r['size_mb'] or ''} | {latency} |")
    legend = letterbox_legend(ladder)
    return lines + ([""] + [legend] if legend else []) + [""]


TASK_FIGURES = ("conf", "reference_detections", "candidate_detections", "recall", "precision", "map50", "map50_95",
                "mask_map50", "mask_map50_95", "pose_map50", "pose_map50_95", "box_map50", "top1_agreement",
                "top5_overlap", "miou", "pixel_accuracy", "score_shift_mean", "score_shift_max", "abs_rel", "delta1")


def _limit_text(limits: dict) -> str:
    """``rel L2 <= 0.02, cosine >= 0.999``"""
    return ", ".join(STATISTICS[name].describe_limit(limit) for name, limit in limits.items() if limit is not None)


def _fig(worst: dict, name: str, spec: str) -> str:
    """One figure of a row; "-" where there is none (a stored verdict keeps an infinite PSNR or a NaN as null)."""
    value = worst.get(name)
    return "-" if value is None else format(value, spec)


def part_lines(report: VerifyReport) -> list[str]:
    """Markdown table: one row per artifact x output part, worst figures over all inputs."""
    figures = " | ".join(STATISTICS[n].label for n in ("max_abs", "p99_abs", "median_abs", "rel_l2", "cosine", "psnr"))
    lines = [f"| artifact | part | {figures} | limits | gate |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for a in report.artifacts:
        for part, info in a.parts.items():
            w = info["worst"]
            failed = [c.name[len(f"parity {part}"):].lstrip(": ") for c in a.checks if not c.passed and of_part(c.name, part)]
            gate = ("FAIL " + ", ".join(failed) if failed
                    else "not checked (the reference is the same for every input)" if "constant" in info else "pass")
            lines.append(f"| {a.name} | {part}: {info['of']} | {_fig(w, 'max_abs', '.3g')} | {_fig(w, 'p99_abs', '.3g')} | "
                         f"{_fig(w, 'median_abs', '.3g')} | {_fig(w, 'rel_l2', '.3g')} | {_fig(w, 'cosine', '.6f')} | "
                         f"{_fig(w, 'psnr', '.1f')} | {_limit_text(info['limits'])} | {gate} |")
    return lines if len(lines) > 2 else []


def task_lines(report: VerifyReport) -> list[str]:
    """Markdown table: the task metrics of each artifact (against the FP32 reference's predictions)."""
    keys = [k for k in TASK_FIGURES if any(k in a.task for a in report.artifacts)]
    if not keys:
        return []
    lines = ["", "| artifact | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
    for a in report.artifacts:
        if a.task:
            lines.append(f"| {a.name} | " + " | ".join(f"{a.task[k]:.4g}" if k in a.task else "" for k in keys) + " |")
    return lines
