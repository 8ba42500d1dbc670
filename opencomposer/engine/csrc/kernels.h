// The engine's CPU kernels, included by ops.cpp (one translation unit: compiling is mostly
// ATen's headers). native.py builds them; see its docstring for why they exist.
//
// float32 only. Each function below is also a torch op (ops.cpp registers them); "norm" arguments (a weight and eps)
// RMS-normalise the input rows first, as the model's RMSNorm (w * x / sqrt(mean(x^2) + eps)):
//   rms_norm(x [M, D], w, eps) -> [M, D]
//   linear(x [M, I], w_packed [nP, I, 16], O, bias?, residual?, norm?) -> [M, O]
//       y = x W^T (+ bias) (+ residual). W is packed in panels of 16 output features:
//       w_packed[p, i, j] = W[16p + j, i] (zero past O), so one panel is contiguous and a tile
//       of R <= 6 rows x 16 features keeps its 12 accumulators in registers while the panel
//       streams through once per R rows (BLIS's 6x16 AVX2 micro-kernel shape).
//   swiglu(x [M, I], gu_packed [nP, I, 16], F, norm?) -> silu(x Wg^T) * (x Wu^T) [M, F]
//       gate and up interleaved: lanes 0-7 of panel p are gate features 8p..8p+7, lanes 8-15
//       the same up features, so the product is formed in registers.
//   moe(x [N, D], norm?, router_packed, E, K, norm_topk_prob, gu_packed [E, nPf, D, 16],
//       down_packed [E, nPd, F8, 16], residual?) -> (residual + sum_k w_nk expert_k(h_n), experts [N, K])
//       h = norm(x); residual defaults to x. Router softmax (float32) and top-k as model.route,
//       then per expert one swiglu and one down product on the tokens routed to it (gathered
//       rows), the routing weight folded into the activations and the result added to the
//       output rows: work proportional to K, not E.
//   argmax_logprob(logits [N, V]) -> (argmax [N], its log-softmax [N]): greedy sampling.
//   inverse_cdf(probs [N, V] float32, u [N] float64) -> tokens [N]: the inverse-CDF draw of
//       sampling.sample, bit for bit its torch ops (the cumulative mass summed in double, in
//       order; the first token whose mass exceeds u times the row's total; at most V - 1).
//   attention(qkv [N, (H+2G)C], q_norm_w, k_norm_w, eps, cos [L, C], sin [L, C], k_cache,
//       v_cache [S, G, L, C], slots [B], start [B], H) -> o [N, H*C]
//       N = B*T tokens: T per row at positions start[b]..start[b]+T-1 of slot slots[b]. Per
//       head RMSNorm of q and k, RoPE (x cos + rotate_half(x) sin), keys/values written to the
//       cache, then causal softmax attention over the slot's positions 0..pos (scale 1/sqrt(C)).
//
// Vectors are GCC/Clang vector extensions (8 floats; AVX2+FMA with -march=native, split into
// narrower registers elsewhere), so the file has no intrinsics. Threads (pool.h's par_for) over
// output panels (linear, swiglu, the experts' products) and over (row, kv head) (attention).
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

typedef float v8 __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));
constexpr int PW = 16;  // panel width: output features per packed panel
constexpr int MB = 64;  // rows per block: a block's rows stay in cache while every panel passes

inline v8 splat(float a) { return v8{a, a, a, a, a, a, a, a}; }
inline v8 load(const float* p) { v8 v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }
inline float hsum(v8 v) {
  float s = 0.f;
  for (int j = 0; j < 8; ++j) s += v[j];
  return s;
}

// exp(x) = 2^n exp(r), n = round(x log2 e), r = x - n ln 2 (ln 2 in two parts), exp(r) by its
// Taylor series to degree 7 on |r| <= ln2/2 (truncation error < 1e-8 relative).
inline v8 vexp(v8 x) {
  x = x < splat(88.3f) ? x : splat(88.3f);
  x = x > splat(-87.3f) ? x : splat(-87.3f);
  const v8 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  v8 n = (x * splat(1.44269504f) + magic) - magic;
  v8 r = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
  v8 p = splat(1.f / 5040);
  p = p * r + splat(1.f / 720);
  p = p * r + splat(1.f / 120);
  p = p * r + splat(1.f / 24);
  p = p * r + splat(1.f / 6);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.f);
  p = p * r + splat(1.f);
  v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
  return p * (v8)e;
}

