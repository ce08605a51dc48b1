"""Post-install check: the packages that share folders or stub out still work.

`nvidia-modelopt[onnx]` installs onnxruntime-gpu; a plain onnxruntime beside it would write the
same `onnxruntime/` folder. Run one tiny graph on ONNX Runtime and import the rest.
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata


def main() -> int:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    both = [d for d in ("onnxruntime", "onnxruntime-gpu") if _installed(d)]
    if len(both) > 1:
        print("setup check: both onnxruntime and onnxruntime-gpu are installed; uninstall onnxruntime", file=sys.stderr)
        return 1
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": np.array([-1.0, 2.0], dtype=np.float32)})
    if y.tolist() != [0.0, 2.0]:
        print(f"setup check: ONNX Runtime computed {y.tolist()} for Relu([-1, 2])", file=sys.stderr)
        return 1
    for module in ("torch", "torchvision", "ultralytics", "transformers", "onnxsim", "modelopt.onnx", "polygraphy", "tensorrt_rtx"):
        importlib.import_module(module)
    print(f"setup check: ok (onnxruntime {ort.__version__}, onnx {onnx.__version__})")
    return 0


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
