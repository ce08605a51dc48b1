"""enginekit from Python: export, build and verify with the same stages as the CLI.

    .venv/bin/python examples/python_api.py        # random weights: runs anywhere, no GPU

Every call is cached by content: run it twice and the second run does no export or build.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")  # keep Ultralytics' model summaries off the output

import enginekit
from enginekit.requests import BuildRequest

PROFILE = "1x3x320x320:2x3x320x320:4x3x320x320"  # dynamic batch 1..4


def main() -> None:
    out = Path(tempfile.mkdtemp(prefix="enginekit-example-"))

    # 1. PyTorch -> simplified ONNX (FP16 as well), checked against PyTorch on photographs.
    exported = enginekit.export("yolo12n", random_init=True, fp16=True, input="1x3x320x320",
                                output=out / "yolo12n.fp16.onnx", quiet=True)
    print(f"export:  {exported.output}  passed={exported.passed}  fp16 share={exported.fp16_share:.0%}")

    # 2. -> TensorRT engine (TensorRT-RTX builds without a GPU). Options as keywords, as in 1., or
    #    as one request object (validated at once; the CLI and recipes make the same ones).
    request = BuildRequest(target="yolo12n", random_init=True, precision="fp16", profiles=[PROFILE])
    built = enginekit.build(request, quiet=True)
    m = built.manifest
    print(f"build:   {built.engine}  ({m['backend']} {m['backend_version']}, targets {', '.join(m['targets'])})")

    # 3. The parity gate: every artifact against the PyTorch reference; reports on disk.
    #    `build=request` names the engine of step 2 (a cache hit: nothing is built again).
    checked = enginekit.verify("yolo12n", precision="fp16", build=request, report_dir=out / "report", quiet=True)
    for report in checked.reports:
        for artifact in report.artifacts:
            state = "pass" if artifact.passed and artifact.ran else ("skipped: " + artifact.reason if not artifact.ran else "FAIL")
            print(f"verify:  {artifact.name:14} {state}")
    print(f"reports: {out / 'report'}")
    raise SystemExit(0 if checked.passed else 1)


if __name__ == "__main__":
    main()