inline v8 vsilu(v8 g) { return g / (splat(1.f) + vexp(-g)); }

// exp of x[0..n) in place; returns the sum.
inline float exp_sum(float* x, int64_t n) {
  float s = 0.f;
  int64_t i = 0;
  v8 acc{};
  for (; i + 8 <= n; i += 8) {
    v8 e = vexp(load(x + i));
    store(x + i, e);
    acc += e;
  }
  for (; i < n; ++i) {
    x[i] = std::exp(x[i]);
    s += x[i];
  }
  return s + hsum(acc);
}

// acc[r] = x[r, :] . panel, for R rows of x (row stride ldx) and one packed panel [I, 16].
// U interleaved partial sums over i: with few rows (R <= 3) the 2R accumulators alone cannot
// cover the FMA latency (2 pipes x 4 cycles wants 8 chains), so U sets of them take turns.
template <int R, int U>
inline void tile(const float* x, int64_t ldx, const float* w, int64_t I, v8 (&a0)[R], v8 (&a1)[R]) {
  v8 c0[U][R], c1[U][R];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) c0[u][r] = c1[u][r] = v8{};
  int64_t i = 0;
  for (; i + U <= I; i += U) {
    // The weights stream from memory once: ask for them two panels (32 KB at I = 256) ahead
    // (one panel ahead measured 5-20% slower per batch-16 step at 2 threads).
    __builtin_prefetch(w + (i + 512) * PW, 0, 0);
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      v8 b0 = load(w + (i + u) * PW), b1 = load(w + (i + u) * PW + 8);
#if defined(__x86_64__)
      asm("" : "+x"(b0), "+x"(b1));  // keep both in registers (GCC otherwise re-reads b1 per row)
#endif
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const v8 a = splat(x[r * ldx + i + u]);
        c0[u][r] += a * b0;
        c1[u][r] += a * b1;
      }
    }
  }
  for (; i < I; ++i) {
    const v8 b0 = load(w + i * PW), b1 = load(w + i * PW + 8);
    for (int r = 0; r < R; ++r) {
      const v8 a = splat(x[r * ldx + i]);
      c0[0][r] += a * b0;
      c1[0][r] += a * b1;
    }
  }
  for (int r = 0; r < R; ++r) {
    a0[r] = c0[0][r];
    a1[r] = c1[0][r];
    for (int u = 1; u < U; ++u) a0[r] += c0[u][r], a1[r] += c1[u][r];
  }
}

// For rows m0..m1 of x and panels p0..p1: epi(row, panel, acc lanes 0-7, acc lanes 8-15).
template <int R, class Epi>
inline void rows_tile(const float* x, int64_t ldx, int64_t m, const float* w, int64_t I, int64_t p, Epi& epi) {
  v8 a0[R], a1[R];
  tile<R, (R == 1 ? 4 : R <= 3 ? 2 : 1)>(x + m * ldx, ldx, w, I, a0, a1);
  for (int r = 0; r < R; ++r) epi(m + r, p, a0[r], a1[r]);
}

template <class Epi>
void panels(const float* x, int64_t ldx, int64_t m0, int64_t m1, const float* wp, int64_t I, int64_t p0,
            int64_t p1, Epi& epi) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* w = wp + p * I * PW;
    int64_t m = m0;
    for (; m + 6 <= m1; m += 6) rows_tile<6>(x, ldx, m, w, I, p, epi);
    switch (m1 - m) {
      case 5: rows_tile<5>(x, ldx, m, w, I, p, epi); break;
      case 4: rows_tile<4>(x, ldx, m, w, I, p, epi); break;
      case 3: rows_tile<3>(x, ldx, m, w, I, p, epi); break;
      case 2: rows_tile<2>(x, ldx, m, w, I, p, epi); break;
      case 1: rows_tile<1>(x, ldx, m, w, I, p, epi); break;
      default: break;
    }
  }
}

