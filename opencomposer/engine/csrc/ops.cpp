// Whole passes of the model on the kernels of kernels.h, as single torch ops, and the
// registration of every op as torch.ops.opencomposer.*.
//
//   forward(ids [N], slots [B], start [B], embed [V, D], blocks, block_ints, k_cache, v_cache
//           [X, S, G, L, C], cos, sin [L, C], norm_w, head_packed, V, H, eps, logits)
//       -> (hidden [N, D] final-normed, logits, experts [N, Y, K] int64)
//       The main model on N = B*T tokens (T per row, at positions start[b].. of slot slots[b]):
//       embedding, every block, the final norm, and logits for no row (logits = 0), the last
//       token of each row (1: [B, V]) or every token (2: [N, V]).
//   mtp(hidden [N, D], ids [N], slots, start, embed, hnorm_w, enorm_w, eh_packed, block,
//       block_ints, k_cache, v_cache, cos, sin, norm_w, head_packed, V, H, eps, logits)
//       -> (hidden [N, D], logits of each row's last token [B, V] or an empty tensor)
//       One DeepSeek-V3 MTP depth: norm(block(eh_proj([hnorm(h); enorm(emb(t))]))).
//   pool_policy(p) -> the previous policy: sets csrc/pool.h's policy (0: one chunk per thread,
//       1: pieces, always parallel, 2: pieces, adaptive from timings, 3: pieces on the CPUs
//       that other processes leave free, the default; -1 only reads it).
//   pool_stats() -> [policy, parallel regions, serial regions, back-offs, ns of back-off, times
//       a CPU was found taken, regions run on fewer threads for it, free CPUs now (0: unknown)].
//   spec_greedy(...): a whole greedy speculative step: verify, accept, and draft with only the
//       MTP positions that changed (see below).
//
// A block is kBlockTensors tensors (an empty tensor where there is none) and kBlockInts ints,
// in the order of `Block` below; NativeForward (forward.py) builds both lists.
#include <torch/library.h>

#include "kernels.h"

namespace {

constexpr int64_t kBlockTensors = 14;
constexpr int64_t kBlockInts = 6;

struct Block {
  // attention: input norm, packed [q; k; v] (+ bias), q/k head norms, packed o_proj (+ bias)
  at::Tensor n1, qkv, qkv_b, qn, kn, o, o_b;
  // MLP: post-attention norm; MoE: packed router, experts' gate/up and down; dense: gate/up, down
  at::Tensor n2, router, gu, down;
  // optional shared expert: packed gate/up, down, and its [1, D] sigmoid gate
  at::Tensor sh_gu, sh_down, sh_gate;
  int64_t cache_layer, E, K, F, sh_F;  // E = 0: a dense MLP of width F
  bool norm_topk;

