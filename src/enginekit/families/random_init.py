"""``--random-init`` for every family: seeded weights whose outputs depend on the image.

As PyTorch and Ultralytics build them, fresh networks compute nearly the same thing for every image (fresh
BatchNorm layers, running mean 0 and variance 1, shrink or grow activations layer after layer), so parity
and task checks on them cannot fail. Each family's random init here makes the seeded model carry the image
through to its outputs, with one shared step (``batchnorm_statistics``: every BatchNorm normalises its input
by the input's statistics on the embedded photographs, layer after layer, in one forward) and what is its own:

- YOLO (Ultralytics' families): ``make_informative``, below;
- RT-DETR: ``separate_rtdetr``;
- any PyTorch module (torchvision, timm, a user's): ``informative_torch_model``.

Each family's weights identity carries a tag with a version (``random:yolo12n+informative3@0``): change it with
anything its section computes.

YOLO
----
As Ultralytics builds it, an untrained YOLO computes nearly the same thing for every image: its fresh
BatchNorm layers (running mean 0, variance 1) pass activations that shrink layer after layer, so its
Detect head sees almost nothing of the input. Measured (yolo12n at 640 px, bus.jpg against zidane.jpg):
every class score is 1e-5..1.6e-4, the two photographs' scores are bit for bit the same, and their
boxes (the anchor grid, each 2 strides wide) differ by rel L2 7e-9. Parity on such a model cannot fail:
a graph with 10% of its largest weight tensor multiplied by -3 gave the untouched graph's figures
(boxes rel L2 2.4e-8, scores 5.3e-4), and so did an INT8 graph. Task metrics compare two empty sets.

:func:`make_informative` makes the seeded model a smooth detector (classifier, segmenter...) that
carries the image through to its outputs, as ``rtdetr._separate_rtdetr`` does for RT-DETR:

1. every BatchNorm layer normalises its input by its statistics on two photographs (Ultralytics'
   bus.jpg and zidane.jpg, which ship with the Ultralytics version in the export key) and shifts it
   to mean ``BN_SHIFT`` (standard deviation 1): SiLU then works near its linear part, so the network
   carries the image without amplifying noise (a chaotic network no FP16 graph could agree with);
2. the head's output projections (the last plain convolution of each branch: box distributions,
   class scores, mask coefficients, keypoints, angles, depth; a classifier's or semantic head's
   logits) get weights orthogonal to the mean of their input features (the part every position
   shares, which would otherwise make one output lead everywhere and leave FP16 logits as
   differences of large terms), scaled so each output channel spreads by a set standard deviation
   over positions and images;
3. class-score biases (sigmoid scores of detect, segment, pose and obb heads) are set so that the
   ``DETECTIONS``-th best score of each photograph averages conf 0.25: scores vary with the image,
   and some exceed the operating point on photographs.

What it gives, on yolo12n (seed 0) on a 2-core x86-64 CPU machine: at 640 px, bus.jpg against zidane.jpg,
boxes differ by rel L2 0.073 and scores by 1.9, max score 0.70, 90 anchors above 0.25 (as Ultralytics builds
it: 7e-9 and bit-identical scores). Exported, on the 5 embedded photographs (each letterboxed to its own
rectangle): the FP32 graph agrees to rel L2 4.5e-7 (boxes) and 1.2e-5 (scores), 162 reference detections at
conf 0.25; the FP16 graph to 3.7e-4 and 4.5e-3 (scores max abs 3.6e-3, limit 0.01). The same graph with 10%
of its largest weight tensor multiplied by -3 fails verify on parity (boxes rel L2 0.056, scores 0.78) and on
the task (recall 0.49).

Known limit: the class scores are a continuous tail at the operating point (the bias puts the 40th best score
of a photograph at 0.25), so any change of the logits moves some detections across conf 0.25. INT8 (the
family's exclusions, yolo12n at 320, two photographs) keeps boxes and scores within INT8's parity limits but
gives recall 0.83 and precision 0.79: a random YOLO's INT8 build fails its task gate, honestly. INT8 task
gates are shown passing on the suite's trained detector.
"""