// The product of M rows of x with nP packed panels, epi applied to every tile; threads split
// the panels of each block of MB rows.
template <class Epi>
void gemm(const float* x, int64_t ldx, int64_t M, const float* wp, int64_t I, int64_t nP, Epi epi) {
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t m1 = std::min(M, m0 + MB);
    const int64_t grain = std::max<int64_t>(1, nP / (4 * at::get_num_threads()));
    par_for(0, nP, grain, [&](int64_t p0, int64_t p1) { panels(x, ldx, m0, m1, wp, I, p0, p1, epi); },
            (m1 - m0) * I);
  }
}

void check_packed(const at::Tensor& x, const at::Tensor& wp, int64_t I) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && wp.scalar_type() == at::kFloat, "opencomposer kernels: float32 only");
  TORCH_CHECK(wp.is_contiguous() && wp.size(-1) == PW && wp.size(-2) == I, "opencomposer kernels: bad packed weight");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) == I, "opencomposer kernels: x must be [M, I], rows contiguous");
}

// ---- RMSNorm ------------------------------------------------------------------------------------

// y = w * (x / sqrt(mean(x^2) + eps)) per row (the model's RMSNorm), into a new [M, D] tensor.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1, "opencomposer.rms_norm: x must be float32 [M, D]");
  const int64_t M = x.size(0), D = x.size(1), ld = x.stride(0);
  at::Tensor y = at::empty({M, D}, x.options());
  at::Tensor wc = w.contiguous();
  const float *xp = x.data_ptr<float>(), *wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = xp + m * ld;
    float* yr = yp + m * D;
    v8 acc{};
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) acc += load(xr + d) * load(xr + d);
    float ss = hsum(acc);
    for (; d < D; ++d) ss += xr[d] * xr[d];
    const float inv = 1.f / std::sqrt(ss / D + (float)eps);
    for (d = 0; d + 8 <= D; d += 8) store(yr + d, load(wp + d) * (load(xr + d) * splat(inv)));
    for (; d < D; ++d) yr[d] = wp[d] * (xr[d] * inv);
  }
  return y;
}

// x, or its rows RMS-normed when a norm weight is given (the ops below take the block's norm).
at::Tensor maybe_norm(const at::Tensor& x, const c10::optional<at::Tensor>& norm_w, double eps) {
  return norm_w.has_value() ? rms_norm(x, *norm_w, eps) : x;
}

// ---- linear ---------------------------------------------------------------------------------

at::Tensor linear(const at::Tensor& x_in, const at::Tensor& wp, int64_t O, const c10::optional<at::Tensor>& bias,
                  const c10::optional<at::Tensor>& residual, const c10::optional<at::Tensor>& norm_w, double eps) {
  const at::Tensor x = maybe_norm(x_in, norm_w, eps);
  const int64_t M = x.size(0), I = x.size(1), nP = wp.size(0);
  check_packed(x, wp, I);
  TORCH_CHECK(nP * PW >= O, "opencomposer.linear: packed weight has fewer than out_features rows");
  at::Tensor y = at::empty({M, O}, x.options());
  at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor res = residual.has_value() ? residual->contiguous() : at::Tensor();
  if (res.defined()) TORCH_CHECK(res.sizes() == y.sizes(), "opencomposer.linear: residual must be [M, out_features]");
  float* yp = y.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const float* rp = res.defined() ? res.data_ptr<float>() : nullptr;
  auto epi = [&](int64_t m, int64_t p, v8 a0, v8 a1) {
    const int64_t o0 = p * PW;
    float* out = yp + m * O + o0;
    if (o0 + PW <= O) {
      if (bp) a0 += load(bp + o0), a1 += load(bp + o0 + 8);
      if (rp) a0 += load(rp + m * O + o0), a1 += load(rp + m * O + o0 + 8);
      store(out, a0);
      store(out + 8, a1);
      return;
    }
    float t[PW];
    store(t, a0);
    store(t + 8, a1);
    for (int64_t j = 0; j < O - o0; ++j) out[j] = t[j] + (bp ? bp[o0 + j] : 0.f) + (rp ? rp[m * O + o0 + j] : 0.f);
  };
  gemm(x.data_ptr<float>(), x.stride(0), M, wp.data_ptr<float>(), I, nP, epi);
  return y;
}

// ---- SwiGLU -----------------------------------------------------------------------------------

