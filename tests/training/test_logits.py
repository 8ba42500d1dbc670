"""head_logprobs: the chunked output head gives the one-shot values and gradients, and keeps at most
one chunk's logits alive."""

import torch
from torch import nn

from opencomposer.training.logits import head_logprobs


def setup(U=37, D=16, V=1000, M=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    head = nn.Linear(D, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, D, generator=g))
    hidden = torch.randn(U, D, generator=g, requires_grad=True)
    inv = torch.randint(0, U, (M,), generator=g)  # several targets per position, in no order
    target = torch.randint(0, V, (M,), generator=g)
    return head, hidden, inv, target


def test_chunked_equals_one_shot_in_values_entropy_and_gradients():
    head, hidden, inv, target = setup()
    full, ent_full = head_logprobs(head, hidden, inv, target, 0.7, entropy=True)
    g_full, gw_full = torch.autograd.grad(full.sum(), (hidden, head.weight))
    for chunk in (1000, 5000, 12345):  # 1 row, 5 rows, 12 rows per chunk (U = 37: a ragged last chunk)
        part, ent = head_logprobs(head, hidden, inv, target, 0.7, entropy=True, chunk_elements=chunk)
        torch.testing.assert_close(part, full, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent, ent_full, atol=1e-5, rtol=0)
        g_part, gw = torch.autograd.grad(part.sum(), (hidden, head.weight))
        torch.testing.assert_close(g_part, g_full, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gw, gw_full, atol=1e-5, rtol=1e-5)
    # the one-shot values are log-probabilities: each position's distribution sums to one
    lp_all, _ = head_logprobs(head, hidden, torch.arange(37).repeat_interleave(1000),
                              torch.arange(1000).repeat(37), 0.7, chunk_elements=5000)
    torch.testing.assert_close(lp_all.view(37, 1000).exp().sum(-1), torch.ones(37), atol=1e-5, rtol=0)


def test_chunked_backward_never_holds_all_logits():
    head, hidden, inv, target = setup(U=200, V=5000, M=200)
    seen = []

    def pack(t):
        seen.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = head_logprobs(head, hidden, inv, target, chunk_elements=50_000)  # 10 rows per chunk
    lp.sum().backward()
    assert max(seen) < 200 * 5000 / 4  # nothing of the size of the full [U, V] logits is saved
    assert hidden.grad is not None and head.weight.grad is not None


def reference(logits, inv, target):
    """What head_logprobs computed before target_logprobs: torch's logsumexp, indexing and softmax."""
    lse = torch.logsumexp(logits, -1)
    with torch.no_grad():
        ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)
    return logits[inv, target] - lse[inv], ent


def test_target_logprobs_are_torchs_bit_for_bit_even_where_exp_underflows():
    from opencomposer.training.logits import EXP_FLOOR, target_logprobs

    g = torch.Generator().manual_seed(1)
    U, V, M = 64, 4096, 300
    inv = torch.cat([torch.randint(0, U, (M - 40,), generator=g), torch.full((40,), 3)])  # one shared position
    target = torch.cat([torch.randint(0, V, (M - 40,), generator=g), torch.randint(0, 4, (40,), generator=g)])
    weights = torch.randn(M, generator=g)
    for scale in (1.0, 30.0):  # 30: most of each row lies more than 87 below its top (exp underflows)
        logits = torch.randn(U, V, generator=g) * scale
        if scale > 1:
            assert ((logits - logits.amax(-1, keepdim=True)) < EXP_FLOOR).float().mean() > 0.5
        a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        want, ent_want = reference(a, inv, target)
        got, ent = target_logprobs(b, inv, target, entropy=True)
        assert torch.equal(got, want)  # the values: bit for bit
        torch.testing.assert_close(ent, ent_want, atol=1e-4, rtol=1e-6)
        (want * weights).sum().backward()
        (got * weights).sum().backward()
        # the gradient: torch's bit for bit, but where the probability is below exp(EXP_FLOOR),
        # which moves by less than 1.7e-38 times the row's weight
        clamped = (logits - torch.logsumexp(logits, -1, keepdim=True)) < EXP_FLOOR
        assert torch.equal(b.grad[~clamped], a.grad[~clamped])
        assert (b.grad - a.grad).abs().max() <= 1.7e-38 * weights.abs().sum()
        assert got.requires_grad and not ent.requires_grad