from __future__ import annotations

import math
import re

import numpy as np

from enginekit.images import load_images, read_rgb

def batchnorm_statistics(bns, *, bias=None) -> list:
    """Forward pre-hooks (returned: remove them after the forward) that set each BatchNorm's running statistics to
    its input's (over every axis but the channels'), layer after layer as one forward runs; with ``bias``
    (BatchNorm -> value) also its weight to 1 and its bias to that value."""
    def normalise(bn, inputs):  # before each BatchNorm runs: its statistics are its input's
        t = inputs[0]
        dims = [d for d in range(t.dim()) if d != 1]
        bn.running_mean.copy_(t.mean(dims))
        bn.running_var.copy_(t.var(dims, unbiased=False))
        if bias is not None:
            bn.weight.fill_(1.0)
            bn.bias.fill_(bias(bn))

    return [bn.register_forward_pre_hook(normalise) for bn in bns]


# -- YOLO ----------------------------------------------------------------------------------------------------
#: the tag in the weights identity (``random:yolo12n+informative3@0``): change it with anything below
#: 3: the statistics pass runs in float64 on one thread. In float32 the weights depended on the thread
#: count (a channel left with almost no spread after centring is scaled up by its BatchNorm, rounding noise
#: and all): 1 and 2 threads gave biases apart by rel L2 1.6, so an export made in one process failed parity
#: against the reference made in another (boxes rel L2 0.007-0.018)
INFORMATIVE_VERSION = 3
INFORMATIVE_TAG = f"informative{INFORMATIVE_VERSION}"
#: 2, not 4: at a shift of 4 every activation carries a constant part four times its spread, and FP16's
#: rounding of it (relative to what varies) made an FP16 graph's scores differ by max abs 0.022 on photographs
#: (limit 0.01); at 2 they differ by 3.6e-3 (rel L2 4.5e-3) and FP32 still agrees to rel L2 5e-7 (boxes)
BN_SHIFT = 2.0
#: spread (standard deviation over positions) of each output channel's logits, by what it feeds
CLASS_SPREAD = 2.0  # sigmoid class scores of instance heads
SOFTMAX_SPREAD = 2.0  # a classifier's or semantic head's class logits
VALUE_SPREAD = 1.0  # box distributions, mask coefficients, keypoints, angles
BOX_SPREAD_DIRECT = 0.5  # box distances predicted directly (reg_max 1: yolo26), in strides
DEPTH_SPREAD = 0.5  # log-depth
#: class scores of each photograph at conf 0.25 or more (before NMS)
DETECTIONS = 40
CENTRE = True
PHOTOGRAPHS = ("bus.jpg", "zidane.jpg")

_CLASS_BRANCH = re.compile(r"^(one2one_)?cv3\.\d+\.\d+$")
_BOX_BRANCH = re.compile(r"^(one2one_)?cv2\.\d+\.\d+$")


def output_projections(head) -> list[tuple[str, object]]:
    """The head's output projections: its plain ``nn.Conv2d``/``nn.Linear`` layers (not a convolution of an
    Ultralytics ``Conv`` block, which its BatchNorm normalises; not DFL's fixed integral)."""
    import torch
    from ultralytics.nn.modules import Conv

    inner = {id(m.conv) for m in head.modules() if isinstance(m, Conv)}
    return [(name, m) for name, m in head.named_modules()
            if type(m) in (torch.nn.Conv2d, torch.nn.Linear) and id(m) not in inner and not name.startswith("dfl")]