// out[m, 8p + j] = silu(gate) * up * (scale ? scale[m] : 1), for out of F columns (stride ldo).
void swiglu_into(const float* x, int64_t ldx, int64_t M, const float* gup, int64_t I, int64_t F, float* out,
                 int64_t ldo, const float* scale) {
  const int64_t nP = (F + 7) / 8;
  auto epi = [&](int64_t m, int64_t p, v8 g, v8 u) {
    v8 a = vsilu(g) * u;
    if (scale) a *= splat(scale[m]);
    float* o = out + m * ldo + 8 * p;
    if (8 * p + 8 <= F) {
      store(o, a);
    } else {
      for (int64_t j = 0; j < F - 8 * p; ++j) o[j] = a[j];
    }
  };
  gemm(x, ldx, M, gup, I, nP, epi);
}

at::Tensor swiglu(const at::Tensor& x_in, const at::Tensor& gup, int64_t F, const c10::optional<at::Tensor>& norm_w,
                  double eps) {
  const at::Tensor x = maybe_norm(x_in, norm_w, eps);
  const int64_t M = x.size(0), I = x.size(1);
  check_packed(x, gup, I);
  TORCH_CHECK(gup.size(0) * 8 >= F, "opencomposer.swiglu: packed weight has fewer than F features");
  at::Tensor y = at::empty({M, F}, x.options());
  swiglu_into(x.data_ptr<float>(), x.stride(0), M, gup.data_ptr<float>(), I, F, y.data_ptr<float>(), F, nullptr);
  return y;
}

// ---- mixture of experts -------------------------------------------------------------------------

