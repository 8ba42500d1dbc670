"""The engine's forward backends (engine/forward.py) and C++ kernels (engine/native.py) against
the model's own forward: prefill, decode and verify passes, MTP steps, weight updates."""

from __future__ import annotations

import copy
import os
import time

import pytest
import torch
import torch.nn.functional as F

from opencomposer.engine import Engine, GenerationRequest, SamplingParams, native
from opencomposer.engine.forward import NativeForward, TorchForward, _block_weights, make_forward
from opencomposer.model.model import KVCache, MoE
from opencomposer.training.threads import FreeCPUs

from engine_util import tiny_model

needs_native = pytest.mark.skipif(native.ops() is None, reason=f"C++ kernels unavailable: {native.unavailable_reason()}")


def _fill(model, cache, slots, lengths, seed):
    """Prefill each slot with random tokens through the model's generic forward."""
    g = torch.Generator().manual_seed(seed)
    for s, n in zip(slots, lengths):
        ids = torch.randint(0, model.config.vocab_size, (1, n), generator=g)
        with torch.no_grad():
            model(ids, cache, torch.tensor([s]))
        cache.advance([s], n)


@needs_native
@pytest.mark.parametrize("T", [1, 3, 9, 20, 45])  # >= 16: prefill attention as products, chunks of 32
@pytest.mark.parametrize("slots", [[0, 1, 2, 3], [5, 1, 3], [2]])
def test_native_pass_equals_the_models_cached_forward(T, slots):
    model = tiny_model(shared_expert_intermediate_size=12, attention_bias=True)  # + a dense layer (mlp_only_layers)
    caches = [KVCache(model.config, max_slots=8, max_len=64) for _ in range(2)]
    for cache in caches:
        _fill(model, cache, slots, [4 + 3 * b for b in range(len(slots))], seed=1)
    ids_BT = torch.randint(0, model.config.vocab_size, (len(slots), T), generator=torch.Generator().manual_seed(2))
    slots_B = torch.tensor(slots)
    with torch.inference_mode():
        want = model(ids_BT, caches[0], slots_B, return_routed_experts=True)
        got = NativeForward(model, caches[1])(ids_BT, slots_B, logits="all", want_experts=True)
        last = NativeForward(model, caches[1])(ids_BT, slots_B, logits="last").logits
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.hidden, want.hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last, want.logits[:, -1], atol=1e-5, rtol=1e-5)
    assert got.routed_experts.dtype == torch.int32 and (got.routed_experts == want.routed_experts).all()
    for c0, c1 in zip(caches[0].k[:, slots], caches[1].k[:, slots]):  # the same keys written
        torch.testing.assert_close(c1, c0, atol=1e-5, rtol=1e-5)


@needs_native
def test_native_mtp_step_equals_the_models():
    model = tiny_model()
    D = model.config.num_mtp_modules
    caches = [KVCache(model.config, max_slots=4, max_len=40) for _ in range(2)]
    slots_B = torch.tensor([3, 0])
    for cache in caches:
        _fill(model, cache, [3, 0], [12, 9], seed=3)
    g = torch.Generator().manual_seed(4)
    T = 4
    hidden_BTD = torch.randn(2, T, model.config.hidden_size, generator=g)
    ids_BT = torch.randint(0, model.config.vocab_size, (2, T), generator=g)
    fwd = NativeForward(model, caches[1])
    with torch.inference_mode():
        for depth in range(1, D + 1):
            want_logits, want_h = model.mtp_step(depth, hidden_BTD, ids_BT, caches[0], slots_B)
            got_logits, got_h = fwd.mtp_step(depth, hidden_BTD, ids_BT, slots_B)
            torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got_logits, want_logits[:, -1], atol=1e-5, rtol=1e-5)
            hidden_BTD = want_h


@needs_native
def test_native_pass_follows_weight_updates_after_refresh():
    model = tiny_model()
    cache = KVCache(model.config, max_slots=4, max_len=16)
    fwd = NativeForward(model, cache)
    ids_BT, slots_B = torch.tensor([[3], [4]]), torch.tensor([0, 1])
    with torch.inference_mode():
        before = fwd(ids_BT, slots_B).logits
    moe = next(layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE))
    with torch.no_grad():
        model.layers[0].self_attn.k_norm.weight.mul_(3.0)
        moe.experts.down_proj.mul_(-2.0)
        model.lm_head.weight.mul_(0.5)
    fwd.refresh()  # what Engine.update_weights does after copying
    with torch.inference_mode():
        after = fwd(ids_BT, slots_B).logits
        want = model(ids_BT, cache, slots_B).logits
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, want, atol=1e-5, rtol=1e-5)


