"""The streaming pipeline's goals on a GPU: yolo12n + Depth-Anything-V2-small at 384, FP16, a 1080p video.

    python benchmarks/stream_gpu.py [--backend auto|tensorrt|onnxruntime-cuda|torch] [--frames 300] [--repeat 3]
                                    [--yolo yolo12n.fp16.onnx] [--depth depth.fp16.onnx] [--json out.json]
    python benchmarks/stream_gpu.py --device cpu          # the same measurement on a CPU, small sizes

A 1920x1080 MPEG-4 video is written first from the photographs Ultralytics and scikit-image ship (OpenCV;
nothing downloaded). Each run streams it through ``enginekit.runtime.stream`` (decode in its own thread,
each model warmed up on the frame shape before timing, the garbage collector held):

  yolo alone     yolo12n, one step in flight (a step's latency with nothing queued before it)
  depth alone    Depth-Anything-V2-small, likewise
  pair           both on every frame, one step in flight (each model on its own CUDA stream)
  pair stream    both, two steps in flight (the next frame's network queued before this one's postprocessing)
  pair, before   both through ``Pipeline(frame)`` frame by frame, decoding inline, the collector not held
                 (how the runtime ran a video before the stream)

``--repeat N`` runs the five N times over the same loaded models (one process): each repeat's table and goals,
then each goal's median over the repeats (what the goals are judged by: one run per figure is not enough).

The goals, checked on the figures above (per model alone, ``budget``: network p50 by CUDA events, e2e p50 the
frame's latency, their ratio):
  yolo alone e2e p50 <= 1.3 x its network p50; depth alone e2e p50 <= 1.25 x its network p50;
  pair p50 <= 1.1 x (the two networks side by side: per step of the pair, from the first network's start to the
  last one's end on the GPU, by the CUDA events around each network; their p50) + the slower model's way around its
  network alone (its e2e p50 alone - its network p50 alone; the slower: the larger e2e p50 alone): what the runtime
  adds around networks that share the GPU, not how fast the GPU runs two networks at once. Where no such events
  are read (no step on a GPU), the bound is the slower model's own network p50 in the pair + its way alone (the
  reading before, also printed as a row that is not judged);
  pair p99 <= 1.3 x pair p50; the stream's frames/s (pair stream) >= 0.95 x 1000 / pair p50.
Models: random weights by default (timing does not depend on them), or graphs/engines given with --yolo and
--depth (e.g. FP16 graphs exported on a CPU machine: enginekit export yolo12n --random-init --fp16
--input 1x3x384x384 -o yolo12n.fp16.onnx). Latencies are milliseconds per step (frame).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def load(target: str, args, size: int):
    import enginekit

    extra = {"gpu_letterbox": True} if args.gpu_letterbox else {}
    if Path(target).suffix in (".onnx", ".plan", ".engine"):
        return enginekit.load(target, backend=args.backend, device=args.device, input_size=(size, size), **extra)
    return enginekit.load(target, precision=args.precision, backend=args.backend, random_init=True,
                          device=args.device, input_size=(size, size), **extra)


def prioritize(predictor) -> str:
    """Run ``predictor``'s GPU work (upload, preprocessing, network, postprocessing) on a CUDA stream of the highest
    priority: its kernels are scheduled before the other model's queued ones. torch only (ONNX Runtime and TensorRT
    sessions keep the stream they were made with)."""
    import torch

    if predictor.backend != "torch":
        raise SystemExit(f"--priority: {predictor.backend} keeps the stream its session was made with (torch only)")
    device = torch.device(predictor.device)
    low, high = torch.cuda.Stream.priority_range()
    predictor.stream = predictor.session.stream = torch.cuda.Stream(device=device, priority=high)
    predictor._post_stream = torch.cuda.Stream(device=device, priority=high)
    return f"{predictor.model}: stream priority {high} (range {low} to {high})"


#: ``--bind``, ``--pace``, ``--first``, ``--dispatch``: set by main
SETTINGS = {"bind": True, "pace": None, "first": "yolo", "dispatch": "launch"}


class Spans:
    """The two networks side by side, per step of a pair with one step in flight: from the first network's start to
    the last one's end on the GPU (ms), read from the CUDA events each model's step recorded around its network
    (``GpuBatch.events`` 1 and 2: a step graph's own, or those queued around the session's call).

    Each predictor's ``finish_gpu`` is wrapped to keep its batch's two events; the stream's answer that completes a
    step reads them (three ``elapsed_time`` calls on that model's thread, before the caller is woken: a few
    microseconds added to that step, never taken off) before the next step can record them again."""

    def __init__(self, s, predictors):
        self.spans: list[float] = []
        self.missed = 0
        self._last: dict = {}
        self._undo = []
        for p in predictors:
            real = p.finish_gpu

            def finish(batch, _real=real, _p=p):
                out = _real(batch)
                self._last[id(_p)] = (batch.events[1], batch.events[2])
                return out

            p.finish_gpu = finish
            self._undo.append(p)
        real_answer = s._answer

        def answer(step, model, results, times):
            with s._lock:
                last = s._due.get(step.index) == {model}
            if last:
                self._read(predictors)
            real_answer(step, model, results, times)

        s._answer = answer

    def _read(self, predictors) -> None:
        pairs = [self._last.pop(id(p), None) for p in predictors]
        if any(pair is None for pair in pairs):
            self.missed += 1
            return
        ref = pairs[0][0]
        starts = [0.0] + [ref.elapsed_time(start) for start, _ in pairs[1:]]
        ends = [ref.elapsed_time(end) for _, end in pairs]
        self.spans.append(max(ends) - min(starts))

    def close(self) -> None:
        for p in self._undo:
            del p.finish_gpu  # the instance's wrapper: the class's method again


def stream(predictors, video: Path, frames: int, in_flight: int, names):
    from enginekit.runtime.sources import open_source
    from enginekit.runtime.stream import Stream, StreamOptions, percentiles

    if SETTINGS["first"] == "depth" and len(predictors) == 2:  # the pair's depth model dispatched first
        predictors, names = predictors[::-1], names[::-1]
    s = Stream(predictors, [open_source(str(video), max_frames=frames)],
               StreamOptions(in_flight=in_flight, pace=SETTINGS["pace"]), names=names)
    s.bind_ahead, s.dispatch = SETTINGS["bind"], SETTINGS["dispatch"]
    gpu = all(p.info.on_gpu for p in predictors)
    spans = Spans(s, predictors) if len(predictors) > 1 and in_flight == 1 and gpu else None
    try:
        out = s.run().to_json()
    finally:
        if spans is not None:
            spans.close()
    if spans is not None and spans.spans:
        # every answered step is a timed one (warm-ups run apart: their finish_gpu is kept, then overwritten)
        out["networks_span_ms"] = percentiles(spans.spans)
        out["networks_span_steps"] = {"read": len(spans.spans), "missed": spans.missed}
    return out


def before(predictors, video: Path, frames: int, warmup: int = 5) -> dict:
    """Pipeline(frame) frame by frame, decoding inline, the collector free to run: the runtime before the stream."""
    import cv2

    from enginekit.runtime.predictor import Pipeline
    from enginekit.runtime.stream import percentiles

    pipeline = Pipeline(predictors)
    cap = cv2.VideoCapture(str(video))
    ok, frame = cap.read()
    for _ in range(warmup):
        pipeline(frame)
    pauses: list[float] = []
    start = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            pauses.append((time.perf_counter() - start[0]) * 1e3)

    gc.callbacks.append(on_gc)
    steps, t0 = [], time.perf_counter()
    try:
        while ok and len(steps) < frames:
            t = time.perf_counter()
            pipeline(frame)
            steps.append((time.perf_counter() - t) * 1e3)
            ok, frame = cap.read()
    finally:
        gc.callbacks.remove(on_gc)
        pipeline.close()
    wall = time.perf_counter() - t0
    return {"frame_ms": percentiles(steps), "fps": round(len(steps) / wall, 2),
            "gc": {"pauses": len([p for p in pauses if p > 1.0]), "max_ms": round(max(pauses, default=0.0), 3)}}


def budget(run: dict) -> dict:
    """A model alone: its network p50 (CUDA events around the network on a GPU), its e2e p50 (the frame's latency:
    upload, preprocessing, network, postprocessing, results on the host) and their ratio."""
    (model, m), = run["models"].items()
    network = (m.get("infer_ms") or {}).get("p50") or float("nan")
    e2e = (m.get("latency_ms") or {}).get("p50") or run["frame_ms"]["p50"]
    return {"model": model, "network_p50": round(network, 3), "e2e_p50": round(e2e, 3),
            "ratio": round(e2e / network, 3) if network == network and network > 0 else float("nan")}


#: the goals: the frame's way around the network per model alone, and the pair's
E2E_LIMITS = {"yolo alone": 1.3, "depth alone": 1.25}


def slower_way(runs: dict) -> tuple[float, str]:
    """(way, model): the way around its network alone (e2e p50 - network p50) of the model whose e2e p50 alone is
    the larger."""
    alone = max((budget(runs[name]) for name in ("yolo alone", "depth alone")), key=lambda b: b["e2e_p50"])
    return round(alone["e2e_p50"] - alone["network_p50"], 3), alone["model"]


def per_model_bound(runs: dict) -> tuple[float, str]:
    """(bound, model): a model's own network p50 in the pair (CUDA events) plus its way around its network alone,
    for the model that makes this largest (the reading before the two networks' span)."""
    pair_models = runs["pair"].get("models") or {}
    best = (float("nan"), "")
    for name in ("yolo alone", "depth alone"):
        alone = budget(runs[name])
        in_pair = ((pair_models.get(alone["model"]) or {}).get("infer_ms") or {}).get("p50")
        if in_pair is None:
            continue
        bound = in_pair + (alone["e2e_p50"] - alone["network_p50"])
        if not best[0] == best[0] or bound > best[0]:
            best = (round(bound, 3), alone["model"])
    return best


def pair_goal(runs: dict) -> dict:
    """The pair's first goal: p50 <= 1.1 x the two networks side by side (their span's p50) + the slower model's
    way around its network alone; where no span was read, 1.1 x the per-model bound."""
    pair50 = runs["pair"]["frame_ms"]["p50"]
    span = (runs["pair"].get("networks_span_ms") or {}).get("p50")
    if span is None:
        bound, model = per_model_bound(runs)
        return {"goal": f"pair p50 / ({model} network p50 in the pair + its way around it alone)",
                "value": round(pair50 / bound, 3), "limit": "<= 1.1", "met": pair50 <= 1.1 * bound}
    way, model = slower_way(runs)
    limit = 1.1 * span + way
    return {"goal": f"pair p50 / (1.1 x the two networks side by side p50 + {model}'s way around its network alone)",
            "value": round(pair50 / limit, 3), "limit": "<= 1.0", "met": pair50 <= limit}


def goals(runs: dict) -> list[dict]:
    if "pair" not in runs:  # --only yolo: the detector's own goal
        b = budget(runs["yolo alone"])
        limit = E2E_LIMITS["yolo alone"]
        return [{"goal": f"{b['model']} alone e2e p50 / network p50", "value": b["ratio"], "limit": f"<= {limit}",
                 "met": b["ratio"] <= limit}]
    pair50, pair99 = runs["pair"]["frame_ms"]["p50"], runs["pair"]["frame_ms"]["p99"]
    fps = runs["pair stream"]["fps"]
    out = []
    for name, limit in E2E_LIMITS.items():
        b = budget(runs[name])
        out.append({"goal": f"{b['model']} alone e2e p50 / network p50", "value": b["ratio"], "limit": f"<= {limit}",
                     "met": b["ratio"] <= limit})
    return out + [
        pair_goal(runs),
        {"goal": "pair p99 / pair p50", "value": round(pair99 / pair50, 3), "limit": "<= 1.3", "met": pair99 <= 1.3 * pair50},
        {"goal": "stream frames/s / (1000 / pair p50)", "value": round(fps / (1000.0 / pair50), 3), "limit": ">= 0.95",
         "met": fps >= 0.95 * 1000.0 / pair50},
    ]


def readings(runs: dict) -> list[dict]:
    """Figures shown beside the goals, not judged: the pair's p50 against the per-model bound (the reading before)."""
    if "pair" not in runs or not (runs["pair"].get("networks_span_ms") or {}):
        return []
    bound, model = per_model_bound(runs)
    pair50 = runs["pair"]["frame_ms"]["p50"]
    return [{"reading": f"pair p50 / ({model} network p50 in the pair + its way around it alone)",
             "value": round(pair50 / bound, 3), "was_limit": "<= 1.1"}]


def median_goals(each: list[list[dict]]) -> list[dict]:
    """Each goal's median value over the repeats, judged against its limit."""
    import statistics

    out = []
    for i, g in enumerate(each[0]):
        values = [goals_of[i]["value"] for goals_of in each]
        value = round(statistics.median(values), 3)
        bound = float(g["limit"].split()[-1])
        met = value <= bound if g["limit"].startswith("<=") else value >= bound
        out.append({"goal": g["goal"], "value": value, "limit": g["limit"], "met": met, "each": values})
    return out


def show(runs: dict, index: int) -> None:
    """One repeat's table: per run the step's figures, and per model its stages' p50 (where the time goes)."""
    print(f"repeat {index}:")
    print(f"{'run':<14} {'decode':>7} {'p50':>8} {'p95':>8} {'p99':>8} {'frames/s':>9} {'gc>1ms':>7}  "
          "per model p50 pre / infer / post (latency)")
    for name, r in runs.items():
        f = r["frame_ms"]
        decode = (r.get("decode_ms") or {}).get("p50")
        stages = " | ".join(
            f"{m}: " + " / ".join(f"{(v.get(k) or {}).get('p50', 0):.2f}" for k in ("preprocess_ms", "infer_ms",
                                                                                   "postprocess_ms"))
            + f" ({(v.get('latency_ms') or {}).get('p50', 0):.2f})" for m, v in r.get("models", {}).items())
        print(f"{name:<14} {decode if decode is not None else float('nan'):>7.2f} {f['p50']:>8.2f} {f['p95']:>8.2f} "
              f"{f['p99']:>8.2f} {r['fps']:>9.1f} {r['gc']['pauses']:>7}  {stages}")
    for name in (n for n in E2E_LIMITS if n in runs):
        b = budget(runs[name])
        print(f"  budget {b['model']} alone: network p50 {b['network_p50']:.2f} ms, e2e p50 {b['e2e_p50']:.2f} ms, "
              f"ratio {b['ratio']:.2f}")
    span = runs.get("pair", {}).get("networks_span_ms")
    if span:
        way, model = slower_way(runs)
        seen = runs["pair"]["networks_span_steps"]
        print(f"  pair: the two networks side by side p50 {span['p50']:.3f} ms (p99 {span['p99']:.3f}; "
              f"{seen['read']} steps read, {seen['missed']} missed), {model}'s way around its network alone "
              f"{way:.3f} ms: bound {1.1 * span['p50'] + way:.3f} ms")
    for g in goals(runs):
        print(f"  goal {g['goal']}: {g['value']} ({g['limit']}) {'met' if g['met'] else 'NOT met'}")
    for r in readings(runs):
        print(f"  not judged: {r['reading']}: {r['value']} (the goal's reading before: {r['was_limit']})")


def graphs(predictor) -> str:
    """Whether the network replays a captured CUDA graph (the backends that say so)."""
    session = getattr(predictor, "session", None)
    if hasattr(session, "graphs"):  # ONNX Runtime CUDA: per input shape
        return f"{session.graphs} input shape(s) replay ONNX Runtime's CUDA graph"
    steps = getattr(predictor, "_step_graphs", {})
    whole = f", {sum(1 for g in steps.values() if g)} step graph(s) of the whole step" if steps else ""
    if getattr(session, "cuda_graph", None) is not None:
        return f"CUDA graph: {'yes' if session.cuda_graph else 'no'}{whole}"
    return "CUDA graph: not said" + whole


def _positive(text: str) -> float:
    """An argument that is a number above 0 (argparse says so in one line otherwise)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda:N (default) or cpu (small sizes)")
    parser.add_argument("--backend", default=None, help="auto (default), tensorrt, onnxruntime-cuda, torch, onnxruntime-cpu")
    parser.add_argument("--precision", default=None, help="fp16 (default on a GPU) or fp32 (default on a CPU)")
    parser.add_argument("--size", type=int, default=None, help="network input side (default 384; on a CPU 160)")
    parser.add_argument("--video-hw", default=None, help="HxW of the video (default 1080x1920; on a CPU 360x640)")
    parser.add_argument("--frames", type=int, default=None, help="timed frames per run (default 300; on a CPU 30)")
    parser.add_argument("--yolo", default="yolo12n", help="model name, or an ONNX graph / engine plan")
    parser.add_argument("--depth", default="depth", help="model name, or an ONNX graph / engine plan")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the five, reported each and as medians")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--gpu-letterbox", action="store_true",
                        help="the detector's frames resized on the GPU (not OpenCV's pixels: enginekit.load's option)")
    parser.add_argument("--priority", choices=("none", "yolo", "depth"), default="none",
                        help="run this model on a CUDA stream of the highest priority (torch)")
    parser.add_argument("--only", choices=("all", "yolo"), default="all",
                        help="yolo: the detector alone (its goal only; no depth model loaded)")
    parser.add_argument("--letterbox", choices=("kernel", "ops"), default="kernel",
                        help="ops: the detector's GPU letterbox as torch operations, not the one kernel (before/after)")
    parser.add_argument("--layout", choices=("fast", "plain"), default="fast",
                        help="plain: the torch backend runs the module as given (not its channels-last copy with "
                             "fused blocks), for before/after")
    parser.add_argument("--step-graph", choices=("on", "off"), default="on",
                        help="off: a step of one call runs its stages' own graphs (preprocessing, network, decode), "
                             "not one graph of the whole step (runtime.step_graph), for before/after")
    parser.add_argument("--bind", choices=("on", "off"), default="on",
                        help="off: the next step's frame is not copied into its step graph's input ahead of the step "
                             "(it goes to the device on its own, then into the graph's input at the step), for "
                             "before/after")
    parser.add_argument("--pace", type=_positive, default=None,
                        help="frames per second the video's frames arrive at (a live camera: no frame waits for its "
                             "step); default: as fast as they are decoded")
    parser.add_argument("--first", choices=("yolo", "depth"), default="yolo",
                        help="the pair's model whose step is queued first on the dispatching thread")
    parser.add_argument("--dispatch", choices=("launch", "after", "each"), default="launch",
                        help="how a step is given to its models (Stream.dispatch): launch (default: the graphs that "
                             "hold the step's frames already launched first, then each model's work queued, then "
                             "their threads woken), after (no launch first), each (each model's work queued and its "
                             "thread woken in turn), for before/after")
    parser.add_argument("--switch-interval", type=_positive, default=None,
                        help="the interpreter's thread switch interval, seconds (default: Python's, 0.005)")
    args = parser.parse_args()
    SETTINGS.update(bind=args.bind == "on", pace=args.pace, first=args.first, dispatch=args.dispatch)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if args.letterbox == "ops":
        from enginekit import exact_resize

        exact_resize.kernel_failed(RuntimeError("--letterbox ops"))
    cpu = args.device == "cpu"
    args.backend = args.backend or ("onnxruntime-cpu" if cpu else "auto")
    args.precision = args.precision or ("fp32" if cpu else "fp16")
    size = args.size or (160 if cpu else 384)
    frames = args.frames or (30 if cpu else 300)
    h, w = (int(v) for v in (args.video_hw or ("360x640" if cpu else "1080x1920")).split("x"))

    from enginekit.images import write_video

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        video = write_video(Path(tmp) / "stream.mp4", frames + 1, (h, w))
        print(f"video: {w}x{h}, {frames + 1} frames, written in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        yolo = load(args.yolo, args, size)
        depth = load(args.depth, args, size) if args.only == "all" else None
        models = [p for p in (yolo, depth) if p is not None]
        if args.layout == "plain":
            for p in models:
                if hasattr(p.session, "_fall_back"):
                    p.session._fall_back()
        if args.step_graph == "off":
            for p in models:
                p.session.forward_in_graph = None  # as a session that runs only its own graph
        for p in models:
            print(f"{p.model}: {p.backend} on {p.device}, {p.precision} ({p.reason})", file=sys.stderr)
        if args.priority != "none":
            print(prioritize(yolo if args.priority == "yolo" else depth), file=sys.stderr)
        names = [p.model for p in models]
        repeats = []
        for _ in range(max(1, args.repeat)):
            runs = {"yolo alone": stream([yolo], video, frames, 1, names[:1])} if depth is None else {
                "yolo alone": stream([yolo], video, frames, 1, names[:1]),
                "depth alone": stream([depth], video, frames, 1, names[1:]),
                "pair": stream([yolo, depth], video, frames, 1, names),
                "pair stream": stream([yolo, depth], video, frames, 2, names),
                "pair, before": before([yolo, depth], video, frames),
            }
            repeats.append({"runs": runs, "goals": goals(runs), "readings": readings(runs)})
            show(runs, len(repeats))
            if len(repeats) == 1:
                for p in models:
                    print(f"  {p.model}: {graphs(p)}")
    from enginekit.gpu import gpu_info

    medians = median_goals([r["goals"] for r in repeats])
    report = {"machine": {"gpu": str(gpu_info() or "none"), "cpu_count": os.cpu_count()},
              "settings": {"backend": yolo.backend, "device": yolo.device, "precision": args.precision, "input": size,
                           "priority": args.priority, "gpu_letterbox": args.gpu_letterbox,
                           "letterbox": args.letterbox, "layout": args.layout, "step_graph": args.step_graph,
                           "bind": args.bind, "pace": args.pace, "first": args.first,
                           "switch_interval": sys.getswitchinterval(),
                           "video": f"{w}x{h}", "frames": frames, "repeat": len(repeats)},
              "runs": repeats[-1]["runs"], "goals": medians, "repeats": repeats}
    if len(repeats) > 1:
        print(f"medians over {len(repeats)} repeats:")
    for g in medians:
        print(f"goal {g['goal']}: {g['value']} ({g['limit']}) {'met' if g['met'] else 'NOT met'}"
              + (f"  (each: {', '.join(str(v) for v in g['each'])})" if len(repeats) > 1 else ""))
    if repeats[0]["readings"]:
        import statistics

        for i, r in enumerate(repeats[0]["readings"]):
            values = [rep["readings"][i]["value"] for rep in repeats if len(rep["readings"]) > i]
            print(f"not judged: {r['reading']}: {round(statistics.median(values), 3)} (the goal's reading before: "
                  f"{r['was_limit']})" + (f"  (each: {', '.join(str(v) for v in values)})" if len(values) > 1 else ""))
    if not args.json:
        print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
