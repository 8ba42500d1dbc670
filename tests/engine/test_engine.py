"""The engine: cached decoding equals recomputation, batching does not change results, finish
rules, concurrency, weight updates, router replay of the engine's routing, bad input."""

import asyncio
import copy
import threading

import numpy as np
import pytest
import torch

from engine_util import prompts, tiny_model
from opencomposer.engine import Engine, GenerationRequest, SamplingParams
from opencomposer.engine.sampling import sample, sampling_probs, token_logprobs
from opencomposer.errors import CheckpointError
from opencomposer.model import save_pretrained


def greedy(n=16, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, **kw)


def full_logprobs(model, prompt, output, routed=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Recompute from scratch: logits of every output token from one forward over prompt +
    output (causal, so position P-1+j sees exactly what step j saw). Returns (argmax, logprob)."""
    ids = torch.tensor([prompt + output])
    with torch.inference_mode():
        logits = model(ids, routed_experts=routed).logits[0].float()
    rows = logits[len(prompt) - 1:len(prompt) - 1 + len(output)]
    logp = torch.log_softmax(rows, -1)
    return rows.argmax(-1), logp.gather(-1, torch.tensor(output)[:, None]).squeeze(1)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def engine(model):
    e = Engine(copy.deepcopy(model), max_slots=6, max_len=48)
    yield e
    e.stop()


# ---- sampling ---------------------------------------------------------------------------

def test_sampling_distribution_top_k_top_p_temperature():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]] * 4))
    p = sampling_probs(logits, torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([1.0, 0.6, 0.8, 1.0]),
                       torch.tensor([-1, -1, 3, -1]))
    torch.testing.assert_close(p[0], torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    # top_p 0.6: 0.5 alone is below 0.6, so 0.2 joins; renormalised.
    torch.testing.assert_close(p[1], torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7)
    # top_k 3 -> [.5,.2,.15]/.85 = [.588,.235,.176]; then top_p 0.8 keeps the first two.
    torch.testing.assert_close(p[2], torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7)
    assert p[3].tolist() == [1, 0, 0, 0, 0]  # greedy: one-hot
    hot = sampling_probs(logits[:1], torch.tensor([0.5]), torch.tensor([1.0]), torch.tensor([0]))
    torch.testing.assert_close(hot[0], torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2 / 0.325)


def test_inverse_cdf_sampling_and_logprobs():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75]] * 4)
    assert sample(probs, torch.tensor([0.0, 0.2499, 0.25, 0.9999])).tolist() == [1, 1, 3, 3]
    logits = torch.randn(3, 7)
    torch.testing.assert_close(token_logprobs(logits, torch.tensor([0, 3, 6])),
                               torch.log_softmax(logits, -1)[[0, 1, 2], [0, 3, 6]])


# ---- correctness of cached, batched decoding ------------------------------------------

def test_greedy_decoding_equals_full_recomputation(model, engine):
    ps = prompts(4)
    results = engine.generate_batch([GenerationRequest(p, greedy(20)) for p in ps])
    for p, r in zip(ps, results):
        assert len(r.output_ids) == 20 and r.finish_reason == "length"
        argmax, logp = full_logprobs(model, p, r.output_ids)
        assert argmax.tolist() == r.output_ids
        np.testing.assert_allclose(r.logprobs, logp.numpy(), atol=1e-5)
        assert r.policy_versions == [0] * 20 and r.prompt_ids == p


@pytest.mark.parametrize("sampling", [greedy(12), SamplingParams(temperature=0.9, top_p=0.9, top_k=20,
                                                                 max_new_tokens=12, seed=7)])
def test_batched_equals_unbatched(engine, sampling):
    ps = prompts(5, seed=3)
    alone = [engine.generate_batch([GenerationRequest(p, sampling)])[0] for p in ps]
    # The same requests together, and mixed with other (unseeded, sampled) traffic.
    noise = [GenerationRequest(p, SamplingParams(temperature=1.0, max_new_tokens=5)) for p in prompts(3, seed=9)]
    together = engine.generate_batch([GenerationRequest(p, sampling) for p in ps] + noise)[:5]
    for a, b in zip(alone, together):
        assert a.output_ids == b.output_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_seeds_make_sampling_reproducible_and_distinct(engine):
    p = prompts(1, seed=4)[0]
    runs = [engine.generate_batch([GenerationRequest(p, SamplingParams(max_new_tokens=16, seed=s))
                                   for s in (1, 1, 2)]) for _ in range(2)]
    assert runs[0][0].output_ids == runs[0][1].output_ids == runs[1][0].output_ids
    assert runs[0][2].output_ids == runs[1][2].output_ids != runs[0][0].output_ids


def test_stop_tokens_max_tokens_and_context_limit(model, engine):
    p = prompts(1, seed=5, min_len=6, max_len=6)[0]
    ref = engine.generate_batch([GenerationRequest(p, greedy(10))])[0].output_ids
    stop = ref[3]
    first = ref.index(stop)
    r = engine.generate_batch([GenerationRequest(p, greedy(10, stop_token_ids=(stop,)))])[0]
    assert r.output_ids == ref[:first + 1] and r.finish_reason == "stop"
    r = engine.generate_batch([GenerationRequest(p, greedy(4))])[0]
    assert r.output_ids == ref[:4] and r.finish_reason == "length" and len(r.logprobs) == 4
    # Context: prompt + output never exceeds max_len.
    r = engine.generate_batch([GenerationRequest(p, greedy(1000))])[0]
    assert len(p) + len(r.output_ids) == engine.max_len and r.finish_reason == "length"
    assert full_logprobs(model, p, r.output_ids)[0].tolist() == r.output_ids


@pytest.mark.parametrize("depth", [0, 2], ids=["plain", "speculative"])
async def test_concurrent_requests_arriving_at_different_times(model, depth):
    """More requests than slots, of different lengths, arriving while others decode."""
    engine = Engine(copy.deepcopy(model), max_slots=3, max_len=64, speculative_depth=depth)
    ps = prompts(7, seed=6, max_len=20)
    lengths = [5, 17, 9, 30, 3, 12, 21]

    async def later(i):
        await asyncio.sleep(0.01 * i)
        return await engine.generate(GenerationRequest(ps[i], greedy(lengths[i]), request_id=f"r{i}"))

    async with engine:
        results = await asyncio.gather(*(later(i) for i in range(7)))
        assert engine.num_running == 0 and engine.num_waiting == 0
    for i, r in enumerate(results):
        assert r.request_id == f"r{i}" and len(r.output_ids) == lengths[i]
        argmax, logp = full_logprobs(model, ps[i], r.output_ids)
        assert argmax.tolist() == r.output_ids
        np.testing.assert_allclose(r.logprobs, logp.numpy(), atol=1e-5)


# ---- routed experts and router replay ---------------------------------------------------

def replay_rows(r) -> torch.Tensor:
    """Routing of every input position of prompt + output (the last token's own row: router)."""
    rows = np.concatenate([r.prompt_routed_experts, r.routed_experts[1:], -np.ones_like(r.routed_experts[:1])])
    return torch.from_numpy(rows)[None]


@pytest.mark.parametrize("sampling", [greedy(15), SamplingParams(temperature=1.0, max_new_tokens=15, seed=3)])
def test_router_replay_of_engine_routing_gives_engine_logprobs(model, engine, sampling):
    ps = prompts(4, seed=8)
    results = engine.generate_batch([GenerationRequest(p, sampling, return_routed_experts=True,
                                                       return_prompt_routed_experts=True) for p in ps])
    for p, r in zip(ps, results):
        T, Y, K = len(r.output_ids), len(model.config.moe_layers), model.config.num_experts_per_tok
        assert r.routed_experts.shape == (T, Y, K) and r.routed_experts.dtype == np.int32
        assert r.prompt_routed_experts.shape == (len(p), Y, K)
        assert (r.routed_experts[0] == r.prompt_routed_experts[-1]).all()
        _, logp = full_logprobs(model, p, r.output_ids, routed=replay_rows(r))
        np.testing.assert_allclose(r.logprobs, logp.numpy(), atol=1e-5)
        # In float32 the engine's routing is the training forward's own.
        with torch.inference_mode():
            own = model(torch.tensor([p + r.output_ids]), return_routed_experts=True).routed_experts[0]
        assert (own[:-1].numpy() == replay_rows(r)[0, :-1].numpy()).all()


def test_processed_logprobs_are_those_of_the_sampling_distribution(engine):
    p = prompts(1, seed=10)[0]
    top1 = SamplingParams(temperature=1.0, top_k=1, max_new_tokens=6, seed=0)
    raw = engine.generate_batch([GenerationRequest(p, top1)])[0]
    proc = engine.generate_batch([GenerationRequest(p, top1, logprobs_mode="processed")])[0]
    plain = engine.generate_batch([GenerationRequest(p, greedy(6))])[0]
    assert raw.output_ids == proc.output_ids == plain.output_ids  # top-1 sampling is greedy
    assert proc.logprobs == [0.0] * 6 and all(x < 0 for x in raw.logprobs)


# ---- weights ----------------------------------------------------------------------------

def perturbed_state(model, scale=0.5, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {n: t + scale * torch.randn(t.shape, generator=g) * t.std() if t.dim() > 1 else t.clone()
            for n, t in model.state_dict().items()}


async def test_weight_update_mid_request_changes_policy_versions():
    model = tiny_model(seed=2)
    new_state = perturbed_state(model)
    engine = Engine(copy.deepcopy(model), max_slots=2, max_len=400)
    async with engine:
        task = asyncio.create_task(engine.generate(GenerationRequest([1, 2, 3], greedy(300))))
        while not (engine._running and len(engine._running[0].output) >= 5):
            await asyncio.sleep(0.001)
        version = await asyncio.to_thread(engine.update_weights, new_state)
        r = await task
        after = await engine.generate(GenerationRequest([1, 2, 3], greedy(10)))
    assert version == 1 == engine.policy_version
    switch = r.policy_versions.index(1)
    assert switch >= 5 and r.policy_versions == [0] * switch + [1] * (300 - switch)
    assert after.policy_versions == [1] * 10
    model.load_state_dict(new_state)
    assert full_logprobs(model, [1, 2, 3], after.output_ids)[0].tolist() == after.output_ids
    assert engine.update_weights({}, version=7) == 7


def test_update_weights_rejects_bad_tensors_and_loads_from_disk(tmp_path):
    model = tiny_model(seed=3)
    engine = Engine(model, max_slots=2, max_len=32)
    with pytest.raises(ValueError, match="unknown tensor 'nope'"):
        engine.update_weights({"nope": torch.zeros(1)})
    with pytest.raises(ValueError, match="norm.weight.*shape"):
        engine.update_weights({"norm.weight": torch.zeros(3)})
    assert engine.policy_version == 0
    other = tiny_model(seed=4)
    save_pretrained(other, tmp_path / "ckpt")
    assert engine.update_weights_from_disk(tmp_path / "ckpt") == 1
    want = Engine(tiny_model(seed=4), max_slots=1, max_len=32).generate_batch([GenerationRequest([5, 6], greedy(8))])
    got = engine.generate_batch([GenerationRequest([5, 6], greedy(8))])
    assert got[0].output_ids == want[0].output_ids and got[0].policy_versions == [1] * 8
    save_pretrained(tiny_model(seed=4, num_experts=4), tmp_path / "bigger")
    with pytest.raises(CheckpointError, match="num_experts"):
        engine.update_weights_from_disk(tmp_path / "bigger")
    engine.stop()


# ---- bad input, cancellation -------------------------------------------------------------

async def test_bad_requests_fail_before_queueing_and_engine_keeps_serving(engine):
    cases = [([], "empty"), (list(range(48)), "max_len=48"), ([1, 61], "outside the vocabulary"),
             ([1], "top_k")]
    for ids, words in cases:
        sp = SamplingParams(top_k=-2) if words == "top_k" else SamplingParams()
        with pytest.raises(ValueError, match=words):
            await engine.generate(GenerationRequest(ids, sp))
    with pytest.raises(ValueError, match="logprobs_mode"):
        engine.generate_batch([GenerationRequest([1], logprobs_mode="bogus")])
    assert engine.num_waiting == 0
    r = await engine.generate(GenerationRequest(list(range(47)), greedy(5)))
    assert len(r.output_ids) == 1 and r.finish_reason == "length"
    with pytest.raises(ValueError, match="num_mtp_modules=2"):
        Engine(tiny_model(), speculative_depth=3)


async def test_cancelled_request_frees_its_slot(model):
    engine = Engine(copy.deepcopy(model), max_slots=1, max_len=4000)
    async with engine:
        task = asyncio.create_task(engine.generate(GenerationRequest([1, 2], greedy(3900))))
        while not engine.num_running:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        r = await asyncio.wait_for(engine.generate(GenerationRequest([3], greedy(3))), timeout=60)
        assert len(r.output_ids) == 3


def test_stop_aborts_requests_in_flight(model):
    engine = Engine(copy.deepcopy(model), max_slots=1, max_len=4000)
    results = []
    t = threading.Thread(target=lambda: results.extend(engine.generate_batch(
        [GenerationRequest([1], greedy(3900)), GenerationRequest([2], greedy(5))])))
    t.start()
    while not engine.num_running:
        threading.Event().wait(0.001)
    engine.stop()
    t.join(timeout=60)
    assert [r.finish_reason for r in results] == ["abort", "abort"]
    assert 0 < len(results[0].output_ids) < 3900 and results[1].output_ids == []
    assert engine.generate_batch([GenerationRequest([3], greedy(2))])[0].finish_reason == "length"


# ---- prepacked kernels ---------------------------------------------------------------------

def test_prepacked_kernels_match_eager_and_keep_training_exact():
    model = tiny_model(seed=6)
    eager = Engine(copy.deepcopy(model), max_slots=4, max_len=40, prepack_weights=False)
    packed = Engine(copy.deepcopy(model), max_slots=4, max_len=40, native_kernels=False)
    assert packed.prepacked and not eager.prepacked
    assert list(packed.model.state_dict()) == list(model.state_dict())
    reqs = [GenerationRequest(p, greedy(20)) for p in prompts(4, seed=13)]
    for a, b in zip(eager.generate_batch(reqs), packed.generate_batch(reqs)):
        assert a.output_ids == b.output_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    # Training through the swapped model is the eager model's (the oneDNN op has no backward).
    ids = torch.tensor(prompts(2, seed=14, min_len=9, max_len=9))
    for m in (model, packed.model):
        m.zero_grad()
        torch.log_softmax(m(ids).logits, -1)[..., 0].sum().backward()
    for (name, p), q in zip(model.named_parameters(), packed.model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    # An in-place change of the weights (here not through update_weights) is seen at once.
    with torch.no_grad():
        packed.model.lm_head.weight.mul_(-1)
        model.lm_head.weight.mul_(-1)
    r = packed.generate_batch(reqs[:1])[0]
    assert full_logprobs(model, reqs[0].input_ids, r.output_ids)[0].tolist() == r.output_ids
    eager.stop()
    packed.stop()


@pytest.mark.parametrize("speculative_depth", [0, 2])
def test_a_dense_qwen3_model_decodes_as_its_recomputation(speculative_depth):
    """Qwen3 dense (no routers): cached, batched and speculative decoding, logprobs, no routed experts."""
    dense = tiny_model(seed=3, num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, mlp_only_layers=[],
                       tie_word_embeddings=True)
    assert dense.config.arch == "qwen3"
    e = Engine(copy.deepcopy(dense), max_slots=4, max_len=48, speculative_depth=speculative_depth)
    try:
        ps = prompts(3, seed=5)
        results = e.generate_batch([GenerationRequest(p, greedy(14), return_routed_experts=True) for p in ps])
        for p, r in zip(ps, results):
            argmax, logp = full_logprobs(dense, p, r.output_ids)
            assert argmax.tolist() == r.output_ids
            np.testing.assert_allclose(r.logprobs, logp.numpy(), atol=1e-5)
            assert r.routed_experts is None or np.asarray(r.routed_experts).shape[1] == 0
    finally:
        e.stop()