def make_informative(model, seed: int, preprocess, size: tuple[int, int]):
    """The seeded Ultralytics model ``model`` made to depend on its input (see the module's notes).
    ``preprocess(image_rgb, hw)``: the family's, at ``size``. Deterministic for a seed: computed in float64 on
    one thread (the same weights whatever the process's thread count), returned in float32."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _make_informative(model.double(), seed, preprocess, size).float()
    finally:
        torch.set_num_threads(threads)


def _make_informative(model, seed: int, preprocess, size: tuple[int, int]):
    import torch
    from ultralytics.utils import ASSETS

    head = model.model[-1]
    photos = [read_rgb(ASSETS / name) for name in PHOTOGRAPHS]
    x = torch.from_numpy(np.concatenate([preprocess(p, size) for p in photos if p is not None])).double()
    gen = torch.Generator().manual_seed(seed)
    model.eval()

    activated = _activated_batchnorms(model)

    def centre(conv, inputs):  # before each convolution that a BatchNorm follows: no constant part in its output
        _centre(conv, inputs[0])

    seen: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(_module, inputs, _output):
            seen[name] = inputs[0].detach()
        return hook

    projections = output_projections(head)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    hooks = batchnorm_statistics(bns, bias=lambda bn: BN_SHIFT if id(bn) in activated else 0.0)
    if CENTRE:
        hooks += [conv.register_forward_pre_hook(centre) for conv in _normalised_convs(model)]
    hooks += [m.register_forward_hook(keep(name)) for name, m in projections]
    reg_max = int(getattr(head, "reg_max", 16) or 16)
    class_logits: list[torch.Tensor] = []  # per class projection: (images, positions x classes)
    class_layers = []
    try:
        with torch.no_grad():
            model(x)  # BatchNorm statistics, layer after layer; the projections' input features
            for name, layer in projections:
                if name not in seen:  # a training-only branch (auxiliary heads, Pose26's flow model)
                    continue
                if _CLASS_BRANCH.match(name):
                    target = CLASS_SPREAD
                elif _BOX_BRANCH.match(name):
                    target = BOX_SPREAD_DIRECT if reg_max == 1 else VALUE_SPREAD
                elif type(head).__name__ == "Depth":
                    target = DEPTH_SPREAD
                elif type(head).__name__ in ("Classify", "SemanticSegment"):
                    target = SOFTMAX_SPREAD
                else:
                    target = VALUE_SPREAD
                logits = _spread(layer, seen[name], target, gen)
                if _CLASS_BRANCH.match(name):
                    class_logits.append(logits.flatten(1))
                    class_layers.append(layer)
            if class_layers:  # one bias for every level: the DETECTIONS-th best score of a photograph at 0.25
                every = torch.cat(class_logits, 1)
                kth = float(torch.topk(every, min(DETECTIONS, every.shape[1]), dim=1).values[:, -1].mean())
                for layer in class_layers:
                    layer.bias.fill_(math.log(0.25 / 0.75) - kth)
    finally:
        for h in hooks:
            h.remove()
    return model


def _spread(layer, features, target: float, gen):
    """Weights orthogonal to the features' mean (outputs carry what varies, with no large terms to
    cancel), scaled so each output channel spreads by ``target``; returns the centred outputs
    (images, channels, positions...). The bias is kept."""
    import torch

    w = layer.weight
    if isinstance(layer, torch.nn.Linear):
        flat = features.reshape(-1, features.shape[-1])  # (samples, in)
        w2 = w
    else:  # a 1x1 convolution
        flat = features.permute(0, 2, 3, 1).reshape(-1, features.shape[1])
        w2 = w.view(w.shape[0], -1)
    # seeded weights as PyTorch initialises the layer (uniform within 1/sqrt(fan in))
    bound = 1 / math.sqrt(w2.shape[1])
    w2.copy_((torch.rand(w2.shape, generator=gen) * 2 - 1) * bound)
    mean = flat.mean(0)
    unit = mean / mean.norm().clamp(min=1e-12)
    w2.sub_(w2 @ unit[:, None] * unit[None])
    out = flat @ w2.T  # (samples, channels)
    std = out.std(0).clamp(min=1e-12)
    w2.mul_((target / std)[:, None])
    out = out * (target / std)
    if isinstance(layer, torch.nn.Linear):
        return out.view(features.shape[0], -1)
    return out.view(features.shape[0], -1, out.shape[-1]).permute(0, 2, 1)  # (images, channels, positions)


def _activated_batchnorms(model) -> set[int]:
    """The BatchNorm layers an activation follows (an Ultralytics ``Conv`` with ``act``): shifted to
    work near the activation's linear part. The others (attention's q/k/v, RepConv's branches) stay centred."""
    import torch

    found = set()
    for m in model.modules():
        bn, act = getattr(m, "bn", None), getattr(m, "act", None)
        if isinstance(bn, torch.nn.modules.batchnorm._BatchNorm) and act is not None \
                and not isinstance(act, torch.nn.Identity):
            found.add(id(bn))
    return found