  Block(at::TensorList t, at::IntArrayRef i)
      : n1(t[0]), qkv(t[1]), qkv_b(t[2]), qn(t[3]), kn(t[4]), o(t[5]), o_b(t[6]), n2(t[7]), router(t[8]),
        gu(t[9]), down(t[10]), sh_gu(t[11]), sh_down(t[12]), sh_gate(t[13]), cache_layer(i[0]), E(i[1]),
        K(i[2]), F(i[4]), sh_F(i[5]), norm_topk(i[3] != 0) {}
};

c10::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.numel() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// x + attn(norm(x)), then + mlp(norm(x)); returns the residual stream and the experts [N, K]
// (undefined for a dense block).
std::tuple<at::Tensor, at::Tensor> run_block(const at::Tensor& x, const Block& b, const at::Tensor& k_cache,
                                             const at::Tensor& v_cache, const at::Tensor& cos, const at::Tensor& sin,
                                             const at::Tensor& slots, const at::Tensor& start, int64_t H, double eps) {
  const int64_t D = x.size(1), G = k_cache.size(2), C = k_cache.size(4);
  at::Tensor qkv = linear(x, b.qkv, (H + 2 * G) * C, opt(b.qkv_b), c10::nullopt, b.n1, eps);
  at::Tensor o = attention(qkv, b.qn, b.kn, eps, cos, sin, k_cache.select(0, b.cache_layer),
                           v_cache.select(0, b.cache_layer), slots, start, H);
  at::Tensor x1 = linear(o, b.o, D, opt(b.o_b), x, c10::nullopt, 0.);
  if (b.E == 0) {
    at::Tensor act = swiglu(x1, b.gu, b.F, b.n2, eps);
    return {linear(act, b.down, D, c10::nullopt, x1, c10::nullopt, 0.), at::Tensor()};
  }
  if (b.sh_gu.numel() == 0) return moe(x1, b.n2, eps, b.router, b.E, b.K, b.norm_topk, b.gu, b.down, c10::nullopt);
  // Qwen2-MoE shared expert: x1 + sigmoid(h w_g) * shared(h), then the routed experts on top.
  at::Tensor h = rms_norm(x1, b.n2, eps);
  at::Tensor shared = linear(swiglu(h, b.sh_gu, b.sh_F, c10::nullopt, 0.), b.sh_down, D, c10::nullopt, c10::nullopt,
                             c10::nullopt, 0.);
  at::Tensor gate = linear(h, b.sh_gate, 1, c10::nullopt, c10::nullopt, c10::nullopt, 0.);
  return moe(h, c10::nullopt, 0., b.router, b.E, b.K, b.norm_topk, b.gu, b.down, x1 + at::sigmoid(gate) * shared);
}

// Logits of every row (all) or of each of the B rows' last token.
at::Tensor head_logits(const at::Tensor& h, const at::Tensor& head, int64_t V, int64_t B, bool all) {
  if (all) return linear(h, head, V, c10::nullopt, c10::nullopt, c10::nullopt, 0.);
  const int64_t T = h.size(0) / B;
  at::Tensor last = h.view({B, T, h.size(1)}).select(1, T - 1).contiguous();
  return linear(last, head, V, c10::nullopt, c10::nullopt, c10::nullopt, 0.);
}

void check_blocks(at::TensorList blocks, at::IntArrayRef ints, int64_t n) {
  TORCH_CHECK((int64_t)blocks.size() == n * kBlockTensors && (int64_t)ints.size() == n * kBlockInts,
              "opencomposer: block lists of the wrong length (forward.py builds them)");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& ids, const at::Tensor& slots,
                                                       const at::Tensor& start, const at::Tensor& embed,
                                                       at::TensorList blocks, at::IntArrayRef ints, at::Tensor k_cache,
                                                       at::Tensor v_cache, const at::Tensor& cos, const at::Tensor& sin,
                                                       const at::Tensor& norm_w, const at::Tensor& head, int64_t V,
                                                       int64_t H, double eps, int64_t logits) {
  const int64_t n = (int64_t)blocks.size() / kBlockTensors;
  check_blocks(blocks, ints, n);
  at::Tensor x = embed.index_select(0, ids);
  std::vector<at::Tensor> experts;
  for (int64_t i = 0; i < n; ++i) {
    const Block b(blocks.slice(i * kBlockTensors, kBlockTensors), ints.slice(i * kBlockInts, kBlockInts));
    at::Tensor idx;
    std::tie(x, idx) = run_block(x, b, k_cache, v_cache, cos, sin, slots, start, H, eps);
    if (idx.defined()) experts.push_back(idx);
  }
  at::Tensor h = rms_norm(x, norm_w, eps);
  at::Tensor out = logits ? head_logits(h, head, V, slots.size(0), logits == 2) : at::empty({0}, h.options());
  at::Tensor routed = experts.empty() ? at::empty({ids.size(0), 0, 0}, ids.options()) : at::stack(experts, 1);
  return {h, out, routed};
}

std::tuple<at::Tensor, at::Tensor> mtp(const at::Tensor& hidden, const at::Tensor& ids, const at::Tensor& slots,
                                       const at::Tensor& start, const at::Tensor& embed, const at::Tensor& hnorm_w,
                                       const at::Tensor& enorm_w, const at::Tensor& eh, at::TensorList block,
                                       at::IntArrayRef ints, at::Tensor k_cache, at::Tensor v_cache,
                                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& norm_w,
                                       const at::Tensor& head, int64_t V, int64_t H, double eps, bool logits) {
  check_blocks(block, ints, 1);
  const int64_t D = hidden.size(1);
  at::Tensor cat = at::cat({rms_norm(hidden, hnorm_w, eps), rms_norm(embed.index_select(0, ids), enorm_w, eps)}, 1);
  at::Tensor x = linear(cat, eh, D, c10::nullopt, c10::nullopt, c10::nullopt, 0.);
  x = std::get<0>(run_block(x, Block(block, ints), k_cache, v_cache, cos, sin, slots, start, H, eps));
  at::Tensor h = rms_norm(x, norm_w, eps);
  return {h, logits ? head_logits(h, head, V, slots.size(0), false) : at::empty({0}, h.options())};
}

// One greedy speculative step (forward.Forward.spec_greedy). Verify the J = k+1 tokens
// [pending, k drafts] of each row, accept the n drafts that equal the target argmax, advance
// the slots' lengths to L' = L + n + 1, and draft the next k tokens with the MTP depths.
//
// windows [S, k, W, D] holds, per slot and depth d (0: the main model's final hiddens, d >= 1:
// MTP depth d's outputs), the hiddens of the W newest positions; recent [B, W] the row's last W
// tokens (the pending one last). Depth d's entry at position i read token t_{i+d}, a draft when
// i + d > L: after n accepted drafts the entries i <= L + n - d are still exact, so depth d
// recomputes only its T_d = max(d, n+1) newest positions (the largest T_d of the batch for
// every row: recomputing an exact entry rewrites the same values), reading depth d-1's window
// for their inputs. Returns (target argmax [B, J], its logprobs [B, J], n [B], drafts [B, k],
// experts [B*J, Y, K]); row b emits target[b, 0..n].
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> spec_greedy(
    const at::Tensor& ids, const at::Tensor& slots, at::Tensor lengths, const at::Tensor& recent, at::Tensor windows,
    const at::Tensor& embed, at::TensorList blocks, at::IntArrayRef ints, at::TensorList mtp_blocks,
    at::IntArrayRef mtp_ints, at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& norm_w, const at::Tensor& head, int64_t V, int64_t H, double eps) {
  const int64_t B = ids.size(0), J = ids.size(1), k = J - 1;
  const int64_t W = windows.size(2), D = windows.size(3), per = kBlockTensors + 4;
  TORCH_CHECK(windows.dim() == 4 && windows.size(1) >= k && windows.is_contiguous() && recent.size(1) == W &&
                  lengths.is_contiguous() && W >= k + 1,
              "opencomposer.spec_greedy: windows must be [S, k, W >= k+1, D] and recent [B, W]");
  TORCH_CHECK((int64_t)mtp_blocks.size() >= k * per, "opencomposer.spec_greedy: fewer MTP modules than depths");
  at::Tensor h, logits, experts;
  std::tie(h, logits, experts) = forward(ids.reshape({-1}), slots, lengths.index_select(0, slots), embed, blocks,
                                         ints, k_cache, v_cache, cos, sin, norm_w, head, V, H, eps, 2);
  at::Tensor target, lp;
  std::tie(target, lp) = argmax_logprob(logits);
  target = target.view({B, J});
  at::Tensor n = at::empty({B}, ids.options());
  const int64_t *ip = ids.data_ptr<int64_t>(), *tp = target.data_ptr<int64_t>(), *sl = slots.data_ptr<int64_t>();
  const int64_t* rp = recent.data_ptr<int64_t>();
  int64_t *np = n.data_ptr<int64_t>(), *len = lengths.data_ptr<int64_t>();
  float* win = windows.data_ptr<float>();
  const int64_t nw = windows.size(1);
  auto window = [&](int64_t b, int64_t d) { return win + ((sl[b] * nw + d) * W) * D; };
  // ext[b] = the W newest tokens t_{L'-W+1} .. t_{L'}, then the drafts as they come
  std::vector<int64_t> ext(B * (W + k));
  int64_t maxn = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t a = 0;
    while (a < k && ip[b * J + a + 1] == tp[b * J + a]) ++a;
    np[b] = a;
    maxn = std::max(maxn, a);
    len[sl[b]] += a + 1;
    std::vector<int64_t> toks(rp + b * W, rp + (b + 1) * W);
    toks.insert(toks.end(), tp + b * J, tp + b * J + a + 1);
    std::copy(toks.end() - W, toks.end(), ext.begin() + b * (W + k));
    // every depth's window moves on by a + 1 positions; the main one takes the verified hiddens
    for (int64_t d = 0; d < k; ++d) {
      float* w = window(b, d);
      std::memmove(w, w + (a + 1) * D, (W - a - 1) * D * sizeof(float));
    }
    std::memcpy(window(b, 0) + (W - a - 1) * D, h.data_ptr<float>() + b * J * D, (a + 1) * D * sizeof(float));
  }
  at::Tensor drafts = at::empty({B, k}, ids.options());
  int64_t* dp = drafts.data_ptr<int64_t>();
  const at::Tensor new_len = lengths.index_select(0, slots);
  for (int64_t d = 1; d <= k; ++d) {
    const int64_t T = std::max(d, maxn + 1);
    at::Tensor h_in = at::empty({B * T, D}, h.options());
    at::Tensor tok = at::empty({B * T}, ids.options());
    for (int64_t b = 0; b < B; ++b) {
      std::memcpy(h_in.data_ptr<float>() + b * T * D, window(b, d - 1) + (W - T) * D, T * D * sizeof(float));
      for (int64_t j = 0; j < T; ++j) tok.data_ptr<int64_t>()[b * T + j] = ext[b * (W + k) + W - T + j + d - 1];
    }
    at::TensorList t = mtp_blocks.slice((d - 1) * per, per);
    at::Tensor h_out, lg;
    std::tie(h_out, lg) = mtp(h_in, tok, slots, new_len - T, embed, t[0], t[1], t[2], t.slice(3, kBlockTensors),
                              mtp_ints.slice((d - 1) * kBlockInts, kBlockInts), k_cache, v_cache, cos, sin,
                              t[3 + kBlockTensors], head, V, H, eps, true);
    const at::Tensor best = std::get<0>(argmax_logprob(lg));
    const int64_t* x = best.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      ext[b * (W + k) + W + d - 1] = dp[b * k + d - 1] = x[b];
      if (d < k)
        std::memcpy(window(b, d) + (W - T) * D, h_out.data_ptr<float>() + b * T * D, T * D * sizeof(float));
    }
  }
  return {target, lp.view({B, J}), n, drafts, experts};
}