@needs_native
@pytest.mark.parametrize("M", [1, 5, 6, 70])  # tiles of 6 rows, blocks of 64
def test_kernels_linear_and_swiglu_at_odd_sizes(M):
    ops = native.ops()
    g = torch.Generator().manual_seed(M)
    x = torch.randn(M, 24, generator=g)
    w, bias, res = torch.randn(37, 24, generator=g), torch.randn(37, generator=g), torch.randn(M, 37, generator=g)
    norm_w = torch.randn(24, generator=g)
    torch.testing.assert_close(ops.linear(x, native.pack_linear(w), 37, bias, res), F.linear(x, w, bias) + res,
                               atol=1e-5, rtol=1e-5)
    h = F.rms_norm(x, (24,), norm_w, 1e-6)
    torch.testing.assert_close(ops.linear(x, native.pack_linear(w), 37, None, None, norm_w, 1e-6), F.linear(h, w),
                               atol=1e-5, rtol=1e-5)
    gate, up = torch.randn(13, 24, generator=g), torch.randn(13, 24, generator=g)
    torch.testing.assert_close(ops.swiglu(x, native.pack_swiglu(gate, up), 13),
                               F.silu(F.linear(x, gate)) * F.linear(x, up), atol=1e-5, rtol=1e-5)


@needs_native
def test_kernels_moe_equals_the_models_router_and_experts():
    model = tiny_model(num_experts=7, moe_intermediate_size=13)  # widths that are not whole panels
    i, layer = next((i, layer) for i, layer in enumerate(model.layers) if isinstance(layer.mlp, MoE))
    moe = layer.mlp
    router, gu, down = _block_weights(layer, i)[0][8:11]
    for N in (1, 3, 40):  # 1 token leaves most experts empty
        x_ND = torch.randn(N, model.config.hidden_size, generator=torch.Generator().manual_seed(N))
        with torch.inference_mode():
            y_BTD, idx_NK, _ = moe(x_ND[None])
            out, idx = native.ops().moe(x_ND, None, 0.0, router, 7, moe.k, moe.norm_topk_prob, gu, down)
        assert (idx == idx_NK).all()
        torch.testing.assert_close(out, x_ND + y_BTD[0], atol=1e-5, rtol=1e-5)


def _pass_outputs(model, threads: int, seed: int = 5):
    """Logits, hidden states and experts of one native pass (T = 3, 3 rows) at `threads` threads."""
    cache = KVCache(model.config, max_slots=4, max_len=32)
    _fill(model, cache, [0, 1, 2], [4, 6, 5], seed=seed)
    ids_BT = torch.randint(0, model.config.vocab_size, (3, 3), generator=torch.Generator().manual_seed(seed))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            out = NativeForward(model, cache)(ids_BT, torch.tensor([0, 1, 2]), want_experts=True)
    finally:
        torch.set_num_threads(before)
    return out.logits, out.hidden, out.routed_experts


@pytest.fixture
def pool_policy():
    """Sets csrc/pool.h's policy for one test (0: one chunk per thread, 1: pieces, always
    parallel, 2: adaptive from timings, 3: on the CPUs others leave free, the default) and
    restores it after."""
    ops = native.ops()
    old = ops.pool_policy(-1)
    yield ops.pool_policy
    ops.pool_policy(old)


def _parallel_regions() -> int:
    return native.ops().pool_stats()[1]


@needs_native
@pytest.mark.parametrize("policy", [0, 1, 2, 3])
def test_kernels_give_the_same_bits_on_any_number_of_threads(pool_policy, policy):
    """The pool (csrc/pool.h) splits panels, experts and (row, head) pairs between threads,
    never a sum: 1, 2 and 3 threads (more than this machine's cores) agree bit for bit, under
    every policy (fixed chunks, pieces claimed one at a time, adaptive: serial or parallel per
    region, on the free CPUs). Policies 0 and 1 are always parallel on 2 threads: the test
    checks they were."""
    model = tiny_model(num_experts=7, moe_intermediate_size=13)
    pool_policy(policy)
    want = _pass_outputs(model, 1)
    for threads in (2, 3):
        before = _parallel_regions()
        for a, b in zip(_pass_outputs(model, threads), want):
            assert torch.equal(a, b)
        if policy in (0, 1) and len(os.sched_getaffinity(0)) > 1:
            assert _parallel_regions() > before