def _normalised_convs(model) -> list:
    """The convolutions a BatchNorm follows (``Conv.conv`` beside ``Conv.bn``)."""
    import torch

    return [m.conv for m in model.modules()
            if isinstance(getattr(m, "conv", None), torch.nn.Conv2d)
            and isinstance(getattr(m, "bn", None), torch.nn.modules.batchnorm._BatchNorm)]


def _centre(conv, x) -> None:
    """Make each filter of ``conv`` orthogonal to its input's mean patch (the channel means at every tap):
    its output then has no constant part, which FP16 would carry as large terms whose rounding the
    BatchNorm after it magnifies."""
    import torch

    w = conv.weight
    groups = conv.groups
    per = w.shape[1]
    mean = x.mean((0, 2, 3))  # (C,)
    out_per = w.shape[0] // groups
    for g in range(groups):
        v = mean[g * per:(g + 1) * per][:, None, None].expand(per, *w.shape[2:]).reshape(-1)
        norm = v.norm()
        if float(norm) < 1e-12:
            continue
        unit = v / norm
        block = w[g * out_per:(g + 1) * out_per].view(out_per, -1)
        block.sub_((block @ unit)[:, None] * unit[None])


# -- RT-DETR -------------------------------------------------------------------------------------------------
# --random-init for RT-DETR. As Ultralytics builds it, an untrained RT-DETR computes nearly the same
# thing everywhere: its fresh BatchNorm layers (running mean 0, variance 1) shrink the backbone's
# features to ~1e-4 of their spread, so the encoder's scores tie to ~1e-6 and the decoder's to
# ~1e-7 (every output score 0.0427..0.0429 on photographs, none above conf 0.25). Its 300 queries and
# their order are then chosen by rounding, differently in PyTorch, ONNX Runtime and an engine, and
# the task metrics compare nothing. Normalising every layer by the photographs' statistics alone
# does not help: the random network is then chaotic (1e-5 of input noise moves the backbone's
# output by 6e-3 and the decoder's scores by 0.2), and no FP16 or INT8 graph can agree with it.
# separate_rtdetr makes the seeded model a deterministic, smooth detector:
#  1. every BatchNorm layer normalises its input by its statistics on two photographs (Ultralytics'
#     bus.jpg and zidane.jpg, which ship with the Ultralytics version in the export key) and then
#     shifts it to mean _BN_SHIFT (standard deviation 1): the activations after it (ReLU, SiLU)
#     work near their linear part, so the network carries the image without amplifying noise
#     (measured: 1e-3 of input noise, recall 1.0, score shift < 1e-3);
#  2. the box heads' last layers (zero in Ultralytics' init: every box its anchor) seeded as
#     nn.Linear initialises them, scaled by _BOX_SCALE, so boxes depend on the image and a graph
#     that breaks them is seen;
#  3. the encoder's score head and the one the decoder's evaluated layer uses: their weights made
#     orthogonal to the mean of their input features (the part every position shares, which
#     would otherwise make one class lead everywhere and leave FP16 logits as differences of
#     large terms) and scaled so each class's logits spread by _ENC_SPREAD / _DEC_SPREAD (standard
#     deviation over positions / queries); the decoder's bias set so the _DETECTIONS-th best score
#     of each photograph averages conf 0.25.
RTDETR_INIT_VERSION = 1  # the tag in the weights identity: change it with anything below
_RTDETR_INIT_SIZE = (320, 320)
_BN_SHIFT = 4.0
_ENC_SPREAD = 2.5
_DEC_SPREAD = 4.0
_DETECTIONS = 20
_BOX_SCALE = 0.5