// residual (default: x) + experts(h), h = x RMS-normed when norm_w is given, else x.
std::tuple<at::Tensor, at::Tensor> moe(const at::Tensor& x, const c10::optional<at::Tensor>& norm_w, double eps,
                                       const at::Tensor& gate_p, int64_t E, int64_t K, bool norm_topk,
                                       const at::Tensor& gu_p, const at::Tensor& dn_p,
                                       const c10::optional<at::Tensor>& residual) {
  const at::Tensor h = maybe_norm(x, norm_w, eps);
  const int64_t N = h.size(0), D = h.size(1);
  check_packed(h, gate_p, D);
  TORCH_CHECK(gu_p.dim() == 4 && gu_p.size(0) == E && gu_p.size(2) == D && gu_p.is_contiguous(),
              "opencomposer.moe: gate_up packed must be [E, nPf, D, 16]");
  TORCH_CHECK(dn_p.dim() == 4 && dn_p.size(0) == E && dn_p.size(1) * PW >= D && dn_p.is_contiguous(),
              "opencomposer.moe: down packed must be [E, nPd, F8, 16]");
  const at::Tensor& res = residual.has_value() ? *residual : x;
  TORCH_CHECK(res.sizes() == h.sizes(), "opencomposer.moe: the residual must be [N, D]");
  const int64_t F8 = dn_p.size(2), nPf = gu_p.size(1), nPd = dn_p.size(1);
  TORCH_CHECK(nPf * 8 == F8, "opencomposer.moe: gate_up and down disagree on the expert width");
  // Router: softmax over E in float32, top-K (largest first, the lower index on ties).
  at::Tensor logits = linear(h, gate_p, E, c10::nullopt, c10::nullopt, c10::nullopt, 0.);
  at::Tensor idx = at::empty({N, K}, h.options().dtype(at::kLong));
  std::vector<float> wts(N * K);
  int64_t* ip = idx.data_ptr<int64_t>();
  {
    float* lp = logits.data_ptr<float>();
    for (int64_t n = 0; n < N; ++n) {
      float* s = lp + n * E;
      const float mx = *std::max_element(s, s + E);
      for (int64_t e = 0; e < E; ++e) s[e] -= mx;
      const float z = exp_sum(s, E);
      float tot = 0.f;
      for (int64_t k = 0; k < K; ++k) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
          if (s[e] >= 0.f && (best < 0 || s[e] > s[best])) best = e;
        }
        ip[n * K + k] = best;
        wts[n * K + k] = s[best] / z;
        tot += s[best] / z;
        s[best] = -1.f;  // taken
      }
      if (norm_topk)
        for (int64_t k = 0; k < K; ++k) wts[n * K + k] /= tot;
    }
  }
  // Group the N*K (token, expert) pairs by expert, tokens in order.
  std::vector<int64_t> count(E + 1, 0), tok(N * K);
  std::vector<float> w_sorted(N * K);
  for (int64_t m = 0; m < N * K; ++m) count[ip[m] + 1]++;
  for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];
  {
    std::vector<int64_t> fill(count.begin(), count.end() - 1);
    for (int64_t m = 0; m < N * K; ++m) {
      const int64_t j = fill[ip[m]]++;
      tok[j] = m / K;
      w_sorted[j] = wts[m];
    }
  }
  at::Tensor xg = at::empty({N * K, D}, h.options());
  at::Tensor act = at::empty({N * K, F8}, h.options());
  const float* hp = h.data_ptr<float>();
  const int64_t ldh = h.stride(0);
  float* xgp = xg.data_ptr<float>();
  for (int64_t j = 0; j < N * K; ++j) std::memcpy(xgp + j * D, hp + tok[j] * ldh, D * sizeof(float));
  // Each (token, expert) pair's output in its own row of y, so that experts can run on
  // different threads; then out = residual + the K rows of each token, in expert order.
  at::Tensor y = at::empty({N * K, D}, h.options());
  float* yp = y.data_ptr<float>();
  float* ap = act.data_ptr<float>();
  const float* gup = gu_p.data_ptr<float>();
  const float* dnp = dn_p.data_ptr<float>();
  auto expert = [&](int64_t e) {
    const int64_t j0 = count[e], n = count[e + 1] - j0;
    if (n == 0) return;
    swiglu_into(xgp + j0 * D, D, n, gup + e * nPf * D * PW, D, F8, ap + j0 * F8, F8, w_sorted.data() + j0);
    auto epi = [&](int64_t m, int64_t p, v8 a0, v8 a1) {
      float* o = yp + (j0 + m) * D + p * PW;
      if (p * PW + PW <= D) {
        store(o, a0);
        store(o + 8, a1);
      } else {
        float t[PW];
        store(t, a0);
        store(t + 8, a1);
        for (int64_t c = 0; c < D - p * PW; ++c) o[c] = t[c];
      }
    };
    gemm(ap + j0 * F8, F8, n, dnp + e * nPd * F8 * PW, F8, nPd, epi);
  };
  int64_t used = 0;
  for (int64_t e = 0; e < E; ++e) used += count[e + 1] > count[e];
  if (at::get_num_threads() > 1 && used >= at::get_num_threads()) {
    par_for(0, E, 1, [&](int64_t e0, int64_t e1) {  // whole experts per piece
      for (int64_t e = e0; e < e1; ++e) expert(e);
    }, N);
  } else {
    for (int64_t e = 0; e < E; ++e) expert(e);  // threads split each product's panels
  }
  at::Tensor out = res.contiguous().clone();
  float* op = out.data_ptr<float>();
  for (int64_t j = 0; j < N * K; ++j) {
    float* o = op + tok[j] * D;
    const float* yr = yp + j * D;
    int64_t c = 0;
    for (; c + 8 <= D; c += 8) store(o + c, load(o + c) + load(yr + c));
    for (; c < D; ++c) o[c] += yr[c];
  }
  return {out, idx};
}

// ---- attention ---------------------------------------------------------------------------------

// y = rope(rmsnorm(x) * w * mult) at one position (cos, sin: that position's [C] tables).
inline void norm_rope(const float* x, const float* w, float eps, float mult, const float* cs, const float* sn,
                      int64_t C, float* y) {
  float ss = 0.f;
  for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
  const float inv = 1.f / std::sqrt(ss / C + eps);
  float t[512];
  for (int64_t c = 0; c < C; ++c) t[c] = w[c] * (x[c] * inv) * mult;
  const int64_t h = C / 2;
  for (int64_t c = 0; c < h; ++c) y[c] = t[c] * cs[c] - t[c + h] * sn[c];
  for (int64_t c = h; c < C; ++c) y[c] = t[c] * cs[c] + t[c - h] * sn[c];
}

