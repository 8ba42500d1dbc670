"""MTP speculative decoding: the acceptance rule, greedy output identical to plain greedy, and
sampled output distributed as the target model's (a chi-square test against the exact
distribution of the next three tokens, enumerated)."""

import copy
import math

import numpy as np
import pytest
import torch

from engine_util import draftable_model, prompts, tiny_model
from opencomposer.engine import Engine, GenerationRequest, SamplingParams
from opencomposer.engine.sampling import sampling_probs
from opencomposer.engine.speculative import accept, accept_greedy


# ---- the rule ---------------------------------------------------------------------------

def test_accept_rule_on_hand_cases():
    # k = 2, V = 3. Row 0: p/q = 0.5 for the first draft, u = 0.4 accepts it; the second draft
    # has p = 0, so it is rejected and the token comes from norm(max(0, p1 - q2)).
    # Row 1: u = 0.6 rejects the first draft: norm(max(0, p0 - q1)) = [0, 1, 0].
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.4, 0.6], [1.0, 0.0, 0.0]]] * 2)
    q = torch.tensor([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]] * 2)
    drafts = torch.tensor([[0, 0], [0, 0]])
    n, final = accept(p, q, drafts, torch.tensor([[0.4, 0.0], [0.6, 0.0]]), torch.tensor([0.5, 0.0]))
    assert n.tolist() == [1, 0]
    assert final.tolist() == [2, 1]  # row 0: [0, .4, .6] at u = .5 -> 2
    # All accepted (p >= q on the drafts): the bonus token comes from p_k.
    n, final = accept(p, torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.4, 0.6]]]), torch.tensor([[1, 2]]),
                      torch.tensor([[0.99, 0.99]]), torch.tensor([0.3]))
    assert n.tolist() == [2] and final.tolist() == [0]


def test_greedy_accept_is_the_one_hot_special_case():
    logits = torch.randn(4, 3, 7)
    drafts = torch.stack([logits[:, 0].argmax(-1), torch.randint(0, 7, (4,))], 1)
    drafts[1, 0] = (logits[1, 0].argmax() + 1) % 7
    n, final = accept_greedy(logits.argmax(-1), drafts)
    one_hot = torch.nn.functional.one_hot(logits.argmax(-1), 7).float()
    q = torch.nn.functional.one_hot(drafts, 7).float()
    n2, final2 = accept(one_hot, q, drafts, torch.full((4, 2), 0.5), torch.full((4,), 0.5))
    assert n.tolist() == n2.tolist() and final.tolist() == final2.tolist() and n[1] == 0


# ---- greedy: identical to plain ---------------------------------------------------------

@pytest.mark.parametrize("make", [tiny_model, draftable_model], ids=["random", "draftable"])
@pytest.mark.parametrize("depth", [1, 2])
def test_greedy_speculative_equals_plain_greedy(make, depth):
    model = make()
    plain = Engine(model, max_slots=8, max_len=40)
    spec = Engine(model, max_slots=8, max_len=40, speculative_depth=depth)
    ps = prompts(8, seed=11, min_len=1)
    reqs = [GenerationRequest(p, SamplingParams(temperature=0, max_new_tokens=n), return_routed_experts=True,
                              return_prompt_routed_experts=True)
            for p, n in zip(ps, [30, 1, 7, 100, 25, 2, 13, 39])]  # 100, 39: stop at the context
    want = plain.generate_batch(reqs)
    accepted = 0
    for lo, hi in ((0, 1), (1, 4), (0, 8)):  # batch sizes 1, 3, 8
        got = spec.generate_batch(reqs[lo:hi])
        for w, g in zip(want[lo:hi], got):
            assert g.output_ids == w.output_ids and g.finish_reason == w.finish_reason
            np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
            assert (g.routed_experts == w.routed_experts).all()
            assert (g.prompt_routed_experts == w.prompt_routed_experts).all()
            accepted += g.spec_accepted
    if make is draftable_model:
        assert accepted > 50  # the runs did accept drafts, several per step at depth 2
    plain.stop()
    spec.stop()


def test_greedy_speculative_with_stop_tokens_inside_an_accepted_chunk():
    model = draftable_model()
    p = [5, 9, 2]
    ref = Engine(model, max_slots=1, max_len=64).generate_batch(
        [GenerationRequest(p, SamplingParams(temperature=0, max_new_tokens=30))])[0].output_ids
    spec = Engine(model, max_slots=4, max_len=64, speculative_depth=2)
    for stop in set(ref[1:12]):
        r = spec.generate_batch([GenerationRequest(p, SamplingParams(temperature=0, max_new_tokens=30,
                                                                     stop_token_ids=(stop,)))])[0]
        assert r.output_ids == ref[:ref.index(stop) + 1] and r.finish_reason == "stop"
    spec.stop()