def separate_rtdetr(model, seed: int, preprocess):
    import math

    import torch
    from ultralytics.nn.modules.head import RTDETRDecoder
    from ultralytics.utils import ASSETS

    head = model.model[-1]
    if not isinstance(head, RTDETRDecoder):
        return model
    photos = [read_rgb(ASSETS / name) for name in ("bus.jpg", "zidane.jpg")]
    x = torch.from_numpy(np.concatenate([preprocess(p, _RTDETR_INIT_SIZE) for p in photos if p is not None]))
    g = torch.Generator().manual_seed(seed)
    model.eval()
    with torch.no_grad():
        for mlp in (head.enc_bbox_head, *head.dec_bbox_head):
            last = mlp.layers[-1]
            bound = 1 / math.sqrt(last.in_features)
            last.weight.copy_((torch.rand(last.weight.shape, generator=g) * 2 - 1) * bound * _BOX_SCALE)
            last.bias.zero_()

    seen = {}

    def keep(name):
        def hook(_module, inputs, _output):
            seen[name] = inputs[0].detach()
        return hook

    def spread(linear, features, target: float) -> torch.Tensor:
        """Weights orthogonal to the features' mean (logits carry what varies, with no large terms
        to cancel), scaled so each class's logits spread by ``target``; the centred logits."""
        mean = features.mean(0)
        unit = mean / mean.norm().clamp(min=1e-12)
        linear.weight.sub_(linear.weight @ unit[:, None] * unit[None])
        logits = features @ linear.weight.T
        scale = target / float(logits.std(0).mean().clamp(min=1e-12))
        linear.weight.mul_(scale)
        linear.bias.zero_()
        return logits * scale

    eval_head = head.dec_score_head[head.decoder.eval_idx]
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    hooks = batchnorm_statistics(bns, bias=lambda bn: _BN_SHIFT)
    hooks += [head.enc_score_head.register_forward_hook(keep("enc")), eval_head.register_forward_hook(keep("dec"))]
    try:
        with torch.no_grad():
            model(x)  # 1: BatchNorm statistics, layer after layer; the encoder's features
            for h in hooks[:len(bns)]:
                h.remove()
            spread(head.enc_score_head, seen["enc"][:, head.valid_mask[0, :, 0].bool()].flatten(0, 1), _ENC_SPREAD)
            model(x)  # 2: the decoder's features at the queries the spread encoder picks
            dec = seen["dec"]
            logits = spread(eval_head, dec.flatten(0, 1), _DEC_SPREAD).view(len(dec), -1)
            kth_best = float(torch.topk(logits, _DETECTIONS, dim=1).values[:, -1].mean())
            eval_head.bias.fill_(math.log(0.25 / 0.75) - kth_best)
    finally:
        for h in hooks:
            h.remove()
    return model


# -- any PyTorch module (torchvision, timm, a user's) --------------------------------------------------------
#: ``--random-init``: BatchNorm statistics from these photographs (see ``informative_torch_model``)
INIT_PHOTOS = 4
INIT_SIDE = 256
RANDOM_INIT_VERSION = 3
#: ``--random-init``: the scale of the last BatchNorm of each residual branch (``damp_residual_branches``)
RESIDUAL_GAIN = 0.2
#: ``--random-init`` of a classifier: the std of its logits over the classes on the photographs
LOGIT_SPREAD = 2.0


