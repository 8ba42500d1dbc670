"""The embedded inference engine: slot KV cache, continuous batching, sampling, MTP speculation.

`Engine(model)` serves `GenerationRequest`s (token ids in; token ids, behaviour logprobs,
routed experts and policy versions out). A scheduler thread repeats:

  1. apply a pending weight update (`update_weights`: in place, between steps; the policy
     version each token was generated under is recorded, so in-flight requests simply continue
     under the new weights, PipelineRL-style);
  2. admit waiting requests into free cache slots: prefill (one forward per group of prompts of
     equal length: 16 prompts of 32 tokens prefill 2.7x faster together than one by one, 1.1x
     at 256 tokens; identical prompts, e.g. the G samples of an RL group, are prefilled once
     and their keys/values copied to the other slots), sample each first token;
  3. one decode step for every running slot together: plain (a [B, 1] forward) or speculative
     (draft k tokens with the MTP modules, verify in one [B, k+1] forward: speculative.py);
  4. sample, append, finish (stop token, max_new_tokens, or the context `max_len` is full:
     finish_reason "stop"/"length"), free slots, deliver results.

Why a thread and not an asyncio task: the forward is pure compute and holds no event loop, so
one dedicated thread serves every caller (the server's event loop, `generate_batch` from sync
code, tests on their own loops) without a hop per step; torch releases the GIL inside its ops,
so the event loop stays responsive (benchmarks/decode.py measures its lag). Results go back
with `loop.call_soon_threadsafe`.

Per-token outputs. `logprobs[j]` = log softmax(logits)[token] at temperature 1 (see sampling.py;
`logprobs_mode="processed"` gives log p of the actual sampling distribution instead).
`routed_experts[j]` are the experts of the forward whose logits produced output token j, i.e.
of input position P-1+j (SGLang's row layout): `routed_experts[0] == prompt_routed_experts[-1]`,
and replaying prompt_routed_experts + routed_experts[1:] reproduces every output logprob.

Forward passes go through forward.py's seam. On the CPU in float32 every pass (prefill, plain
decode, speculative verification, MTP drafting) runs the C++ kernels of native.py: 4 ops per
layer, the experts grouped per expert with no Python in between. Where those cannot be built
(no compiler) or for other dtypes, the linear layers and experts run on oneDNN with prepacked
weights (kernels.py; `prepack_weights=False` keeps PyTorch's default kernels), plain decode
steps on fused.py's one-token forward and the rest on the model's generic forward. That torch
path is also the one on a GPU: the engine runs on its model's device, and each step's tensors
are built there (bookkeeping stays in Python lists on the host).

Covered: token-id requests of any mix of sampling parameters in one batch, per-request seeds
(`random.Random(seed)` per request: the same tokens alone or batched), abort on cancellation.
Left out: padded prefill of prompts of different lengths, chunked prefill of very long
prompts (a prompt is one forward), prefix caching
across requests other than identical prompts admitted together, preemption when the cache is
full (requests wait for a free slot instead), one model over several devices.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from opencomposer.engine import forward, kernels, speculative
from opencomposer.engine.sampling import greedy, sample, sampling_probs, token_logprobs
from opencomposer.engine.types import GenerationRequest, GenerationResult
from opencomposer.errors import CheckpointError
from opencomposer.model.model import KVCache, Transformer

log = logging.getLogger(__name__)

PREFILL_TOKENS = 4096
"""Most prompt tokens in one prefill forward (prompts of a group beyond it go in the next)."""


@dataclass
class EngineStats:
    """Counters since the engine was built (for /metrics and benchmarks)."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_s: float = 0.0
    """Decode steps and their time (speculative: drafting included)."""
    generated_tokens: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0
    recent_steps: deque = field(default_factory=lambda: deque(maxlen=4096))
    """(rows, seconds) of the latest decode steps."""


