"""Segment attention (training/attention.py): the flash kernel's two blocks merged by their
log-sum-exps give masked attention over each segment's keys, values and gradients alike."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opencomposer.training.attention import Segment, SegmentAttention, masked_segment_attention

H, G, C = 4, 2, 16


def row(segments: list[Segment], dtype=torch.float32, seed: int = 0):
    torch.manual_seed(seed)
    N = segments[-1].end
    q = torch.randn(1, N, H, C, dtype=dtype).transpose(1, 2).requires_grad_()  # the model's layout
    k = torch.randn(1, N, G, C, dtype=dtype).transpose(1, 2).requires_grad_()
    v = torch.randn(1, N, G, C, dtype=dtype).transpose(1, 2).requires_grad_()
    return q, k, v


def reference(q, k, v, segments: list[Segment]) -> torch.Tensor:
    """Masked attention over the whole row: query i of a segment sees its prefix and its own keys <= i."""
    N = q.shape[2]
    mask = torch.zeros(N, N, dtype=torch.bool)
    for s in segments:
        own = torch.ones(s.length, s.length, dtype=torch.bool).tril()
        mask[s.start:s.end, s.start:s.end] = own
        mask[s.start:s.end, s.prefix_start:s.prefix_start + s.prefix_length] = True
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


# a prefix with three suffixes of other lengths (one a single token), then a sample on its own
SEGMENTS = [Segment(0, 37), Segment(37, 23, 0, 37), Segment(60, 1, 0, 37), Segment(61, 50, 0, 37), Segment(111, 19)]


@pytest.mark.parametrize("impl", ["cpu", "masked"])
def test_values_and_gradients_equal_masked_attention(impl):
    q, k, v = row(SEGMENTS)
    attend = SegmentAttention(SEGMENTS) if impl == "cpu" else (lambda *a: masked_segment_attention(*a, SEGMENTS))
    out = attend(q, k, v)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref = reference(q, k, v, SEGMENTS)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
    assert grads[1][:, :, :37].abs().sum() > 0  # the prefix's keys get the suffixes' gradients too


def test_a_segment_never_sees_another_samples_tokens():
    q, k, v = row(SEGMENTS)
    base = SegmentAttention(SEGMENTS)(q, k, v).detach()
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, 61:111] += 5.0   # the third suffix's keys and values
    v2[:, :, 61:111] -= 3.0
    moved = SegmentAttention(SEGMENTS)(q.detach(), k2, v2)
    changed = (moved - base).abs().amax(dim=(0, 1, 3)) > 0
    assert changed[61:111].all() and not changed[:61].any() and not changed[111:].any()


def test_bfloat16_runs_close_to_float32():
    q, k, v = row(SEGMENTS)
    out = SegmentAttention(SEGMENTS)(q, k, v)
    out16 = SegmentAttention(SEGMENTS)(*(t.detach().bfloat16().requires_grad_() for t in (q, k, v)))
    torch.testing.assert_close(out16.float(), out, rtol=0.05, atol=0.05)


def test_on_the_cpu_a_bfloat16_call_runs_the_kernel_in_float32():
    """The CPU kernel's bfloat16 backward is ~4x slower than float32's, so bfloat16 inputs are cast
    up: output and gradients are float32's on the same (bfloat16) values, rounded once at the end."""
    q16, k16, v16 = (t.detach().bfloat16().requires_grad_() for t in row(SEGMENTS))
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q16, k16, v16))
    out16, out32 = SegmentAttention(SEGMENTS)(q16, k16, v16), SegmentAttention(SEGMENTS)(q32, k32, v32)
    assert out16.dtype == torch.bfloat16
    assert torch.equal(out16, out32.bfloat16())
    g = torch.randn_like(out32).bfloat16()
    grads16 = torch.autograd.grad(out16, (q16, k16, v16), g)
    grads32 = torch.autograd.grad(out32, (q32, k32, v32), g.float())
    for a, b in zip(grads16, grads32):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.bfloat16())


def test_under_autocast_mixed_dtypes_run_in_the_autocast_dtype():
    """Under autocast the model hands over q and k in float32 (RoPE's tables promote them) and v in
    bfloat16 (a projection's output): the kernel gets one dtype, and the gradients reach each input
    in its own dtype, close to float32's."""
    q, k, v = row(SEGMENTS)
    v16 = v.detach().bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = SegmentAttention(SEGMENTS)(q, k, v16)
    assert out.dtype == torch.bfloat16
    g = torch.randn_like(out, dtype=torch.float32)
    gq, gk, gv = torch.autograd.grad(out, (q, k, v16), g.bfloat16())
    assert (gq.dtype, gk.dtype, gv.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    ref = reference(q, k, v, SEGMENTS)
    ref_gq, ref_gk, ref_gv = torch.autograd.grad(ref, (q, k, v), g)
    torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.05)
    for a, b in ((gq, ref_gq), (gk, ref_gk), (gv.float(), ref_gv)):
        torch.testing.assert_close(a, b, rtol=0.1, atol=0.1)