int64_t pool_policy(int64_t p) {
  TORCH_CHECK(p >= -1 && p <= 3, "opencomposer.pool_policy: 0 (one chunk per thread), 1 (pieces, always parallel), "
              "2 (pieces, adaptive from timings), 3 (pieces on the free CPUs: the default) or -1 (read it)");
  return p < 0 ? Pool::get().stats()[0] : Pool::get().set_policy((int)p);
}

std::vector<int64_t> pool_stats() { return Pool::get().stats(); }

}  // namespace

TORCH_LIBRARY(opencomposer, m) {
  m.def("pool_policy(int policy) -> int", pool_policy);
  m.def("pool_stats() -> int[]", pool_stats);
  m.def("argmax_logprob(Tensor logits) -> (Tensor, Tensor)", argmax_logprob);
  m.def("inverse_cdf(Tensor probs, Tensor u) -> Tensor", inverse_cdf);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", rms_norm);
  m.def("linear(Tensor x, Tensor w_packed, int out_features, Tensor? bias=None, Tensor? residual=None, "
        "Tensor? norm_weight=None, float eps=0.) -> Tensor", linear);
  m.def("swiglu(Tensor x, Tensor gu_packed, int F, Tensor? norm_weight=None, float eps=0.) -> Tensor", swiglu);
  m.def("moe(Tensor x, Tensor? norm_weight, float eps, Tensor router_packed, int E, int K, bool norm_topk_prob, "
        "Tensor gu_packed, Tensor down_packed, Tensor? residual=None) -> (Tensor, Tensor)", moe);
  m.def("attention(Tensor qkv, Tensor q_norm_w, Tensor k_norm_w, float eps, Tensor cos, Tensor sin, "
        "Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots, Tensor start, int H) -> Tensor", attention);
  m.def("forward(Tensor ids, Tensor slots, Tensor start, Tensor embed, Tensor[] blocks, int[] block_ints, "
        "Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cos, Tensor sin, Tensor norm_w, Tensor head, int V, int H, "
        "float eps, int logits) -> (Tensor, Tensor, Tensor)", forward);
  m.def("mtp(Tensor hidden, Tensor ids, Tensor slots, Tensor start, Tensor embed, Tensor hnorm_w, Tensor enorm_w, "
        "Tensor eh, Tensor[] block, int[] block_ints, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cos, "
        "Tensor sin, Tensor norm_w, Tensor head, int V, int H, float eps, bool logits) -> (Tensor, Tensor)", mtp);
  m.def("spec_greedy(Tensor ids, Tensor slots, Tensor(a!) lengths, Tensor recent, Tensor(b!) hist, Tensor embed, "
        "Tensor[] blocks, int[] block_ints, Tensor[] mtp_blocks, int[] mtp_ints, Tensor(c!) k_cache, "
        "Tensor(d!) v_cache, Tensor cos, Tensor sin, Tensor norm_w, Tensor head, int V, int H, float eps) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)", spec_greedy);
}