def informative_torch_model(model, adapter, seed: int) -> None:
    """Seeded random weights made informative: every BatchNorm layer normalises by its input's statistics
    on the embedded photographs (layer after layer, one forward; Ultralytics' bus.jpg and zidane.jpg
    first). As torchvision and timm build them, fresh BatchNorm layers (mean 0, variance 1) pass activations
    that grow or shrink layer after layer, and the class map comes out one class whatever the image: no
    check on it can fail. Normalised, the network carries the image (and a classifier's logits are spread:
    ``_spread_logits``): class maps and top-1 classes change
    with the photograph (``reference_varies`` in the task metrics shows it)."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    damp_residual_branches(model)
    photos = load_images(None, limit=INIT_PHOTOS).images
    dynamic = adapter.dynamic_axes[adapter.input_name].values()
    h, w = adapter.default_input[2:]
    if "height" in dynamic and "width" in dynamic:
        h, w = min(h, INIT_SIDE), min(w, INIT_SIDE)
    x = torch.from_numpy(np.concatenate([adapter.preprocess(p, (h, w)) for p in photos]))

    hooks = batchnorm_statistics(bns)
    try:
        with torch.no_grad():
            out = model.eval()(x)
    finally:
        for hook in hooks:
            hook.remove()
    if (adapter.spec.task or "raw") == "classify":
        _spread_logits(model, out)


def residual_branch_ends(model) -> list:
    """The last BatchNorm of each residual branch of torchvision's and timm's ResNet blocks (the layer
    torchvision's ``zero_init_residual`` and timm's ``zero_init_last`` set to zero)."""
    ends = []
    for block in model.modules():
        names = [n for n in ("bn3", "bn2") if hasattr(block, n)]
        if type(block).__name__ in ("Bottleneck", "BasicBlock") and names:
            ends.append(getattr(block, names[0]))
    return [m for m in ends if getattr(m, "weight", None) is not None]


def damp_residual_branches(model) -> None:
    """Scale the last BatchNorm of each residual branch by ``RESIDUAL_GAIN``. With unit-gain branches a fresh
    deep ResNet is chaotic: through 16 blocks each adding a unit-variance branch, a rounding of 1e-3 grows to
    a different class map (deeplabv3_resnet50 at 256 px with its weights and activations rounded to FP16 in
    PyTorch: rel L2 0.079, mIoU 0.78), which no trained network does, so every FP16 and INT8 verdict on it
    failed for a reason that was not the conversion's. Damped before the BatchNorm statistics are set (0.2:
    rel L2 0.0056, pixel agreement 0.994, 17-21 classes per photograph, same emulation on 4 photographs),
    the branches still carry the image and every weight still counts (zero, as the libraries' options do,
    would leave the branches' weights out of every check)."""
    import torch

    with torch.no_grad():
        for bn in residual_branch_ends(model):
            if bool((bn.weight == 0).all()):  # a library's zero init (timm's zero_init_last): the branch counts too
                bn.weight.fill_(1.0)
            bn.weight.mul_(RESIDUAL_GAIN)


def _spread_logits(model, out) -> None:
    """A classifier's last linear layer scaled so its logits spread by ``LOGIT_SPREAD`` (std over classes) on
    the photographs: a fresh head's logits lie within a few hundredths of each other, and over 1000 classes
    the softmax's top-1 leads its second by less than ``compare.task_metrics.MIN_TOP1_MARGIN``, so there
    would be nothing to compare."""
    import torch

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    first = out if isinstance(out, torch.Tensor) else (
        next(iter(out.values())) if isinstance(out, dict) else next(iter(out), None))
    if not linears or not isinstance(first, torch.Tensor) or first.dim() != 2 or first.shape[1] < 2:
        return
    spread = float(first.std(1).mean())
    if not spread > 0:
        return
    head = linears[-1]
    with torch.no_grad():
        head.weight.mul_(LOGIT_SPREAD / spread)
        if head.bias is not None:
            head.bias.mul_(LOGIT_SPREAD / spread)