@needs_native
@pytest.mark.parametrize("policy", [1, 2, 3])
def test_kernels_from_several_threads_at_once_and_in_a_forked_child(pool_policy, policy):
    """Callers on several Python threads share the one pool (a caller that finds it busy runs
    on its own thread), and a forked child, which inherits none of the pool's workers, gets
    a pool of its own instead of waiting for them."""
    import multiprocessing
    import threading

    pool_policy(policy)
    model = tiny_model(seed=4)
    threads_before = torch.get_num_threads()
    want = _pass_outputs(model, 2)
    got, errors = [], []

    def call():
        try:
            for _ in range(5):
                got.append(_pass_outputs(model, 2))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(got) == 15
    for outs in got:
        for a, b in zip(outs, want):
            assert torch.equal(a, b)
    # The child calls only the kernels: torch's own OpenMP ops hang in a child forked after
    # they ran on 2 threads (libgomp is not fork-safe), which is torch's matter, not the pool's.
    ops = native.ops()
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(16, 64, generator=g), torch.randn(160, 64, generator=g)
    wp = native.pack_linear(w)
    torch.set_num_threads(2)
    try:
        y = [ops.linear(x, wp, 160).flatten().tolist() for _ in range(4)][-1]  # the parent's pool has a worker now
    finally:
        torch.set_num_threads(threads_before)
    assert policy != 1 or len(os.sched_getaffinity(0)) == 1 or ops.pool_stats()[1] > 0
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child_main():
        torch.set_num_threads(2)
        q.put([ops.linear(x, wp, 160).flatten().tolist() for _ in range(4)])

    child = ctx.Process(target=child_main)
    child.start()
    try:
        got = q.get(timeout=60)  # before join: the child's put waits for the pipe to be read
    except Exception:
        got = None
    child.join(timeout=10)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0 and got is not None, \
        "the forked child did not finish (a pool waiting for its parent's workers?)"
    assert all(r == y for r in got)


@pytest.fixture
def two_threads():
    """For a pool test that needs 2 CPUs: torch on 2 threads during the test; gives the CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield cpus
    torch.set_num_threads(before)


def _linear_case(seed: int, rows: int, out: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, 64], a packed [out, 64] weight and the kernels' x @ w.T on the current threads."""
    g = torch.Generator().manual_seed(seed)
    x, wp = torch.randn(rows, 64, generator=g), native.pack_linear(torch.randn(out, 64, generator=g))
    return x, wp, native.ops().linear(x, wp, out)


@needs_native
def test_the_pool_runs_serially_on_the_cpus_the_process_gets(pool_policy, two_threads):
    """The pool caps its threads at the CPUs this process may run on (re-read every 100 ms):
    pinned to one CPU, a 2-thread caller runs every region on its own thread, even where the
    policy is always parallel; given the CPUs back, it runs in parallel again."""
    cpus = two_threads
    ops = native.ops()
    pool_policy(1)
    x, wp, want = _linear_case(seed=8, rows=4, out=256)
    try:
        os.sched_setaffinity(0, {min(cpus)})
        time.sleep(0.15)
        before = ops.pool_stats()
        assert torch.equal(ops.linear(x, wp, 256), want)
        after = ops.pool_stats()
        assert after[1] == before[1] and after[2] > before[2]  # serial, not parallel
        os.sched_setaffinity(0, cpus)
        time.sleep(0.15)
        assert torch.equal(ops.linear(x, wp, 256), want)
        assert ops.pool_stats()[1] > after[1]
    finally:
        os.sched_setaffinity(0, cpus)


