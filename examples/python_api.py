"""enginekit from Python: export, build and verify with the same stages as the CLI.

    .venv/bin/python examples/python_api.py                      # random weights: runs anywhere, no GPU
    .venv/bin/python examples/python_api.py yolo11n best.pt      # your own trained detector
    .venv/bin/python examples/python_api.py yolo11n best.pt images/   # ... judged on your images

With no arguments it runs Depth-Anything-V2-small with seeded random weights (their depth maps
vary, so its gates compare something). A random-weight detector gets an informative init (its
scores spread, so FP32 and FP16 gates compare detections); INT8 of random weights fails its task
gates honestly: give YOLO your weights. A detector's share gates (recall, precision) decide on their
95% interval: on the few detections of the embedded photographs they say "not enough evidence" and
name how many images would decide; give a folder of images of what the model sees.
Every call is cached by content: run it twice and the second run does no export or build.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")  # keep Ultralytics' model summaries off the output

import enginekit
from enginekit.requests import BuildRequest


def main(model: str = "depth", weights: str | None = None, images: str | None = None) -> None:
    out = Path(tempfile.mkdtemp(prefix="enginekit-example-"))
    side = 266 if model.startswith("depth") else 320  # Depth-Anything sides are multiples of 14
    shape = f"1x3x{side}x{side}"
    profile = f"{shape}:2x3x{side}x{side}:4x3x{side}x{side}"  # dynamic batch 1..4
    source = {"weights": weights} if weights else {"random_init": True}
    judged = {"images": images} if images else {}  # what the gates judge on (default: the embedded photographs)

    # 1. PyTorch -> simplified ONNX (FP16 as well), checked against PyTorch on photographs.
    exported = enginekit.export(model, fp16=True, input=shape, output=out / f"{model}.fp16.onnx", quiet=True,
                                **source, **judged)
    print(f"export:  {exported.output}  passed={exported.passed}  fp16 share={exported.fp16_share:.0%}")

    # 2. -> TensorRT engine (TensorRT-RTX builds without a GPU). Options as keywords, as in 1., or
    #    as one request object (validated at once; the CLI and recipes make the same ones).
    request = BuildRequest(target=model, precision="fp16", profiles=[profile], **source)
    built = enginekit.build(request, quiet=True)
    m = built.manifest
    print(f"build:   {built.engine}  ({m['backend']} {m['backend_version']}, targets {', '.join(m['targets'])})")

    # 3. The parity gate: every artifact against the PyTorch reference; reports on disk.
    #    `build=request` names the engine of step 2 (a cache hit: nothing is built again).
    checked = enginekit.verify(model, precision="fp16", build=request, report_dir=out / "report", quiet=True,
                               **judged, **({"image_count": 64} if images else {}))
    for report in checked.reports:
        for artifact in report.artifacts:
            # "pass" only where every check could have failed; "not-checked": an output the same for every input
            state = ("skipped: " + artifact.reason) if not artifact.ran else {"fail": "FAIL"}.get(artifact.status,
                                                                                                 artifact.status)
            print(f"verify:  {artifact.name:14} {state}")
    print(f"reports: {out / 'report'}")
    raise SystemExit(0 if checked.passed else 1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