@dataclass(eq=False)
class _Seq:
    """One request in flight. `tokens` = prompt + output; the last output token is pending
    (sampled, not yet fed), so the slot's cache holds len(tokens) - 1 positions."""

    request: GenerationRequest
    request_id: str
    deliver: Callable[[GenerationResult | BaseException], None]
    rng: random.Random
    tokens: list[int]
    prompt_len: int
    slot: int = -1
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    experts: list[np.ndarray] = field(default_factory=list)
    prompt_experts: np.ndarray | None = None
    versions: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    q_kV: torch.Tensor | None = None       # draft distributions; None: the drafts are argmaxes
    spec_accepted: int = 0
    spec_proposed: int = 0
    finish: str | None = None
    aborted: bool = False

    @property
    def greedy(self) -> bool:
        return self.request.sampling.temperature == 0

    @property
    def processed(self) -> bool:
        return self.request.logprobs_mode == "processed"

    @property
    def wants_experts(self) -> bool:
        return self.request.return_routed_experts or self.request.return_prompt_routed_experts


class Engine:
    """Continuous-batching generation over a `Transformer` (module docstring).

    max_slots: sequences decoded together (KV cache slots). max_len: context of one sequence,
    prompt + output. speculative_depth: k MTP draft tokens per step (0: plain decoding; at most
    the model's num_mtp_modules). dtype: cast the model and its cache; None keeps the model's
    dtype. prepack_weights: on CPU, swap the linear layers and experts for oneDNN kernels with
    prepacked weights (kernels.py; same parameters and state_dict, eager under autograd) when
    the C++ kernels are not used. native_kernels: run every pass on the C++ kernels where they
    build (forward.py; False: the oneDNN/PyTorch path). `engine.native` says which runs.
    num_threads: torch intra-op threads (None: unchanged), set here and again on the scheduler
    thread when it starts (torch keeps a count per thread, fixed when a thread first asks for
    it, so an engine's own thread runs at its own setting); the C++ kernels run each region on
    at most that many, fewer while other processes keep CPUs busy (csrc/pool.h, policy 3). The
    engine owns `model`: it is cast
    and its modules swapped in place (pass a copy to keep an untouched one).
    """

    def __init__(self, model: Transformer, *, max_slots: int = 32, max_len: int = 4096,
                 speculative_depth: int = 0, dtype: torch.dtype | None = None,
                 prepack_weights: bool = True, native_kernels: bool = True, num_threads: int | None = None):
        cfg = model.config
        if not 0 <= speculative_depth <= cfg.num_mtp_modules:
            raise ValueError(f"speculative_depth={speculative_depth} needs that many MTP modules; the model "
                             f"has num_mtp_modules={cfg.num_mtp_modules}")
        if max_slots < 1 or max_len < 2:
            raise ValueError(f"need max_slots >= 1 and max_len >= 2, got {max_slots}, {max_len}")
        self.num_threads = num_threads
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model = model.to(dtype).eval() if dtype is not None else model.eval()
        self.dtype = next(self.model.parameters()).dtype
        self.device = device = next(self.model.parameters()).device  # each step's tensors are built here
        self.max_slots, self.max_len, self.k = max_slots, max_len, speculative_depth
        self.vocab_size = cfg.vocab_size
        # k positions of headroom: a verify forward near the end of the context writes drafts there.
        self.cache = KVCache(cfg, max_slots, max_len + speculative_depth, dtype=self.dtype, device=device)
        self.prepacked = prepack_weights and device.type == "cpu" and kernels.packs(self.dtype)
        if native_kernels:
            self._fwd = forward.make_forward(self.model, self.cache, packed=self.prepacked)
        else:
            self._fwd = forward.TorchForward(self.model, self.cache, packed=self.prepacked)
        self.native = isinstance(self._fwd, forward.NativeForward)
        if self.prepacked and not self.native:
            kernels.prepack(self.model)
        self.prepacked = self.prepacked and not self.native
        # [S, k, W, D]: per slot, depth d's hiddens at the W newest positions (d = 0: the main
        # model's; MTP depth d's for d >= 1, which the greedy fast path recomputes only in part)
        W = speculative.window(speculative_depth)
        self._windows = torch.zeros(max_slots, max(speculative_depth, 1), W, cfg.hidden_size, dtype=self.dtype,
                                    device=device)
        self.policy_version = 0
        self._free = list(range(max_slots))     # kept sorted: low slots first keeps batches contiguous
        self._running: list[_Seq] = []
        self._waiting: deque[_Seq] = deque()
        self._updates: list[tuple[dict, int | None, Future]] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._seed_rng = random.Random()
        self.stats = EngineStats()

    # ---- public API ---------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Queue one request and wait for its result; cancelling the await aborts it."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def deliver(result: GenerationResult | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(_resolve, fut, result)
            except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
                pass

        seq = self._make_seq(request, deliver)
        self._submit([seq])
        try:
            return await fut
        except asyncio.CancelledError:
            seq.aborted = True
            raise

    def generate_batch(self, requests: Iterable[GenerationRequest]) -> list[GenerationResult]:
        """Synchronous convenience: submit all, wait for all, results in request order."""
        futures, seqs = [], []
        for request in requests:
            fut: Future = Future()
            seqs.append(self._make_seq(request, lambda r, fut=fut: _resolve(fut, r)))
            futures.append(fut)
        self._submit(seqs)
        return [f.result() for f in futures]

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> int:
        """Copy `state_dict` (names as model.state_dict(); a subset is fine) into the model in
        place between two decode steps; the policy version becomes `version` (default: +1).
        Blocks until applied and returns the new version."""
        params = self.model.state_dict()
        for name, t in state_dict.items():
            if name not in params:
                raise ValueError(f"update_weights: unknown tensor {name!r}; names are those of model.state_dict()")
            if tuple(t.shape) != tuple(params[name].shape):
                raise ValueError(f"update_weights: {name!r} has shape {list(t.shape)}, "
                                 f"the model's is {list(params[name].shape)}")
        fut: Future = Future()
        with self._cv:
            if self._thread is None:  # nothing is decoding: apply now
                self._apply_update(state_dict, version, fut)
            else:
                self._updates.append((state_dict, version, fut))
                self._cv.notify()
        return fut.result()

    def update_weights_from_disk(self, path: str | Path, version: int | None = None) -> int:
        """Load an HF-format checkpoint directory (opencomposer.model.save_pretrained's layout,
        or transformers') with the same config, and apply it as `update_weights`."""
        from opencomposer.model.hf import load_config, load_pretrained

        config, _ = load_config(path)
        if config.to_dict() != self.model.config.to_dict():
            diff = {k: v for k, v in config.to_dict().items() if self.model.config.to_dict().get(k) != v}
            raise CheckpointError(f"{path}: config.json differs from the served model's config in {diff}; "
                                  f"weights can only be updated for the same architecture")
        return self.update_weights(load_pretrained(path, dtype=self.dtype).state_dict(), version)

    def start(self) -> None:
        """Start the scheduler thread (also done by the first request)."""
        with self._cv:
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(target=self._loop, name="opencomposer-engine", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Finish every request in flight with finish_reason "abort" and stop the thread."""
        with self._cv:
            thread, self._stopping = self._thread, True
            self._cv.notify()
        if thread is not None:
            thread.join()

    async def __aenter__(self) -> "Engine":
        self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.to_thread(self.stop)

    # ---- requests -----------------------------------------------------------------------

    def _make_seq(self, request: GenerationRequest, deliver) -> _Seq:
        """Validate before anything is queued: a bad request raises ValueError here."""
        ids = [int(t) for t in request.input_ids]
        if not ids:
            raise ValueError("input_ids is empty: a prompt needs at least one token")
        if len(ids) >= self.max_len:
            raise ValueError(f"prompt of {len(ids)} tokens leaves no room to generate in this engine's "
                             f"context of max_len={self.max_len} tokens (prompt + output); shorten it")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"input_ids {bad[:5]} are outside the vocabulary 0..{self.vocab_size - 1}")
        sp = request.sampling
        if sp.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 0, got {sp.top_k}")
        if request.logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {request.logprobs_mode!r}")
        seed = sp.seed if sp.seed is not None else self._seed_rng.getrandbits(63)
        return _Seq(request, request.request_id or uuid.uuid4().hex, deliver, random.Random(seed), ids, len(ids))

    def _submit(self, seqs: list[_Seq]) -> None:
        with self._cv:
            self._waiting.extend(seqs)
            self._cv.notify()
        self.start()

    def _result(self, s: _Seq) -> GenerationResult:
        req, cfg = s.request, self.model.config
        shape = (0, len(cfg.moe_layers), cfg.num_experts_per_tok)
        experts = None
        if req.return_routed_experts:
            experts = np.stack(s.experts).astype(np.int32) if s.experts else np.zeros(shape, np.int32)
        return GenerationResult(
            request_id=s.request_id, prompt_ids=s.tokens[:s.prompt_len], output_ids=list(s.output),
            finish_reason=s.finish or "abort", logprobs=list(s.logprobs) if req.return_logprob else None,
            routed_experts=experts,
            prompt_routed_experts=s.prompt_experts if req.return_prompt_routed_experts else None,
            policy_versions=list(s.versions), spec_accepted=s.spec_accepted, spec_proposed=s.spec_proposed)

    def _extend(self, s: _Seq, tokens: list[int], logprobs: list[float], experts: np.ndarray | None) -> None:
        """Append generated tokens one by one until a finish condition; the rest are dropped."""
        stop, limit = s.request.sampling.stop_token_ids, s.request.sampling.max_new_tokens
        for j, t in enumerate(tokens):
            s.output.append(t)
            s.tokens.append(t)
            s.logprobs.append(logprobs[j])
            s.versions.append(self.policy_version)
            self.stats.generated_tokens += 1
            if experts is not None:
                s.experts.append(experts[j])
            if t in stop:
                s.finish = "stop"
            elif len(s.output) >= limit or len(s.tokens) >= self.max_len:
                s.finish = "length"
            if s.finish:
                return

    def _release(self, s: _Seq, error: BaseException | None = None) -> None:
        if s.slot >= 0:
            self.cache.reset([s.slot])
            self._free.append(s.slot)
            self._free.sort()
            s.slot = -1
        s.deliver(error if error is not None else self._result(s))

    # ---- the scheduler ------------------------------------------------------------------

    def _loop(self) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        while True:
            with self._cv:
                while not (self._stopping or self._updates or self._running
                           or (self._waiting and self._free)):
                    self._cv.wait()
                if self._stopping:
                    break
                updates, self._updates = self._updates, []
                admitted = []
                while self._waiting and len(admitted) < len(self._free):
                    admitted.append(self._waiting.popleft())
            for state_dict, version, fut in updates:
                self._apply_update(state_dict, version, fut)
            batch = [s for s in admitted if not s.aborted] + self._running
            try:
                with torch.inference_mode():
                    self._step(admitted)
            except Exception as e:  # a broken step fails its requests, not the engine
                log.exception("engine step failed")
                for s in batch:
                    self._release(s, RuntimeError(f"engine step failed: {e!r}"))
                self._running = []
        with self._cv:
            leftover, self._running = self._running + list(self._waiting), []
            self._waiting.clear()
            for state_dict, version, fut in self._updates:
                self._apply_update(state_dict, version, fut)
            self._updates, self._thread = [], None
        for s in leftover:
            self._release(s)

    def _step(self, admitted: list[_Seq]) -> None:
        """Admit, decode one step, finish; self._running becomes the sequences still running."""
        live = []
        for s in self._running + admitted:
            if s.aborted:
                s.finish = s.finish or "abort"
                self._release(s)
            else:
                live.append(s)
        new = [s for s in admitted if not s.aborted]
        for s in new:
            s.slot = self._free.pop(0)
        old = [s for s in live if s not in new]
        st = self.stats
        for group in _prefill_groups(new):
            t0 = time.perf_counter()
            self._prefill(group)
            st.prefill_s += time.perf_counter() - t0
            st.prefill_tokens += len({tuple(s.tokens[:s.prompt_len]) for s in group}) * group[0].prompt_len
        if old:
            t0 = time.perf_counter()
            (self._spec_step if self.k else self._decode_step)(old)
            dt = time.perf_counter() - t0
            st.decode_steps += 1
            st.decode_s += dt
            st.recent_steps.append((len(old), dt))
        running = sorted((s for s in live if s.finish is None and not s.aborted), key=lambda s: s.slot)
        self._running = running  # before delivering, so a caller woken by its result sees the counts
        for s in live:
            if s.finish is not None or s.aborted:
                s.finish = s.finish or "abort"
                self._release(s)

    def _apply_update(self, state_dict: dict, version: int | None, fut: Future) -> None:
        try:
            params = self.model.state_dict()
            with torch.no_grad():
                for name, t in state_dict.items():
                    params[name].copy_(t)
            self._fwd.refresh()
            self.policy_version = self.policy_version + 1 if version is None else int(version)
            fut.set_result(self.policy_version)
        except Exception as e:
            fut.set_exception(e)

    # ---- forward passes -----------------------------------------------------------------

    def _prefill(self, group: list[_Seq]) -> None:
        """Prefill prompts of one length; identical prompts once, then copy their keys/values."""
        P = group[0].prompt_len
        reps: dict[tuple[int, ...], int] = {}
        rep_of = [reps.setdefault(tuple(s.tokens), len(reps)) for s in group]
        rep_seqs = [group[rep_of.index(r)] for r in range(len(reps))]
        prompt_RP = torch.tensor([s.tokens for s in rep_seqs], device=self.device)
        rep_slots_R = torch.tensor([s.slot for s in rep_seqs], device=self.device)
        want = any(s.wants_experts for s in group)
        out = self._fwd(prompt_RP, rep_slots_R, logits="last", want_experts=want)
        self.cache.advance(rep_slots_R, P)
        W = self._windows.shape[2]
        if self.k:
            upto = P - min(P, W)
            speculative.prefill_mtp(self._fwd.mtp_step, self.cache, rep_slots_R, out.hidden, prompt_RP, self.k, upto)
        for s, r in zip(group, rep_of):
            src = rep_seqs[r].slot
            if s.slot != src:  # all cache layers (main and MTP), the prompt's positions
                self.cache.k[:, s.slot, :, :P] = self.cache.k[:, src, :, :P]
                self.cache.v[:, s.slot, :, :P] = self.cache.v[:, src, :, :P]
                self.cache.lengths[s.slot] = P
        idx_B = torch.tensor(rep_of, device=self.device)
        logits_BV = out.logits[idx_B]
        experts = out.routed_experts[idx_B].cpu().numpy() if want else None
        tokens, logprobs = self._sample(logits_BV, group)
        for b, s in enumerate(group):
            if experts is not None:
                s.prompt_experts = experts[b]
            self._extend(s, [tokens[b]], [logprobs[b]], experts[b, -1:] if experts is not None else None)
        if self.k:
            m = min(P, W)
            slots_B = torch.tensor([s.slot for s in group], device=self.device)
            self._windows[slots_B, 0, W - m:] = out.hidden[idx_B, P - m:]
            self._draft([s for s in group if s.finish is None])

    def _decode_step(self, seqs: list[_Seq]) -> None:
        slots = [s.slot for s in seqs]
        ids_B = torch.tensor([s.tokens[-1] for s in seqs], device=self.device)
        want = any(s.wants_experts for s in seqs)
        out = self._fwd(ids_B[:, None], torch.tensor(slots, device=self.device), logits="all", want_experts=want)
        self.cache.lengths[slots] += 1
        tokens, logprobs = self._sample(out.logits[:, 0], seqs)
        experts = out.routed_experts[:, 0].cpu().numpy() if want else None
        for b, s in enumerate(seqs):
            self._extend(s, [tokens[b]], [logprobs[b]], experts[b:b + 1] if experts is not None else None)

    def _spec_step(self, seqs: list[_Seq]) -> None:
        """Verify every row's k drafts in one [B, k+1] forward, accept, then draft again."""
        W = self._windows.shape[2]
        if all(s.greedy and not s.processed and len(s.tokens) >= W for s in seqs):
            return self._spec_step_greedy(seqs)
        k, B = self.k, len(seqs)
        slots_B = torch.tensor([s.slot for s in seqs], device=self.device)
        ids_BJ = torch.tensor([[s.tokens[-1]] + s.drafts for s in seqs], device=self.device)
        drafts_Bk = ids_BJ[:, 1:]
        want = any(s.wants_experts for s in seqs)
        out = self._fwd(ids_BJ, slots_B, logits="all", want_experts=want)
        logits_BJV = out.logits.float()
        p_BJV = None
        if any(s.processed for s in seqs) or not all(s.greedy for s in seqs):
            p_BJV = self._probs(logits_BJV.flatten(0, 1), seqs, repeat=k + 1).view(B, k + 1, -1)
        lps = None
        if all(s.greedy for s in seqs):
            target_N, lp_N = greedy(logits_BJV.flatten(0, 1))
            n_B, final_B = speculative.accept_greedy(target_N.view(B, k + 1), drafts_Bk)
            lps = lp_N.view(B, k + 1).tolist()  # every emitted token is its position's argmax
        else:
            q_BkV = torch.stack([s.q_kV if s.q_kV is not None
                                 else torch.zeros(k, self.vocab_size, device=self.device).scatter_(
                                     -1, torch.tensor(s.drafts, device=self.device)[:, None], 1.0)
                                 for s in seqs])
            u_BJ = torch.tensor([[0.5] * (k + 1) if s.greedy else [s.rng.random() for _ in range(k + 1)]
                                 for s in seqs], dtype=torch.float64, device=self.device)
            n_B, final_B = speculative.accept(p_BJV, q_BkV, drafts_Bk, u_BJ[:, :k], u_BJ[:, k])
        out_BJ = torch.cat([drafts_Bk, torch.zeros_like(drafts_Bk[:, :1])], dim=1)
        out_BJ.scatter_(1, n_B[:, None], final_B[:, None])
        if lps is None:
            lps = token_logprobs(logits_BJV.flatten(0, 1), out_BJ.flatten()).view(B, k + 1).tolist()
        if p_BJV is not None and any(s.processed for s in seqs):
            plps = p_BJV.gather(-1, out_BJ[..., None]).squeeze(-1).log().tolist()
            lps = [plps[b] if s.processed else lps[b] for b, s in enumerate(seqs)]
        self.cache.advance(slots_B, n_B + 1)
        self._windows[slots_B, 0] = speculative.shift_hidden(self._windows[slots_B, 0], out.hidden, n_B)
        experts = out.routed_experts.cpu().numpy() if want else None
        n, toks = n_B.tolist(), out_BJ.tolist()
        for b, s in enumerate(seqs):
            self._accept(s, n[b], toks[b], lps[b], experts[b] if experts is not None else None)
        self._draft([s for s in seqs if s.finish is None])

    def _spec_step_greedy(self, seqs: list[_Seq]) -> None:
        """_spec_step for greedy rows whose windows are full: the whole step in one call of the
        forward backend (Forward.spec_greedy: the C++ kernels do verify, accept and draft)."""
        W = self._windows.shape[2]
        want = any(s.wants_experts for s in seqs)
        r = self._fwd.spec_greedy(torch.tensor([[s.tokens[-1]] + s.drafts for s in seqs], device=self.device),
                                  torch.tensor([s.slot for s in seqs], device=self.device),
                                  torch.tensor([s.tokens[-W:] for s in seqs], device=self.device), self._windows, want)
        n, toks, lps, drafts = r.accepted.tolist(), r.tokens.tolist(), r.logprobs.tolist(), r.drafts.tolist()
        experts = r.routed_experts.cpu().numpy() if want else None
        for b, s in enumerate(seqs):
            self._accept(s, n[b], toks[b], lps[b], experts[b] if experts is not None else None)
            s.drafts, s.q_kV = drafts[b], None

    def _accept(self, s: _Seq, n: int, toks: list[int], lps: list[float], experts) -> None:
        """Extend s by its n accepted drafts and the token after them; count the acceptance."""
        s.spec_accepted += n
        s.spec_proposed += self.k
        self.stats.spec_accepted += n
        self.stats.spec_proposed += self.k
        self._extend(s, toks[:n + 1], lps[:n + 1], experts[:n + 1] if experts is not None else None)

    def _draft(self, seqs: list[_Seq]) -> None:
        """Draft k tokens for each sequence (speculative.draft), in groups of one window size;
        every depth's hiddens over the window are kept for the greedy fast path."""
        W = self._windows.shape[2]
        groups: dict[int, list[_Seq]] = {}
        for s in seqs:
            groups.setdefault(min(W, len(s.tokens) - 1), []).append(s)
        for T, group in groups.items():
            slots_B = torch.tensor([s.slot for s in group], device=self.device)
            next_BT = torch.tensor([s.tokens[-T:] for s in group], device=self.device)
            hidden_BTD = self._windows[slots_B, 0, W - T:]
            greedy = all(s.greedy for s in group)

            def sampler(logits_BV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
                if greedy:
                    return logits_BV.argmax(-1), None
                q_BV = self._probs(logits_BV, group)
                u_B = torch.tensor([0.5 if s.greedy else s.rng.random() for s in group], dtype=torch.float64,
                                   device=self.device)
                return sample(q_BV, u_B), q_BV

            drafts_Bk, q_BkV, hs = speculative.draft(self._fwd.mtp_step, self.cache, slots_B, hidden_BTD, next_BT,
                                                     self.k, sampler)
            for d, h_BTD in enumerate(hs[:-1], start=1):
                self._windows[slots_B, d, W - T:] = h_BTD
            for b, (s, d) in enumerate(zip(group, drafts_Bk.tolist())):
                s.drafts, s.q_kV = d, (None if q_BkV is None else q_BkV[b])

    # ---- sampling -----------------------------------------------------------------------

    def _probs(self, logits_NV: torch.Tensor, seqs: list[_Seq], repeat: int = 1) -> torch.Tensor:
        """sampling_probs with each sequence's parameters (rows: seqs, each `repeat` times)."""
        sp = [s.request.sampling for s in seqs]
        t = torch.tensor([p.temperature for p in sp], device=self.device).repeat_interleave(repeat)
        top_p = torch.tensor([p.top_p for p in sp], device=self.device).repeat_interleave(repeat)
        top_k = torch.tensor([p.top_k for p in sp], device=self.device).repeat_interleave(repeat)
        return sampling_probs(logits_NV, t, top_p, top_k)

    def _sample(self, logits_BV: torch.Tensor, seqs: list[_Seq]) -> tuple[list[int], list[float]]:
        """One token per row, and its logprob (raw, or of the sampling distribution)."""
        logits_BV = logits_BV.float()
        if all(s.greedy and not s.processed for s in seqs):
            tokens_B, lp_B = greedy(logits_BV)
            return tokens_B.tolist(), lp_B.tolist()
        probs_BV = self._probs(logits_BV, seqs)
        u_B = torch.tensor([0.5 if s.greedy else s.rng.random() for s in seqs], dtype=torch.float64,
                           device=self.device)
        tokens_B = sample(probs_BV, u_B)
        raw = token_logprobs(logits_BV, tokens_B).tolist()
        proc = probs_BV.gather(-1, tokens_B[:, None]).squeeze(1).log().tolist()
        return tokens_B.tolist(), [proc[b] if s.processed else raw[b] for b, s in enumerate(seqs)]


def _prefill_groups(seqs: list[_Seq]) -> list[list[_Seq]]:
    """Prompts of equal length, in admission order, at most PREFILL_TOKENS tokens per group
    (identical prompts count once)."""
    by_len: dict[int, list[_Seq]] = {}
    for s in seqs:
        by_len.setdefault(s.prompt_len, []).append(s)
    groups = []
    for P, same in by_len.items():
        group, distinct = [], set()
        for s in same:
            key = tuple(s.tokens)
            if group and key not in distinct and (len(distinct) + 1) * P > PREFILL_TOKENS:
                groups.append(group)
                group, distinct = [], set()
            group.append(s)
            distinct.add(key)
        groups.append(group)
    return groups


def _resolve(fut, result) -> None:
    """Set a future (asyncio or concurrent) unless it was cancelled meanwhile."""
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