@needs_native
def test_the_pool_leaves_the_cpus_that_other_processes_keep_busy(pool_policy, two_threads):
    """Policy 3 (the default) runs a region on the CPUs that other processes leave free
    (csrc/pool.h's sampler reads /proc/stat): with a busy process pinned to every CPU but
    one, 2-thread regions run on the caller alone and give the same bits; once the busy
    processes stop, the CPUs count as free again and regions run in parallel (unless another
    job keeps one busy, which an independent count from /proc/stat must then confirm)."""
    import subprocess
    import sys

    cpus = two_threads
    ops = native.ops()
    pool_policy(3)
    x, wp, want = _linear_case(seed=9, rows=16, out=512)

    def free_cpus_within(seconds: float, ok) -> int:
        deadline = time.monotonic() + seconds
        while True:
            assert torch.equal(ops.linear(x, wp, 512), want)  # keeps the pool (and its sampler) in use
            free = ops.pool_stats()[7]
            if ok(free) or time.monotonic() > deadline:
                return free
            time.sleep(0.01)

    busy = [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{c}}})\nwhile True: pass"])
            for c in cpus[1:]]
    try:
        free = free_cpus_within(5, lambda f: f == 1)
        assert free == 1, f"the pool counted {free} free CPUs with a busy process on all but one of {len(cpus)}"
        before = ops.pool_stats()
        for _ in range(20):
            assert torch.equal(ops.linear(x, wp, 512), want)
        after = ops.pool_stats()
        assert after[1] == before[1] and after[2] >= before[2] + 20 and after[6] >= before[6] + 20
    finally:
        for p in busy:
            p.kill()
            p.wait()
    others = FreeCPUs()  # an independent count over the same wait (training/threads.py)
    free = free_cpus_within(10, lambda f: f >= 2)
    if free < 2:  # right only if something else kept a CPU busy all along (a job beside the tests)
        left = others()
        assert left is not None and left < len(cpus), \
            f"the pool still counted {free} free CPU(s) 10 s after the busy processes stopped, " \
            f"while /proc/stat says {left} were free"
        return
    before = ops.pool_stats()
    for _ in range(20):
        assert torch.equal(ops.linear(x, wp, 512), want)
    assert ops.pool_stats()[1] > before[1]


@needs_native
def test_pool_policy_rejects_unknown_policies():
    with pytest.raises(RuntimeError, match="0 \\(one chunk per thread\\), 1 .*2 .*3 .*-1"):
        native.ops().pool_policy(4)


def test_engine_falls_back_to_the_torch_path_without_the_kernels(monkeypatch):
    model = tiny_model(seed=2)
    monkeypatch.setitem(native._state, "ops", None)
    monkeypatch.setitem(native._state, "reason", "test")
    engine = Engine(copy.deepcopy(model), max_slots=2, max_len=32)
    assert not engine.native and isinstance(engine._fwd, TorchForward)
    out = engine.generate_batch([GenerationRequest([1, 2, 3], SamplingParams(temperature=0, max_new_tokens=5))])
    engine.stop()
    assert len(out[0].output_ids) == 5
    assert isinstance(make_forward(model.to(torch.float64), KVCache(model.config, 1, 8, dtype=torch.float64),
                                   packed=False), TorchForward)


def test_build_without_a_compiler_says_what_to_install(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(RuntimeError, match="apt-get install g\\+\\+"):
        native.build()


@needs_native
def test_native_and_torch_engines_agree():
    model = tiny_model(seed=5)
    reqs = [GenerationRequest([5 + i, 7, 9, 11 + i], SamplingParams(temperature=0, max_new_tokens=12), return_logprob=True)
            for i in range(3)]
    outs = []
    for nat in (True, False):
        engine = Engine(copy.deepcopy(model), max_slots=4, max_len=40, native_kernels=nat, speculative_depth=2)
        assert engine.native == nat
        outs.append(engine.generate_batch(reqs))
        engine.stop()
    for a, b in zip(*outs):
        assert a.output_ids == b.output_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)


@needs_native
def test_kernels_greedy_sampling_equals_argmax_and_token_logprobs():
    from opencomposer.engine.sampling import token_logprobs

    logits = torch.randn(5, 301, generator=torch.Generator().manual_seed(0)) * 4
    logits[2, 7] = logits[2, 90] = logits[2].max() + 1  # a tie: the first index, as torch.argmax
    tokens, lps = native.ops().argmax_logprob(logits)
    assert tokens.tolist() == logits.argmax(-1).tolist()
    torch.testing.assert_close(lps, token_logprobs(logits, tokens), atol=1e-5, rtol=1e-5)


