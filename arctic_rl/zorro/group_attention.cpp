// ZoRRo Inference on CPU: decode attention of a block of R query rows over S keys, fp32, returning
// the output and the log-sum-exp (for merge_attention_states). Built by group_attention.py.
//
// Why not torch's CPU flash kernel: the cascade prefix pass is R = G x (H/K) rows (16 at G 16) over
// thousands of keys per KV head. That is compute-bound here, and the flash kernel's 16-row GEMMs run
// at ~60 GFLOP/s where this machine's sgemm reaches ~185. This kernel keeps the R rows in the lanes
// of one vector register (16 fp32), so a 16-key tile of scores, its softmax and its P.V update are
// all register-resident and every FLOP is a full-width FMA; the max and sum over keys of the online
// softmax become element-wise ops across registers (no horizontal reductions).
//
// Layout: element (b, h, r, d) of q at q + b*q_sb + h*q_sh + r*q_sr + d (d contiguous), likewise
// (b, h, s, d) of k and v, and of out with out_sr = D; lse (b, h, r) at lse + (b*H + h)*R + r.
// Head h of the query reads KV head h (the caller folds GQA into R).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int W = 16;  // rows per register, keys per tile
typedef float vf __attribute__((vector_size(W * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(W * sizeof(int32_t))));

inline vf splat(float x) { return x - vf{}; }  // x - 0 folds to a broadcast (x + 0 would not: -0.0)
inline vf vmax(vf a, vf b) { return a > b ? a : b; }

// exp(x) to ~1 ulp for x in [-87.3, 88.3] (clamped below: exp of a masked or -inf score is ~1e-38,
// and it only ever multiplies state that is still 0). Cody-Waite reduction, degree-6 polynomial.
inline vf vexp(vf x) {
  x = vmax(x, splat(-87.3f));
  x = x < splat(88.3f) ? x : splat(88.3f);
  vf n = x * splat(1.44269504088896341f);
  n = __builtin_convertvector(__builtin_convertvector(n + (n >= splat(0.f) ? splat(0.5f) : splat(-0.5f)), vi), vf);
  vf r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
  vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf two_n;
  __builtin_memcpy(&two_n, &e, sizeof(vf));
  return p * two_n;
}

struct Args {
  const float *q, *k, *v;
  float *out, *lse;
  int64_t B, H, R, S, D;
  int64_t q_sb, q_sh, q_sr, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh;
  float scale;
};

// One (b, h, chunk of up to 16 rows) item: stream the S keys once in tiles of 16.
void item(const Args& a, int64_t b, int64_t h, int64_t r0, vf* qt, vf* ot) {
  const int64_t D = a.D, nr = std::min<int64_t>(W, a.R - r0);
  const float* q = a.q + b * a.q_sb + h * a.q_sh + r0 * a.q_sr;
  for (int64_t d = 0; d < D; ++d) {  // rows into lanes, pre-scaled: qt[d][r] = q[r][d] * scale
    vf x = {};
    for (int64_t r = 0; r < nr; ++r) x[r] = q[r * a.q_sr + d] * a.scale;
    qt[d] = x;
    ot[d] = vf{};
  }
  const float* kb = a.k + b * a.k_sb + h * a.k_sh;
  const float* vb = a.v + b * a.v_sb + h * a.v_sh;
  vf m = splat(-INFINITY), l = {};
  for (int64_t t0 = 0; t0 < a.S; t0 += W) {
    const int nt = (int)std::min<int64_t>(W, a.S - t0);
    vf s[W];
    for (int j = 0; j < W; ++j) s[j] = vf{};
    if (t0 + 2 * W <= a.S) {  // the tile after this one, so its K and V stream in behind this one's math
      for (int j = 0; j < W; ++j) {
        const float* kn = kb + (t0 + W + j) * a.k_ss;
        const float* vn = vb + (t0 + W + j) * a.v_ss;
        for (int64_t d = 0; d < D; d += 16) {
          __builtin_prefetch(kn + d);
          __builtin_prefetch(vn + d);
        }
      }
    }
    if (nt == W) {
      for (int64_t d = 0; d < D; ++d) {
        const vf qd = qt[d];
        const float* kd = kb + t0 * a.k_ss + d;
#pragma GCC unroll 16
        for (int j = 0; j < W; ++j) s[j] += splat(kd[j * a.k_ss]) * qd;
      }
    } else {
      for (int64_t d = 0; d < D; ++d)
        for (int j = 0; j < nt; ++j) s[j] += splat(kb[(t0 + j) * a.k_ss + d]) * qt[d];
    }
    vf mt = s[0];
    for (int j = 1; j < nt; ++j) mt = vmax(mt, s[j]);
    const vf mn = vmax(m, mt), alpha = vexp(m - mn);
    vf sum = {};
    for (int j = 0; j < nt; ++j) {
      s[j] = vexp(s[j] - mn);
      sum += s[j];
    }
    l = l * alpha + sum;
    m = mn;
    if (nt == W) {
      // Eight output columns at a time: eight independent FMA chains (one chain of 16 would stall
      // on FMA latency), each reading its V column from the 16 rows of the tile.
      int64_t d = 0;
      for (; d + 8 <= D; d += 8) {
        vf o[8];
        for (int c = 0; c < 8; ++c) o[c] = ot[d + c] * alpha;
        const float* vd = vb + t0 * a.v_ss + d;
#pragma GCC unroll 16
        for (int j = 0; j < W; ++j) {
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) o[c] += splat(vd[j * a.v_ss + c]) * s[j];
        }
        for (int c = 0; c < 8; ++c) ot[d + c] = o[c];
      }
      for (; d < D; ++d) {
        vf o = ot[d] * alpha;
        for (int j = 0; j < W; ++j) o += splat(vb[(t0 + j) * a.v_ss + d]) * s[j];
        ot[d] = o;
      }
    } else {
      for (int64_t d = 0; d < D; ++d) {
        vf o = ot[d] * alpha;
        for (int j = 0; j < nt; ++j) o += splat(vb[(t0 + j) * a.v_ss + d]) * s[j];
        ot[d] = o;
      }
    }
  }
  float* o = a.out + b * a.o_sb + h * a.o_sh + r0 * D;
  const vf inv = splat(1.0f) / l;
  for (int64_t d = 0; d < D; ++d) {
    const vf x = ot[d] * inv;
    for (int64_t r = 0; r < nr; ++r) o[r * D + d] = x[r];
  }
  float* ls = a.lse + (b * a.H + h) * a.R + r0;
  for (int64_t r = 0; r < nr; ++r) ls[r] = m[r] + std::log(l[r]);
}

}  // namespace