def test_seeded_speculative_sampling_is_the_same_alone_or_batched():
    spec = Engine(draftable_model(), max_slots=8, max_len=64, speculative_depth=2)
    reqs = [GenerationRequest(p, SamplingParams(temperature=0.9, top_k=30, max_new_tokens=25, seed=i))
            for i, p in enumerate(prompts(6, seed=15))]
    alone = [spec.generate_batch([r])[0] for r in reqs]
    together = spec.generate_batch(reqs + [GenerationRequest([3, 4], SamplingParams(max_new_tokens=9))])
    for a, b in zip(alone, together):
        assert a.output_ids == b.output_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert sum(r.spec_accepted for r in alone) > 10
    spec.stop()


def test_speculative_logprobs_replay_to_target_logprobs():
    """Accepted tokens carry the target model's logprobs and routing at their positions."""
    model = draftable_model()
    spec = Engine(copy.deepcopy(model), max_slots=4, max_len=64, speculative_depth=2)
    ps = prompts(4, seed=12)
    results = spec.generate_batch([GenerationRequest(p, SamplingParams(temperature=1.0, max_new_tokens=20, seed=i),
                                                     return_routed_experts=True, return_prompt_routed_experts=True)
                                   for i, p in enumerate(ps)])
    assert sum(r.spec_accepted for r in results) > 10
    for p, r in zip(ps, results):
        rows = np.concatenate([r.prompt_routed_experts, r.routed_experts[1:], -np.ones_like(r.routed_experts[:1])])
        with torch.inference_mode():
            logits = model(torch.tensor([p + r.output_ids]), routed_experts=torch.from_numpy(rows)[None]).logits[0]
        logp = torch.log_softmax(logits[len(p) - 1:-1], -1).gather(-1, torch.tensor(r.output_ids)[:, None])
        np.testing.assert_allclose(r.logprobs, logp[:, 0].numpy(), atol=1e-5)
    spec.stop()


# ---- sampling: the output distribution is the target's ----------------------------------

def exact_distribution(model, prompt, sp: SamplingParams) -> np.ndarray:
    """P(x1, x2, x3) under the target model with the sampling transform, by enumeration."""
    V = model.config.vocab_size
    x12 = torch.cartesian_prod(torch.arange(V), torch.arange(V))  # [V*V, 2]
    ids = torch.cat([torch.tensor(prompt).expand(V * V, -1), x12], 1)
    with torch.inference_mode():
        logits = model(ids).logits[:, len(prompt) - 1:].float()  # [V*V, 3, V]
    n = logits.shape[0] * 3
    probs = sampling_probs(logits.reshape(n, V), torch.full((n,), sp.temperature), torch.full((n,), sp.top_p),
                           torch.full((n,), sp.top_k)).view(V, V, 3, V)
    p1 = probs[0, 0, 0]                       # [x1]
    p2 = probs[:, 0, 1]                       # [x1, x2]
    p3 = probs[:, :, 2]                       # [x1, x2, x3]
    return (p1[:, None, None] * p2[:, :, None] * p3).double().numpy()


def chi_square_p_value(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    """Pearson's test, cells with expected count < 5 pooled; p-value by Wilson-Hilferty."""
    n = counts.sum()
    e, o = expected_probs.ravel() * n, counts.ravel().astype(float)
    small = e < 5
    e = np.append(e[~small], e[small].sum())
    o = np.append(o[~small], o[small].sum())
    keep = e > 0
    stat, df = (((o - e) ** 2)[keep] / e[keep]).sum(), keep.sum() - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("depth, sp", [
    (2, SamplingParams(temperature=1.0, max_new_tokens=3)),
    (2, SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=3)),
    (1, SamplingParams(temperature=1.5, top_p=0.95, max_new_tokens=3)),
    (0, SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=3)),
], ids=["k2-t1", "k2-topk-topp", "k1-t1.5", "plain"])
def test_sampled_speculative_output_has_the_target_distribution(depth, sp):
    model = draftable_model(vocab_size=8, seed=5)
    prompt, N = [1, 4, 2, 7], 3000
    engine = Engine(copy.deepcopy(model), max_slots=64, max_len=16, speculative_depth=depth)
    results = engine.generate_batch([GenerationRequest(prompt, SamplingParams(**{**sp.__dict__, "seed": i}))
                                     for i in range(N)])
    engine.stop()
    counts = np.zeros((8, 8, 8))
    for r in results:
        counts[tuple(r.output_ids)] += 1
    if depth:
        rate = sum(r.spec_accepted for r in results) / sum(r.spec_proposed for r in results)
        assert 0.2 < rate < 0.95  # both branches of the rule are exercised
    assert chi_square_p_value(counts, exact_distribution(model, prompt, sp)) > 1e-4
    # The test has power: the same samples against a nearby wrong distribution fail it.
    wrong = SamplingParams(**{**sp.__dict__, "temperature": sp.temperature * 1.25})
    assert chi_square_p_value(counts, exact_distribution(model, prompt, wrong)) < 1e-4