@needs_native
def test_kernels_inverse_cdf_draws_the_torch_ops_token_bit_for_bit():
    """sampling.sample's native path: the same token as probs.double().cumsum + searchsorted
    (right) + clamp on every row, including zero-mass tokens, u = 0, u at a row's exact
    cumulative boundaries and u just below 1, unnormalised rows, on 1 and 2 threads."""
    g = torch.Generator().manual_seed(3)
    N, V = 37, 301
    probs = torch.softmax(torch.randn(N, V, generator=g) * 3, -1)
    probs[probs < 1e-3] = 0.0  # zero-mass tokens, never drawn
    probs[5] *= 7.5  # unnormalised
    cdf = probs.double().cumsum(-1)
    u = torch.rand(N, generator=g, dtype=torch.float64)
    u[0], u[1], u[2] = 0.0, 1.0 - 2 ** -53, 0.999999
    u[3] = cdf[3, 150] / cdf[3, -1]  # on a boundary
    u[4] = torch.nextafter(cdf[4, 40] / cdf[4, -1], torch.tensor(0.0, dtype=torch.float64))
    want = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1).clamp_(max=V - 1)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = native.ops().inverse_cdf(probs, u)
            assert got.tolist() == want.tolist()
            assert all(probs[n, t] > 0 for n, t in enumerate(got.tolist()))
    finally:
        torch.set_num_threads(before)


@needs_native
@pytest.mark.parametrize("k", [1, 2, 3])
def test_native_greedy_speculative_step_equals_the_torch_one(k):
    """verify + accept + cache advance + window shifts + drafting: same tokens, state and drafts
    (the native op recomputes only the MTP entries that read a rejected draft; the reference
    recomputes every depth's whole window)."""
    from engine_util import draftable_model

    from opencomposer.engine import speculative

    model = draftable_model(num_mtp_modules=3)
    W, slots = 2 * k, [3, 0, 1]
    g = torch.Generator().manual_seed(7)
    ids_BJ = torch.randint(0, model.config.vocab_size, (3, k + 1), generator=g)
    recent_BW = torch.randint(0, model.config.vocab_size, (3, W), generator=g)
    cache = KVCache(model.config, max_slots=4, max_len=40)
    _fill(model, cache, slots, [9, 6, 12], seed=8)
    windows = torch.zeros(4, k, W, model.config.hidden_size)
    windows[:, 0] = torch.randn(4, W, model.config.hidden_size, generator=g)
    slots_B = torch.tensor(slots)
    ids_BJ[:, 0] = recent_BW[:, -1]  # the pending token
    with torch.inference_mode():
        for j in range(k):  # drafts that the target accepts: all of row 0's, the first of row 1's
            target_BJ = model(ids_BJ, copy.deepcopy(cache), slots_B).logits.argmax(-1)
            ids_BJ[0, j + 1] = target_BJ[0, j]
            ids_BJ[1, 1] = target_BJ[1, 0]
        # The state the drafting of these drafts leaves: MTP caches and every depth's window.
        depth = iter(range(k))
        _, _, hs = speculative.draft(TorchForward(model, cache, packed=False).mtp_step, cache, slots_B,
                                     windows[slots_B, 0], recent_BW, k, lambda lg: (ids_BJ[:, 1 + next(depth)], None))
        for d, h in enumerate(hs[:-1], start=1):
            windows[slots_B, d] = h
    results = []
    for make in (TorchForward, NativeForward):
        c = copy.deepcopy(cache)
        fwd = make(model, c, packed=False) if make is TorchForward else make(model, c)
        w = windows.clone()
        with torch.inference_mode():
            r = fwd.spec_greedy(ids_BJ, slots_B, recent_BW, w, want_experts=True)
        results.append((r, w, c.lengths.clone()))
    (a, ha, la), (b, hb, lb) = results
    assert a.accepted[0] == k and a.accepted[1] >= 1
    assert (a.accepted == b.accepted).all() and (a.tokens == b.tokens).all() and (la == lb).all()
    assert (a.drafts == b.drafts).all() and (a.routed_experts == b.routed_experts).all()
    torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hb, ha, atol=1e-5, rtol=1e-5)
