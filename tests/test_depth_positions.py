"""Depth-Anything's position embeddings, interpolated to an input size, kept for that size in PyTorch: the same
depth as transformers computes them each time, recomputed when the weights change, never kept in a trace."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _module(seed=0):
    from enginekit.families import resolve

    return resolve("depth").load(None, random_init=True, seed=seed).module


def _interpolations(monkeypatch):
    """Counts bicubic interpolations of many channels (the position embeddings; the input has 3)."""
    calls = []
    real = torch.nn.functional.interpolate

    def counting(x, *args, **kwargs):
        if kwargs.get("mode") == "bicubic" and x.dim() == 4 and x.shape[1] > 3:
            calls.append(tuple(x.shape))
        return real(x, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "interpolate", counting)
    return calls


def test_positions_are_interpolated_once_per_size_and_give_the_same_depth(monkeypatch):
    m, fresh = _module(), _module()
    calls = _interpolations(monkeypatch)
    x = torch.randn(1, 3, 378, 504)  # a 4:3 frame's input, not the embeddings' own 37 x 37 grid
    y = torch.randn(1, 3, 280, 280)
    with torch.inference_mode():
        first = m(x)
        assert len(calls) == 1
        again = m(x)
        assert len(calls) == 1  # kept
        other = m(y)
        assert len(calls) == 2  # another size: interpolated for it
        want_x, want_y = fresh(x), fresh(y)
    assert float(first.abs().mean()) > 1e-3
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    torch.testing.assert_close(first, want_x, rtol=0, atol=0)
    torch.testing.assert_close(other, want_y, rtol=0, atol=0)


def test_new_weights_are_interpolated_again():
    m, fresh = _module(), _module()
    x = torch.randn(1, 3, 378, 504)
    with torch.no_grad():
        before = m(x)
        for module in (m, fresh):  # written in place, as load_state_dict writes them
            module.model.backbone.embeddings.position_embeddings.mul_(3.0)
        after = m(x)
        want = fresh(x)  # never ran before: interpolates the new weights
    assert float(want.abs().mean()) > 1e-3
    assert float((after - before).abs().max()) > 1e-3  # the embeddings count in the depth
    torch.testing.assert_close(after, want, rtol=0, atol=0)


def test_a_trace_keeps_the_interpolation(monkeypatch):
    """An export traces the module: the position embeddings' interpolation stays in its graph (H/W dynamic),
    even after a forward at the traced size kept them."""
    m = _module()
    x = torch.randn(1, 3, 392, 392)
    with torch.no_grad():
        m(x)
        traced = torch.jit.trace(m, (x,), check_trace=False)
    torch._C._jit_pass_inline(traced.graph)
    bicubic = str(traced.graph).count("aten::upsample_bicubic2d")
    assert bicubic == 2, bicubic  # the input's resize to a multiple of 14, and the position embeddings'
