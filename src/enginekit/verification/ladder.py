"""The precision ladder of ``verify --data``: per precision and artifact, the headline figure against the
labels, its drop against the FP32 PyTorch model, the file's size, and its latency where ``bench`` measured it
on this machine (a bench record in the cache; no record, no figure)."""

from __future__ import annotations


def precision_ladder(reports, latency_of=None) -> list[dict]:
    """Rows: the FP32 PyTorch reference first, then every scored artifact once (graphs a chain shares are one
    row), in the order verified. ``latency_of(identity)``: bench's p50 at batch 1 on this machine, or None."""
    rows: list[dict] = []
    seen: set[str] = set()
    for report in reports:
        headline = (report.ground_truth or {}).get("headline")
        for art in report.artifacts:
            gt = art.ground_truth
            if not gt or headline not in gt:
                continue
            ref = gt.get("reference", {})
            key = f"reference:{ref.get(headline)}:{gt.get('rectangles', 0)}"
            if ref and key not in seen and not any(r["artifact"] == "PyTorch" and r["value"] == ref.get(headline)
                                                   for r in rows):
                seen.add(key)
                rows.append({"precision": "fp32", "artifact": "PyTorch", "metric": headline, "value": ref[headline],
                             "drop": 0.0, "limit": None, "passed": None, "size_mb": None, "latency_ms": None,
                             "images": gt.get("images"), "instances": gt.get("instances"),
                             "letterbox": ref.get("letterbox")})
            identity = gt.get("identity", f"{report.engine_key}:{art.name}")
            if identity in seen:
                continue
            seen.add(identity)
            drop = gt.get(f"{headline}_drop")
            limit = (gt.get("limits") or {}).get(f"{headline}_drop")
            latency = latency_of(identity) if latency_of is not None else None
            failing = [c.name for c in getattr(art, "checks", []) if not c.passed]
            gate = next((c for c in getattr(art, "checks", []) if getattr(c, "key", "") == f"labels {headline} drop"),
                        None)  # the labels' gate on the drop, decided on its interval
            passed = gate.passed if gate is not None else (None if limit is None or drop is None else drop <= limit)
            rows.append({"precision": art.precision, "artifact": art.name, "metric": headline, "value": gt[headline],
                         "drop": drop, "limit": limit, "passed": None if limit is None or drop is None else passed,
                         "interval": (gt.get("intervals") or {}).get(f"{headline}_drop"),
                         "undecided": gate is not None and "not enough evidence" in gate.name,
                         # the artifact's whole verdict (labels, parity and every other check): what the exit code
                         # and JUnit say of it, so the table's gate column says it too
                         "verdict": getattr(art, "passed", None), "failing": failing,
                         "size_mb": round(art.size_bytes / 2**20, 2) if art.size_bytes else None,
                         "latency_ms": latency, "images": gt.get("images"), "instances": gt.get("instances"),
                         "letterbox": gt.get("letterbox")})
    return rows


#: what the ladder's letterbox column means, said once under it
LETTERBOX_LEGEND = ("letterbox: 'val rect' is yolo val's rectangle per image (rect=True at batch 1: the longer side at "
                    "the network's, stride-aligned plus half a stride), as YOLO(pt).val() scores; HxW the full size, "
                    "as YOLO(file).val() scores a file of one size")


def letterbox_legend(ladder: list) -> str | None:
    return LETTERBOX_LEGEND if any("val rect" in (r.get("letterbox") or "") for r in ladder) else None
