"""Where an INT8 graph loses accuracy: every intermediate tensor of an FP32 graph against the same tensor of its
INT8 (Q/DQ) graph, on a photograph, in graph order.

    .venv/bin/python benchmarks/int8_layers.py FP32.onnx INT8.onnx [--image bus.jpg] [--size 512]
        [--mean 0.485,0.456,0.406 --std 0.229,0.224,0.225]

Both graphs run on ONNX Runtime's CPU provider with graph optimisations off, every Conv/Relu/Add/Resize/
Concat/pooling output of the FP32 graph marked as an output (the INT8 graph keeps those names: ModelOpt
inserts Q/DQ pairs around them). Per tensor: relative L2 error, and the FP32 tensor's max and std (a max far
above the std means coarse INT8 steps); for outputs with a class axis (N, C, H, W), the argmax agreement and
the reference's median top-2 margin. The photograph is stretched to SIZE x SIZE and normalised by mean/std.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

OPS = ("Conv", "Relu", "Add", "Resize", "Concat", "GlobalAveragePool", "ReduceMean", "MatMul", "Gemm")


def _outputs(path: Path, names: list[str], x: np.ndarray) -> dict[str, np.ndarray]:
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    have = {o for n in model.graph.node for o in n.output}
    declared = {o.name for o in model.graph.output}
    for name in names:
        if name in have and name not in declared:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    values = session.run(None, {session.get_inputs()[0].name: x})
    return dict(zip([o.name for o in session.get_outputs()], values))


def main() -> None:
    import cv2
    import onnx

    from enginekit.images import embedded_image_paths

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fp32", type=Path)
    parser.add_argument("int8", type=Path)
    parser.add_argument("--image", default="bus.jpg", help="a file, or the name of an embedded photograph")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--mean", default="0.485,0.456,0.406")
    parser.add_argument("--std", default="0.229,0.224,0.225")
    args = parser.parse_args()

    image = Path(args.image)
    if not image.is_file():
        image = next(p for p in embedded_image_paths() if p.name == args.image)
    rgb = cv2.resize(cv2.imread(str(image))[..., ::-1], (args.size, args.size), interpolation=cv2.INTER_LINEAR)
    mean = np.array([float(v) for v in args.mean.split(",")], np.float32)
    std = np.array([float(v) for v in args.std.split(",")], np.float32)
    x = ((rgb.astype(np.float32) / 255 - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)

    graph = onnx.load(str(args.fp32), load_external_data=False).graph
    names = [n.output[0] for n in graph.node if n.op_type in OPS] + [o.name for o in graph.output]
    ref, got = _outputs(args.fp32, names, x), _outputs(args.int8, names, x)
    print(f"{'tensor':70s} {'rel L2':>8s} {'max':>8s} {'std':>8s}")
    for name in dict.fromkeys(names):
        if name in ref and name in got and ref[name].shape == got[name].shape:
            a, b = ref[name].astype(np.float64), got[name].astype(np.float64)
            rel = np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-12)
            print(f"{name[-70:]:70s} {rel:8.4f} {np.abs(a).max():8.3g} {a.std():8.3g}")
    for out in graph.output:
        a, b = ref.get(out.name), got.get(out.name)
        if a is None or b is None or a.ndim != 4 or a.shape[1] < 2:
            continue
        top2 = np.sort(a, axis=1)[:, -2:]
        print(f"{out.name}: argmax agreement {(a.argmax(1) == b.argmax(1)).mean():.4f}, reference median top-2 "
              f"margin {np.median(top2[:, 1] - top2[:, 0]):.3g} (logit std {a.std():.3g})")


if __name__ == "__main__":
    main()