// Lane j of the result = the sum of a[j]'s lanes (eight horizontal sums at once).
inline v8 hsum8(const v8 (&a)[8]) {
  v8 s[4], t[2];
  for (int j = 0; j < 4; ++j)
    s[j] = __builtin_shufflevector(a[2 * j], a[2 * j + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(a[2 * j], a[2 * j + 1], 1, 9, 3, 11, 5, 13, 7, 15);
  for (int j = 0; j < 2; ++j)  // lanes: a[4j..4j+3]'s sums of lanes 0-3, then of lanes 4-7
    t[j] = __builtin_shufflevector(s[2 * j], s[2 * j + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
           __builtin_shufflevector(s[2 * j], s[2 * j + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(t[0], t[1], 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(t[0], t[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

// sc[p] = q . k_p for p < P (k rows of C floats).
inline void scores(const float* q, const float* k, int64_t P, int64_t C, float* sc) {
  int64_t p = 0;
  for (; p + 8 <= P; p += 8) {
    v8 a[8] = {};
    for (int64_t c = 0; c < C; c += 8) {
      const v8 qv = load(q + c);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) a[j] += qv * load(k + (p + j) * C + c);
    }
    store(sc + p, hsum8(a));
  }
  for (; p < P; ++p) {
    v8 a{};
    for (int64_t c = 0; c < C; c += 8) a += load(q + c) * load(k + p * C + c);
    sc[p] = hsum(a);
  }
}

// o = sum_p w[p] v_p (v rows of C floats), four vectors of o in registers at a time.
inline void weighted_sum(const float* w, const float* v, int64_t P, int64_t C, float* o) {
  for (int64_t c0 = 0; c0 < C; c0 += 32) {
    const int64_t nv = std::min<int64_t>(4, (C - c0) / 8);
    v8 a[4] = {};
    for (int64_t p = 0; p < P; ++p) {
      const v8 wp = splat(w[p]);
      for (int j = 0; j < nv; ++j) a[j] += wp * load(v + p * C + c0 + 8 * j);
    }
    for (int j = 0; j < nv; ++j) store(o + c0 + 8 * j, a[j]);
  }
}

// Many query rows (prefill): per chunk of kChunkT tokens the r heads' queries [Q = kChunkT*r, C]
// against the keys they can see, as two products on the micro-kernel: S = Q K^T (K packed as
// the "weight", keys as output features), a masked softmax per row, O = S V (V^T packed).
constexpr int64_t kGemmAttentionT = 16;
constexpr int64_t kChunkT = 32;

void attend_chunks(const float* qkv_b, int64_t row, int64_t H, int64_t g, int64_t r, const float* qw, float eps,
                   float scale, const float* cp, const float* sp, const float* kbase, const float* vbase,
                   int64_t start, int64_t T, int64_t C, float* out_b) {
  const int64_t Pmax = start + T, nPk = (Pmax + PW - 1) / PW, nPv = (C + PW - 1) / PW;
  // K packed: kp[p, c, j] = K[16p + j, c]; V^T packed: vp[pc, i, j] = V[i, 16pc + j] (zero-padded).
  std::vector<float> kp(nPk * C * PW, 0.f), vp(nPv * Pmax * PW, 0.f);
  for (int64_t i = 0; i < Pmax; ++i)
    for (int64_t c = 0; c < C; ++c) {
      kp[((i / PW) * C + c) * PW + i % PW] = kbase[i * C + c];
      vp[((c / PW) * Pmax + i) * PW + c % PW] = vbase[i * C + c];
    }
  std::vector<float> q(kChunkT * r * C), sc(kChunkT * r * nPk * PW), o(kChunkT * r * C);
  for (int64_t t0 = 0; t0 < T; t0 += kChunkT) {
    const int64_t nt = std::min(kChunkT, T - t0), Q = nt * r, P = start + t0 + nt;  // keys this chunk sees
    const int64_t ldS = (P + PW - 1) / PW * PW;
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t pos = start + t0 + t;
      for (int64_t j = 0; j < r; ++j)
        norm_rope(qkv_b + (t0 + t) * row + (g * r + j) * C, qw, eps, scale, cp + pos * C, sp + pos * C, C,
                  q.data() + (t * r + j) * C);
    }
    float* S = sc.data();
    auto s_epi = [&](int64_t m, int64_t p, v8 a0, v8 a1) {
      store(S + m * ldS + p * PW, a0);
      store(S + m * ldS + p * PW + 8, a1);
    };
    gemm(q.data(), C, Q, kp.data(), C, ldS / PW, s_epi);
    for (int64_t m = 0; m < Q; ++m) {  // causal softmax: query t sees keys 0..start+t0+t
      float* srow = S + m * ldS;
      const int64_t n = start + t0 + m / r + 1;
      const float mx = *std::max_element(srow, srow + n);
      for (int64_t i = 0; i < n; ++i) srow[i] -= mx;
      const float inv = 1.f / exp_sum(srow, n);
      for (int64_t i = 0; i < n; ++i) srow[i] *= inv;
      std::fill(srow + n, srow + ldS, 0.f);
    }
    float* O = o.data();
    auto o_epi = [&](int64_t m, int64_t p, v8 a0, v8 a1) {
      float t16[PW];
      store(t16, a0);
      store(t16 + 8, a1);
      for (int64_t j = 0; j < PW && p * PW + j < C; ++j) O[m * C + p * PW + j] = t16[j];
    };
    // The first P rows of each V^T panel: a panel has Pmax rows, the product reads P of them.
    for (int64_t pc = 0; pc < nPv; ++pc) {
      auto epi = [&](int64_t m, int64_t, v8 a0, v8 a1) { o_epi(m, pc, a0, a1); };
      gemm(S, ldS, Q, vp.data() + pc * Pmax * PW, P, 1, epi);
    }
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t j = 0; j < r; ++j)
        std::memcpy(out_b + (t0 + t) * H * C + (g * r + j) * C, O + (t * r + j) * C, C * sizeof(float));
  }
}

at::Tensor attention(const at::Tensor& qkv, const at::Tensor& qn_w, const at::Tensor& kn_w, double eps,
                     const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                     const at::Tensor& slots, const at::Tensor& start, int64_t H) {
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat, "opencomposer.attention: float32 only");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && qkv.is_contiguous(), "opencomposer.attention: contiguous inputs");
  const int64_t S = k_cache.size(0), G = k_cache.size(1), L = k_cache.size(2), C = k_cache.size(3);
  const int64_t B = slots.size(0), N = qkv.size(0), T = N / B, r = H / G;
  TORCH_CHECK(N == B * T && qkv.size(1) == (H + 2 * G) * C && C <= 512 && C % 8 == 0,
              "opencomposer.attention: qkv must be [B*T, (H+2G)C], C a multiple of 8");
  const int64_t* sl = slots.data_ptr<int64_t>();
  const int64_t* st = start.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(sl[b] >= 0 && sl[b] < S && st[b] >= 0 && st[b] + T <= L, "opencomposer.attention: position out of the cache");
  at::Tensor o = at::empty({N, H * C}, qkv.options());
  const float *qp = qkv.data_ptr<float>(), *qw = qn_w.data_ptr<float>(), *kw = kn_w.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>(), *out = o.data_ptr<float>();
  const int64_t row = (H + 2 * G) * C;
  const float scale = 1.f / std::sqrt((float)C);
  const float feps = (float)eps;
  const int64_t last = *std::max_element(st, st + B) + T;  // the policy's shape: T and the context / 64
  par_for(0, B * G, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> sc(L + 8), q(C);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / G, g = i % G;
      float* kbase = kc + ((sl[b] * G + g) * L) * C;
      float* vbase = vc + ((sl[b] * G + g) * L) * C;
      for (int64_t t = 0; t < T; ++t) {  // this row's new keys and values first (causal within T)
        const int64_t n = b * T + t, pos = st[b] + t;
        norm_rope(qp + n * row + (H + g) * C, kw, feps, 1.f, cp + pos * C, sp + pos * C, C, kbase + pos * C);
        std::memcpy(vbase + pos * C, qp + n * row + (H + G + g) * C, C * sizeof(float));
      }
      if (T >= kGemmAttentionT) {
        attend_chunks(qp + b * T * row, row, H, g, r, qw, feps, scale, cp, sp, kbase, vbase, st[b], T, C,
                      out + b * T * H * C);
        continue;
      }
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = b * T + t, pos = st[b] + t, P = pos + 1;
        for (int64_t hh = g * r; hh < (g + 1) * r; ++hh) {
          norm_rope(qp + n * row + hh * C, qw, feps, scale, cp + pos * C, sp + pos * C, C, q.data());
          scores(q.data(), kbase, P, C, sc.data());
          const float mx = *std::max_element(sc.begin(), sc.begin() + P);
          for (int64_t p = 0; p < P; ++p) sc[p] -= mx;
          const float inv = 1.f / exp_sum(sc.data(), P);
          for (int64_t p = 0; p < P; ++p) sc[p] *= inv;
          weighted_sum(sc.data(), vbase, P, C, out + n * H * C + hh * C);
        }
      }
    }
  }, T << 24 | last >> 6);
  return o;
}

// ---- greedy sampling -----------------------------------------------------------------------------

// Per row: the argmax (the first on ties, as torch.argmax) and its log-softmax, -log sum exp(l - max).
std::tuple<at::Tensor, at::Tensor> argmax_logprob(const at::Tensor& logits_in) {
  const at::Tensor logits = logits_in.contiguous();
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2, "opencomposer.argmax_logprob: float32 [N, V]");
  const int64_t N = logits.size(0), V = logits.size(1);
  at::Tensor idx = at::empty({N}, logits.options().dtype(at::kLong));
  at::Tensor lp = at::empty({N}, logits.options());
  const float* l = logits.data_ptr<float>();
  int64_t* ip = idx.data_ptr<int64_t>();
  float* out = lp.data_ptr<float>();
  par_for(0, N, 1, [&](int64_t n0, int64_t n1) {
    std::vector<float> buf(V);
    for (int64_t n = n0; n < n1; ++n) {
      const float* r = l + n * V;
      float mx = r[0];
      int64_t v = 0;
      if (V >= 8) {
        v8 m = load(r);
        for (v = 8; v + 8 <= V; v += 8) {
          const v8 x = load(r + v);
          m = x > m ? x : m;
        }
        for (int j = 0; j < 8; ++j) mx = std::max(mx, m[j]);
      }
      for (; v < V; ++v) mx = std::max(mx, r[v]);
      int64_t best = 0;  // the first index holding the maximum
      while (best < V - 1 && r[best] != mx) ++best;
      for (int64_t v = 0; v < V; ++v) buf[v] = r[v] - mx;
      ip[n] = best;
      out[n] = -std::log(exp_sum(buf.data(), V));
    }
  }, V);
  return {idx, lp};
}

// ---- sampling ----------------------------------------------------------------------------------

// sampling.sample's torch ops are probs.double().cumsum(-1) (a sequential sum per row, in
// double), x = u * the last sum, searchsorted(right=True) (the first index whose sum exceeds
// x) and a clamp to V - 1: the same sums in the same order give the same token, without the
// [N, V] double copy and cumsum. Rows are summed four at a time, each on its own chain (the
// order within a row is unchanged).
at::Tensor inverse_cdf(const at::Tensor& probs_in, const at::Tensor& u_in) {
  const at::Tensor probs = probs_in.contiguous(), u = u_in.contiguous();
  TORCH_CHECK(probs.scalar_type() == at::kFloat && probs.dim() == 2 && u.scalar_type() == at::kDouble &&
                  u.dim() == 1 && u.size(0) == probs.size(0) && probs.size(1) > 0,
              "opencomposer.inverse_cdf: probs float32 [N, V > 0] and u float64 [N]");
  const int64_t N = probs.size(0), V = probs.size(1);
  at::Tensor tokens = at::empty({N}, probs.options().dtype(at::kLong));
  const float* p = probs.data_ptr<float>();
  const double* up = u.data_ptr<double>();
  int64_t* out = tokens.data_ptr<int64_t>();
  par_for(0, N, 4, [&](int64_t n0, int64_t n1) {
    std::vector<double> cdf(4 * V);
    for (int64_t n = n0; n < n1; n += 4) {
      const int64_t m = std::min<int64_t>(4, n1 - n);
      double c[4] = {0., 0., 0., 0.};
      for (int64_t v = 0; v < V; ++v)
        for (int64_t j = 0; j < m; ++j) cdf[j * V + v] = c[j] += (double)p[(n + j) * V + v];
      for (int64_t j = 0; j < m; ++j) {
        const double* row = cdf.data() + j * V;
        const double x = up[n + j] * row[V - 1];
        out[n + j] = std::min<int64_t>(std::upper_bound(row, row + V, x) - row, V - 1);
      }
    }
  }, V);
  return tokens;
}

}  // namespace