extern "C" int zorro_group_attention(const float* q, const float* k, const float* v, float* out, float* lse,
                                     int64_t B, int64_t H, int64_t R, int64_t S, int64_t D,
                                     int64_t q_sb, int64_t q_sh, int64_t q_sr, int64_t k_sb, int64_t k_sh,
                                     int64_t k_ss, int64_t v_sb, int64_t v_sh, int64_t v_ss, int64_t o_sb,
                                     int64_t o_sh, float scale, int threads) {
  if (B < 1 || H < 1 || R < 1 || S < 1 || D < 1 || threads < 1) return 1;
  const Args a{q, k, v, out, lse, B, H, R, S, D, q_sb, q_sh, q_sr, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh,
               scale};
  const int64_t chunks = (R + W - 1) / W, items = B * H * chunks;
  // OpenMP, not std::thread: this library links the libgomp torch has loaded, so it runs on torch's
  // own worker threads (fresh threads would compete with them while they spin after a torch op).
#pragma omp parallel num_threads(threads)
  {
    std::vector<vf> buf(2 * D);  // qt, ot: 2 x D x 64 B, L1-resident for D <= 128
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; ++i) {
      const int64_t c = i % chunks, bh = i / chunks;
      item(a, bh / H, bh % H, c * W, buf.data(), buf.data() + D);
    }
  }
  return 0;
}
