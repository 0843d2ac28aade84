// recal_rows.cc — decoding whose result for a row cannot depend on the other
// rows of the call, whatever BLAS library, BLAS kernel or thread count runs
// underneath: the extend path of float32 policies on the CPU.
//
// Why it is needed. A rollout's log-probs are the ratio's denominator in the
// loss, and which rows share a decode call depends on when pool replies
// arrive, on the number of data-parallel ranks and on the rollout workers.
// Through BLAS, a row's bits depend on where it lands in the product:
// OpenBLAS's Haswell/Zen SGEMM (sgemm_kernel_8x4_haswell_2.c, used by both
// core types) cuts the columns of a product into panels of 12, then 8, 4, 2
// and 1; its 4-column micro-kernel keeps two accumulators per element (even
// and odd k) and adds them at the end, its 6-column halves of the 12-panel
// one accumulator or two depending on the row tile, so one dot product comes
// out with different roundings in different panels (in a product of 16 rows,
// rows 0-5, 6-11 and 12-15 each round their own way). Which kernel runs
// depends on the CPU and on OPENBLAS_CORETYPE, the panel split on the
// product's shape, the thread split on the thread count.
//
// How this file removes the dependence: every product is computed here, by
// code whose arithmetic for one output element is fixed by construction.
// A dot product over k runs in 8 lanes (lane l accumulates k ≡ l mod 8 with
// fused multiply-adds, in increasing k; a short last chunk reads zeros) and
// the lanes are added in one fixed tree. The AVX2 path and the portable
// path perform exactly these operations (a fused multiply-add is exactly
// rounded wherever it runs), and tiles, row blocks and threads only decide
// which elements are computed together, never how one is computed. The
// same holds for the other reductions (norms, softmax sums, logsumexp) and
// for exp, which is a polynomial of our own here (libm's and libtorch's
// vectorised exp differ in the last bit between their scalar and vector
// loops, and which loop an element takes depends on the tensor's size).
// Attention runs row by row over the row's own cache. Sampling uses the
// row's own uniform draw, as before.
//
// What it does not claim: bits equal to libtorch's batched forward (the
// training forward rounds differently, as it always did; the loss's ratio
// check bounds the difference), or equal across machines with different
// libm cos/sin (rotary angles) — only independence from the other rows,
// from the BLAS and from threads.

#include "recal_internal.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace recal {
namespace {

// ---------------------------------------------------------------------------
// The arithmetic, defined once in portable code. The AVX2 versions below
// perform the same operations in the same order.

// Adds 8 lane sums in the fixed tree ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
inline float lane_total(const float l[8]) {
  float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (a0 + a2) + (a1 + a3);
}

// Σ a[k]·b[k] over K in 8 fused-multiply-add lanes.
float dot_ref(const float* a, const float* b, int64_t K) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t k = 0; k < K; k += 8)
    for (int j = 0; j < 8; j++) {
      bool in = k + j < K;
      l[j] = std::fmaf(in ? a[k + j] : 0.f, in ? b[k + j] : 0.f, l[j]);
    }
  return lane_total(l);
}

// Σ x[k] over K in 8 lanes of double (a softmax's denominator sums up to a
// full vocabulary: in float32 lanes its rounding would reach 1e-4).
float sum_ref(const float* x, int64_t K) {
  double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t k = 0; k < K; k += 8)
    for (int j = 0; j < 8; j++) l[j] = l[j] + (k + j < K ? (double)x[k + j] : 0.0);
  double a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (float)((a0 + a2) + (a1 + a3));
}

// max over K in 8 lanes, each lane keeping (v > m ? v : m) as maxps does.
float max_ref(const float* x, int64_t K) {
  const float ninf = -std::numeric_limits<float>::infinity();
  float l[8] = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf};
  for (int64_t k = 0; k < K; k += 8)
    for (int j = 0; j < 8; j++) {
      float v = k + j < K ? x[k + j] : ninf;
      l[j] = v > l[j] ? v : l[j];
    }
  float m = l[0];
  for (int j = 1; j < 8; j++) m = l[j] > m ? l[j] : m;
  return m;
}

// e^x: Cody–Waite reduction by ln 2 and Cephes' degree-6 polynomial (about
// 1 ulp). 0 below ln(FLT_MIN), +inf above ln(FLT_MAX), NaN for NaN.
constexpr float kExpLo = -87.3365447f, kExpHi = 88.7228391f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

inline float pow2i(int n) {  // 2^n for n in [-126, 127]
  uint32_t bits = (uint32_t)(n + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float exp_ref(float x) {
  float xc = std::min(std::max(x, kExpLo), kExpHi);
  float n = std::nearbyint(xc * kLog2e);
  float r = std::fmaf(-n, kLn2Hi, xc);
  r = std::fmaf(-n, kLn2Lo, r);
  float z = r * r;
  float y = std::fmaf(kP0, r, kP1);
  y = std::fmaf(y, r, kP2);
  y = std::fmaf(y, r, kP3);
  y = std::fmaf(y, r, kP4);
  y = std::fmaf(y, r, kP5);
  y = std::fmaf(y, z, r);
  y = y + 1.f;
  int ni = (int)n, n1 = ni >> 1, n2 = ni - n1;
  y = (y * pow2i(n1)) * pow2i(n2);
  if (x < kExpLo) y = 0.f;
  if (x > kExpHi) y = std::numeric_limits<float>::infinity();
  if (x != x) y = x;
  return y;
}

// ---------------------------------------------------------------------------
// AVX2 + FMA versions.

bool have_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

__attribute__((target("avx2,fma"))) inline __m256i tail_mask(int64_t left) {
  alignas(32) static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + 8 - left));
}

__attribute__((target("avx2,fma"))) inline float total8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l0+l4, l1+l5, l2+l6, l3+l7
  __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                   // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

__attribute__((target("avx2,fma"))) inline float dot_avx2(const float* a, const float* b, int64_t K) {
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
  if (k < K) {
    __m256i m = tail_mask(K - k);
    acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + k, m), _mm256_maskload_ps(b + k, m), acc);
  }
  return total8(acc);
}

__attribute__((target("avx2,fma"))) float sum_avx2(const float* x, int64_t K) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();  // lanes 0-3, 4-7
  int64_t k = 0;
  for (; k < K; k += 8) {
    __m256 v = k + 8 <= K ? _mm256_loadu_ps(x + k) : _mm256_maskload_ps(x + k, tail_mask(K - k));
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  __m256d s = _mm256_add_pd(lo, hi);  // l0+l4, l1+l5, l2+l6, l3+l7
  __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));  // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
  return (float)_mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
}

__attribute__((target("avx2,fma"))) float max_avx2(const float* x, int64_t K) {
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m = ninf;
  int64_t k = 0;
  // maxps(a, b) = a > b ? a : b, as max_ref's lanes.
  for (; k + 8 <= K; k += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + k), m);
  if (k < K) {
    __m256i mk = tail_mask(K - k);
    m = _mm256_max_ps(_mm256_blendv_ps(ninf, _mm256_maskload_ps(x + k, mk), _mm256_castsi256_ps(mk)), m);
  }
  alignas(32) float l[8];
  _mm256_store_ps(l, m);
  float r = l[0];
  for (int j = 1; j < 8; j++) r = l[j] > r ? l[j] : r;
  return r;
}

__attribute__((target("avx2,fma"))) inline __m256 pow2v(__m256i n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}

__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(kExpLo), hi = _mm256_set1_ps(kExpHi);
  __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 z = _mm256_mul_ps(r, r);
  __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(kP0), r, _mm256_set1_ps(kP1));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP2));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP3));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP4));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP5));
  y = _mm256_fmadd_ps(y, z, r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.f));
  __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  y = _mm256_mul_ps(_mm256_mul_ps(y, pow2v(n1)), pow2v(n2));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// out[i] = e^(x[i] − shift), i < K.
__attribute__((target("avx2,fma"))) void exp_shift_avx2(const float* x, float shift, float* out, int64_t K) {
  __m256 s = _mm256_set1_ps(shift);
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) _mm256_storeu_ps(out + k, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + k), s)));
  for (; k < K; k++) out[k] = exp_ref(x[k] - shift);  // exp8's lanes compute exp_ref exactly
}

// a[i] = silu(g[i]) · u[i] = g / (1 + e^−g) · u.
__attribute__((target("avx2,fma"))) void silu_mul_avx2(const float* g, const float* u, float* a, int64_t K) {
  const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 gv = _mm256_loadu_ps(g + k);
    __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, gv))));
    _mm256_storeu_ps(a + k, _mm256_mul_ps(s, _mm256_loadu_ps(u + k)));
  }
  for (; k < K; k++) a[k] = (g[k] / (1.f + exp_ref(0.f - g[k]))) * u[k];
}

// out[d] += p · v[d], d < D (one fused multiply-add per element).
__attribute__((target("avx2,fma"))) void axpy_avx2(float p, const float* v, float* out, int64_t D) {
  __m256 pv = _mm256_set1_ps(p);
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) _mm256_storeu_ps(out + d, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(out + d)));
  for (; d < D; d++) out[d] = std::fmaf(p, v[d], out[d]);
}

// Attention's two loops over a row's T cached positions (keys and values
// [T, D], contiguous), in one call each instead of one per position.
// scores: out[s] = dot_avx2(q, K_s) · scale. values: out = Σ_s (e[s]/tot)·V_s,
// one fused multiply-add per element in increasing s from +0, as axpy_avx2
// does (out kept in registers across s, 64 elements at a time): the same
// bits as the loops over dot and axpy they replace.
__attribute__((target("avx2,fma"))) void scores_avx2(const float* q, const float* K, int64_t T, int64_t D, float scale,
                                                     float* out) {
  int64_t s = 0;
  if (D % 8 == 0)  // four keys at once: four independent chains of dot_avx2's multiply-adds
    for (; s + 4 <= T; s += 4) {
      __m256 acc[4];
      _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[j] = _mm256_setzero_ps();
      for (int64_t k = 0; k < D; k += 8) {
        __m256 qv = _mm256_loadu_ps(q + k);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[j] =
            _mm256_fmadd_ps(qv, _mm256_loadu_ps(K + (s + j) * D + k), acc[j]);
      }
      _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) out[s + j] = total8(acc[j]) * scale;
    }
  for (; s < T; s++) out[s] = dot_avx2(q, K + s * D, D) * scale;
}

// J chunks of 8 elements of out from d0, each a chain over s.
template <int J>
__attribute__((target("avx2,fma"))) void values_chunks(const float* e, float tot, const float* V, int64_t T, int64_t D,
                                                       int64_t d0, float* out) {
  __m256 acc[J];
  _Pragma("GCC unroll 8") for (int j = 0; j < J; j++) acc[j] = _mm256_setzero_ps();
  for (int64_t s = 0; s < T; s++) {
    __m256 pv = _mm256_set1_ps(e[s] / tot);
    const float* v = V + s * D + d0;
    _Pragma("GCC unroll 8") for (int j = 0; j < J; j++) acc[j] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 8 * j), acc[j]);
  }
  _Pragma("GCC unroll 8") for (int j = 0; j < J; j++) _mm256_storeu_ps(out + d0 + 8 * j, acc[j]);
}

using ValuesFn = void (*)(const float*, float, const float*, int64_t, int64_t, int64_t, float*);
const ValuesFn kValues[8] = {values_chunks<1>, values_chunks<2>, values_chunks<3>, values_chunks<4>,
                             values_chunks<5>, values_chunks<6>, values_chunks<7>, values_chunks<8>};

__attribute__((target("avx2,fma"))) void values_avx2(const float* e, float tot, const float* V, int64_t T, int64_t D,
                                                     float* out) {
  int64_t d0 = 0;
  while (d0 + 8 <= D) {
    int64_t j = std::min<int64_t>(8, (D - d0) / 8);
    kValues[j - 1](e, tot, V, T, D, d0, out);
    d0 += 8 * j;
  }
  for (; d0 < D; d0++) {
    float o = 0.f;
    for (int64_t s = 0; s < T; s++) o = std::fmaf(e[s] / tot, V[s * D + d0], o);
    out[d0] = o;
  }
}

// An R×C tile of y = x·Wᵀ (+ b): R rows of x (stride ldx) against C rows of
// W (stride ldw), each element one 8-lane dot product as dot_ref's.
template <int R, int C>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, int64_t ldx, const float* W, int64_t ldw, int64_t K,
                                                   const float* b, float* y, int64_t ldy) {
  __m256 acc[R][C];
  _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 w[C];
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) w[c] = _mm256_loadu_ps(W + c * ldw + k);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
      __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
      _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(xv, w[c], acc[r][c]);
    }
  }
  if (k < K) {
    __m256i m = tail_mask(K - k);
    __m256 w[C];
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) w[c] = _mm256_maskload_ps(W + c * ldw + k, m);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
      __m256 xv = _mm256_maskload_ps(x + r * ldx + k, m);
      _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(xv, w[c], acc[r][c]);
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
      float s = total8(acc[r][c]);
      y[r * ldy + c] = b ? s + b[c] : s;
    }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t);

// Tiles of up to 4 rows × 2 outputs.
const TileFn kTiles[4][2] = {{tile_avx2<1, 1>, tile_avx2<1, 2>},
                             {tile_avx2<2, 1>, tile_avx2<2, 2>},
                             {tile_avx2<3, 1>, tile_avx2<3, 2>},
                             {tile_avx2<4, 1>, tile_avx2<4, 2>}};

// ---------------------------------------------------------------------------
// Dispatch.

float dot(const float* a, const float* b, int64_t K) { return have_avx2() ? dot_avx2(a, b, K) : dot_ref(a, b, K); }
float sum(const float* x, int64_t K) { return have_avx2() ? sum_avx2(x, K) : sum_ref(x, K); }
float maxv(const float* x, int64_t K) { return have_avx2() ? max_avx2(x, K) : max_ref(x, K); }

void exp_shift(const float* x, float shift, float* out, int64_t K) {
  if (have_avx2()) return exp_shift_avx2(x, shift, out, K);
  for (int64_t k = 0; k < K; k++) out[k] = exp_ref(x[k] - shift);
}

void silu_mul(const float* g, const float* u, float* a, int64_t K) {
  if (have_avx2()) return silu_mul_avx2(g, u, a, K);
  for (int64_t k = 0; k < K; k++) a[k] = (g[k] / (1.f + exp_ref(0.f - g[k]))) * u[k];
}

void axpy(float p, const float* v, float* out, int64_t D) {
  if (have_avx2()) return axpy_avx2(p, v, out, D);
  for (int64_t d = 0; d < D; d++) out[d] = std::fmaf(p, v[d], out[d]);
}

// Attention over a row's T cached positions: scores (q against each key,
// scaled) and the weighted sum of the values with weights e[s] / tot.
void attend_scores(const float* q, const float* K, int64_t T, int64_t D, float scale, float* out) {
  if (have_avx2()) return scores_avx2(q, K, T, D, scale, out);
  for (int64_t s = 0; s < T; s++) out[s] = dot_ref(q, K + s * D, D) * scale;
}

void attend_values(const float* e, float tot, const float* V, int64_t T, int64_t D, float* out) {
  if (have_avx2()) return values_avx2(e, tot, V, T, D, out);
  std::fill(out, out + D, 0.f);
  for (int64_t s = 0; s < T; s++) axpy(e[s] / tot, V + s * D, out, D);
}

// ---------------------------------------------------------------------------
// AVX-512 tiles of y = x·Wᵀ, bit for bit the AVX2 tiles' arithmetic: a
// 16-lane register holds two rows' 8 lanes ([row 2p | row 2p+1] for one
// chunk of 8 k), multiplied by one 8-float chunk of a W row broadcast to both
// halves; lane l of each half accumulates k ≡ l mod 8 with fused
// multiply-adds in increasing k, from zero, and each half is added in
// total8's tree, exactly as dot_ref and tile_avx2 do. Twice the lanes per
// instruction: decoding a batch of rows runs twice the multiply-adds per cycle.

bool have_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && have_avx2();
  return ok;
}

// Packs rows [0, M) of x [M, K] in pairs: xp[(p·KC + c)·16 + h·8 + l] =
// x[2p + h][8c + l], zeros past K and for the missing row of an odd M.
// KC = ceil(K / 8).
void pack_pairs(const float* x, int64_t M, int64_t K, std::vector<float>& xp) {
  int64_t KC = (K + 7) / 8, P = (M + 1) / 2;
  xp.assign(P * KC * 16, 0.f);
  for (int64_t m = 0; m < M; m++) {
    float* dst = xp.data() + (m / 2) * KC * 16 + (m % 2) * 8;
    for (int64_t k = 0; k < K; k++) dst[(k / 8) * 16 + k % 8] = x[m * K + k];
  }
}

// v in both halves of a 16-lane register (AVX-512F's 256-bit broadcast).
__attribute__((target("avx512f,avx2,fma"))) inline __m512 bcast8(__m256 v) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(v)));
}

// An (R pairs = 2R rows) × C tile: pairs xp (KC chunks each, as pack_pairs
// lays them) against C rows of W (stride ldw); rows is the number of valid
// rows of the tile (2R, or 2R − 1 when its last pair is padding).
template <int R, int C>
__attribute__((target("avx512f,avx2,fma"))) void tile_avx512(const float* xp, int64_t KC, const float* W, int64_t ldw,
                                                            int64_t K, const float* b, float* y, int64_t ldy, int rows,
                                                            const float* next) {
  __m512 acc[R][C];
  _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
  int64_t full = K / 8;
  for (int64_t kc = 0; kc < full; kc++) {
    if (next && kc % 2 == 0)  // one 64-byte line of each of the next 4 W rows per 16 k
      _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) _mm_prefetch(reinterpret_cast<const char*>(next + c * ldw + kc * 8), _MM_HINT_T0);
    __m512 w[C];
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) w[c] = bcast8(_mm256_loadu_ps(W + c * ldw + kc * 8));
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
      __m512 xv = _mm512_loadu_ps(xp + (r * KC + kc) * 16);
      _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
    }
  }
  if (full < KC) {
    __m256i m = tail_mask(K - full * 8);
    __m512 w[C];
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) w[c] = bcast8(_mm256_maskload_ps(W + c * ldw + full * 8, m));
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
      __m512 xv = _mm512_loadu_ps(xp + (r * KC + full) * 16);
      _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
    }
  }
  if constexpr (C == 4) {
    // total8's tree for the 8 sums of a pair's 4 outputs at once: within
    // each 8-lane half, a = l[j] + l[j+4] (128-bit lanes swapped and
    // added), then (a0 + a2) and (a1 + a3) (unpacked pairs of outputs
    // added), then their sum; the same additions in the same order as the
    // scalar tree, so the same bits (rc_kernels_check compares them).
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
      __m512 s[4];
      _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) s[c] =
          _mm512_add_ps(acc[r][c], _mm512_shuffle_f32x4(acc[r][c], acc[r][c], _MM_SHUFFLE(2, 3, 0, 1)));
      __m512 w01 = _mm512_add_ps(_mm512_unpacklo_ps(s[0], s[1]), _mm512_unpackhi_ps(s[0], s[1]));
      __m512 w23 = _mm512_add_ps(_mm512_unpacklo_ps(s[2], s[3]), _mm512_unpackhi_ps(s[2], s[3]));
      __m512 t = _mm512_add_ps(_mm512_shuffle_ps(w01, w23, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_ps(w01, w23, _MM_SHUFFLE(3, 2, 3, 2)));
      __m128 lo = _mm512_castps512_ps128(t), hi = _mm512_extractf32x4_ps(t, 2);
      if (b) {
        __m128 bv = _mm_loadu_ps(b);
        lo = _mm_add_ps(lo, bv);
        hi = _mm_add_ps(hi, bv);
      }
      _mm_storeu_ps(y + (2 * r) * ldy, lo);
      if (2 * r + 1 < rows) _mm_storeu_ps(y + (2 * r + 1) * ldy, hi);
    }
    return;
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
    _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {
      float lo = total8(_mm512_castps512_ps256(acc[r][c]));
      y[(2 * r) * ldy + c] = b ? lo + b[c] : lo;
      if (2 * r + 1 < rows) {
        float hi = total8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][c]), 1)));
        y[(2 * r + 1) * ldy + c] = b ? hi + b[c] : hi;
      }
    }
}

using Tile512Fn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t, int,
                          const float*);

// Tiles of up to 4 pairs (8 rows) × 4 outputs: 16 accumulators, 4 broadcast
// W chunks and a pair of x in 32 registers.
const Tile512Fn kTiles512[4][4] = {
    {tile_avx512<1, 1>, tile_avx512<1, 2>, tile_avx512<1, 3>, tile_avx512<1, 4>},
    {tile_avx512<2, 1>, tile_avx512<2, 2>, tile_avx512<2, 3>, tile_avx512<2, 4>},
    {tile_avx512<3, 1>, tile_avx512<3, 2>, tile_avx512<3, 3>, tile_avx512<3, 4>},
    {tile_avx512<4, 1>, tile_avx512<4, 2>, tile_avx512<4, 3>, tile_avx512<4, 4>}};

// The paths of linear: every one computes each element as dot_ref does.
enum LinearPath { kPortable = 0, kAVX2 = 1, kAVX512 = 2 };

LinearPath best_path() { return have_avx512() ? kAVX512 : have_avx2() ? kAVX2 : kPortable; }

// y [M, N] = x [M, K] · W [N, K]ᵀ (+ b [N]) on path. Threads split the
// outputs in blocks; no element's arithmetic depends on the split, the
// tile, the path or M. The AVX-512 path takes the rows two by two, so a
// single row (batch-1 decoding, bound by reading W) stays on AVX2.
void linear_on(LinearPath path, const float* x, int64_t M, int64_t K, const float* W, int64_t N, const float* b, float* y) {
  constexpr int64_t kOutBlock = 64, kRowBlock = 32;
  int64_t blocks = (N + kOutBlock - 1) / kOutBlock;
  int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, kOutBlock * M * K));
  if (path == kAVX512 && M < 2) path = kAVX2;
  std::vector<float> xp;
  int64_t KC = (K + 7) / 8;
  if (path == kAVX512) pack_pairs(x, M, K, xp);
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t ob = b0; ob < b1; ob++) {
      int64_t n0 = ob * kOutBlock, n1 = std::min(N, n0 + kOutBlock);
      for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
        int64_t m1 = std::min(M, m0 + kRowBlock);
        if (path == kAVX512) {
          for (int64_t n = n0; n < n1; n += 4) {
            int64_t c = std::min<int64_t>(4, n1 - n);
            // The first tile of each 4 outputs fetches the next 4 rows of W
            // (the head's W comes from memory once per step: without it the
            // loads wait on it). Only a hint: no arithmetic changes.
            const float* next = n + 8 <= N ? W + (n + 4) * K : nullptr;
            for (int64_t m = m0; m < m1; m += 8) {
              int rows = (int)std::min<int64_t>(8, m1 - m);
              kTiles512[(rows + 1) / 2 - 1][c - 1](xp.data() + (m / 2) * KC * 16, KC, W + n * K, K, K,
                                                  b ? b + n : nullptr, y + m * N + n, N, rows, m == m0 ? next : nullptr);
            }
          }
          continue;
        }
        for (int64_t n = n0; n < n1; n += 2) {
          int64_t c = std::min<int64_t>(2, n1 - n);
          for (int64_t m = m0; m < m1; m += 4) {
            int64_t r = std::min<int64_t>(4, m1 - m);
            if (path == kAVX2) {
              kTiles[r - 1][c - 1](x + m * K, K, W + n * K, K, K, b ? b + n : nullptr, y + m * N + n, N);
            } else {
              for (int64_t i = 0; i < r; i++)
                for (int64_t j = 0; j < c; j++) {
                  float s = dot_ref(x + (m + i) * K, W + (n + j) * K, K);
                  y[(m + i) * N + n + j] = b ? s + b[n + j] : s;
                }
            }
          }
        }
      }
    }
  });
}

void linear(const float* x, int64_t M, int64_t K, const float* W, int64_t N, const float* b, float* y) {
  linear_on(best_path(), x, M, K, W, N, b, y);
}

// out = w ⊙ (x / sqrt(mean(x²) + eps)) for one vector of H.
void rms_norm_row(const float* x, const float* w, float eps, int64_t H, float* out) {
  float ms = dot(x, x, H) / (float)H;
  float r = 1.f / std::sqrt(ms + eps);
  for (int64_t i = 0; i < H; i++) out[i] = w[i] * (x[i] * r);
}

const float* data_f32(const torch::Tensor& t) {
  if (t.scalar_type() != torch::kFloat32 || !t.is_contiguous() || !t.device().is_cpu())
    fail("row-invariant decoding needs contiguous float32 CPU tensors");
  return t.data_ptr<float>();
}

// The sampling of one row: logits [V] → the next token (and its log-prob
// under the unscaled softmax). Bans, temperature, top-k and top-p as the
// libtorch path does them, with this file's reductions.
struct RowSample {
  int32_t next = 0;
  float logp = 0;
};

RowSample sample_row(const float* logits, int64_t V, const rc_sample_opts* so, const int32_t* ban, int64_t nban, float u,
                     bool want_logp, std::vector<float>& buf, std::vector<float>& buf2, std::vector<int64_t>& order) {
  const float ninf = -std::numeric_limits<float>::infinity();
  RowSample out;
  // Greedy reads the logits as they are unless tokens are banned; only a
  // ban or sampling needs a copy of the row.
  const float* choice = logits;
  if (nban > 0 || so->temperature > 0) {
    buf.assign(logits, logits + V);  // the choice's logits
    for (int64_t j = 0; j < nban; j++) buf[ban[j]] = ninf;
    choice = buf.data();
  }
  if (so->temperature <= 0) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
      if (choice[v] > choice[best]) best = v;
    out.next = (int32_t)best;
  } else {
    float T = (float)so->temperature;
    for (int64_t v = 0; v < V; v++) buf[v] = buf[v] / T;
    if (so->top_k > 0 && so->top_k < V) {
      buf2 = buf;
      std::nth_element(buf2.begin(), buf2.begin() + (so->top_k - 1), buf2.end(), std::greater<float>());
      float kth = buf2[so->top_k - 1];
      for (int64_t v = 0; v < V; v++)
        if (buf[v] < kth) buf[v] = ninf;
    }
    if (so->top_p > 0 && so->top_p < 1) {
      order.resize(V);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return buf[a] > buf[b]; });
      buf2.resize(V);
      for (int64_t i = 0; i < V; i++) buf2[i] = buf[order[i]];
      float m = maxv(buf2.data(), V);
      std::vector<float> e(V);
      exp_shift(buf2.data(), m, e.data(), V);
      float s = sum(e.data(), V);
      double cum = 0;
      for (int64_t i = 0; i < V; i++) {
        float p = e[i] / s;
        cum += p;
        // Drop a token when the mass before it already reaches top_p.
        if ((float)cum - p >= (float)so->top_p) buf[order[i]] = ninf;
      }
    }
    float m = maxv(buf.data(), V);
    buf2.resize(V);
    exp_shift(buf.data(), m, buf2.data(), V);
    float s = sum(buf2.data(), V);
    // Inverse CDF: the first token whose cumulative probability exceeds
    // u times the total (cumulated in double, as libtorch's cumsum).
    double cum = 0;
    std::vector<float>& c = buf;  // the choice's logits are no longer needed
    for (int64_t v = 0; v < V; v++) {
      cum += buf2[v] / s;
      c[v] = (float)cum;
    }
    float target = u * c[V - 1];
    int64_t next = std::upper_bound(c.begin(), c.end(), target) - c.begin();
    out.next = (int32_t)std::min<int64_t>(next, V - 1);
  }
  if (want_logp) {
    // log p = logit − logsumexp(logits).
    float m = maxv(logits, V);
    buf2.resize(V);
    exp_shift(logits, m, buf2.data(), V);
    out.logp = logits[out.next] - (m + std::log(sum(buf2.data(), V)));
  }
  return out;
}

}  // namespace

bool rows_supported(const rc_policy& p) { return p.device.is_cpu() && p.dtype == torch::kFloat32; }

void extend_rows(rc_cache& c, int64_t n, const int64_t* rows, int64_t width, const int32_t* tokens,
                 const int64_t* counts, const rc_sample_opts* so, uint64_t gen_seed, int32_t* out_tokens,
                 float* out_logp, float* out_logits) {
  const rc_policy& p = *c.p;
  const auto& cfg = p.cfg;
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, nh = cfg.num_attention_heads,
                kv = cfg.num_key_value_heads, hd = cfg.head_dim, V = cfg.vocab_size, g = nh / kv;
  const int64_t qd = nh * hd, kd = kv * hd, half = hd / 2, cap = c.capacity;
  const float eps = (float)cfg.rms_norm_eps;
  const float scale = (float)(1.0 / std::sqrt((double)hd));
  std::vector<int64_t> ban_off(n + 1, 0);
  if (so->ban) {
    for (int64_t i = 0; i < n; i++) ban_off[i + 1] = ban_off[i] + so->ban_counts[i];
    for (int64_t j = 0; j < ban_off[n]; j++)
      if (so->ban[j] < 0 || so->ban[j] >= V) fail("banned token " + std::to_string(so->ban[j]) + " is outside the vocabulary");
  }

  // The call's tokens, row after row (no padding): token m of row i is
  // off[i] + t, at position len[i] + t.
  std::vector<int64_t> off(n + 1, 0), lens(n);
  for (int64_t i = 0; i < n; i++) {
    off[i + 1] = off[i] + counts[i];
    lens[i] = c.len[rows[i]];
  }
  const int64_t M = off[n];
  std::vector<int64_t> row_of(M), pos_of(M);
  for (int64_t i = 0; i < n; i++)
    for (int64_t t = 0; t < counts[i]; t++) {
      row_of[off[i] + t] = i;
      pos_of[off[i] + t] = lens[i] + t;
    }

  // Rotary cos/sin per token and frequency: angle = pos · inv_freq (float),
  // computed by libm one value at a time.
  const float* inv = data_f32(p.inv_freq);
  std::vector<float> cosv(M * half), sinv(M * half);
  for (int64_t m = 0; m < M; m++)
    for (int64_t f = 0; f < half; f++) {
      float a = (float)pos_of[m] * inv[f];
      cosv[m * half + f] = std::cos(a);
      sinv[m * half + f] = std::sin(a);
    }
  auto rotate = [&](float* v, int64_t m) {  // v [hd] ← v·cos + rotate_half(v)·sin
    const float* cs = &cosv[m * half];
    const float* sn = &sinv[m * half];
    for (int64_t f = 0; f < half; f++) {
      float x1 = v[f], x2 = v[f + half];
      v[f] = x1 * cs[f] + (-x2) * sn[f];
      v[f + half] = x2 * cs[f] + x1 * sn[f];
    }
  };

  std::vector<float> x(M * H), h(M * H), q(M * qd), k(M * kd), vv(M * kd), att(M * qd), o(M * H), gt(M * I),
      up(M * I);
  const float* emb = data_f32(p.P(p.embed));
  for (int64_t i = 0; i < n; i++)
    for (int64_t t = 0; t < counts[i]; t++) {
      int64_t id = tokens[i * width + t];
      std::memcpy(&x[(off[i] + t) * H], emb + id * H, sizeof(float) * H);
    }

  for (size_t l = 0; l < p.layers.size(); l++) {
    const auto& ly = p.layers[l];
    const float* w_in = data_f32(p.P(ly.in_norm));
    for (int64_t m = 0; m < M; m++) rms_norm_row(&x[m * H], w_in, eps, H, &h[m * H]);
    linear(h.data(), M, H, data_f32(p.P(ly.q_w)), qd, data_f32(p.P(ly.q_b)), q.data());
    linear(h.data(), M, H, data_f32(p.P(ly.k_w)), kd, data_f32(p.P(ly.k_b)), k.data());
    linear(h.data(), M, H, data_f32(p.P(ly.v_w)), kd, data_f32(p.P(ly.v_b)), vv.data());
    for (int64_t m = 0; m < M; m++) {
      for (int64_t a = 0; a < nh; a++) rotate(&q[m * qd + a * hd], m);
      for (int64_t a = 0; a < kv; a++) rotate(&k[m * kd + a * hd], m);
    }
    // The new keys and values into the cache [rows, kv, capacity, hd].
    float* Kc = c.k[l].data_ptr<float>();
    float* Vc = c.v[l].data_ptr<float>();
    for (int64_t m = 0; m < M; m++) {
      int64_t r = rows[row_of[m]];
      for (int64_t a = 0; a < kv; a++) {
        int64_t at = ((r * kv + a) * cap + pos_of[m]) * hd;
        std::memcpy(Kc + at, &k[m * kd + a * hd], sizeof(float) * hd);
        std::memcpy(Vc + at, &vv[m * kd + a * hd], sizeof(float) * hd);
      }
    }
    // Attention, one (row, query head) at a time over the row's own
    // columns 0..pos (causal within the new tokens).
    at::parallel_for(0, n * nh, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> sc, e;
      for (int64_t job = b0; job < b1; job++) {
        int64_t i = job / nh, a = job % nh, kvh = a / g, r = rows[i];
        const float* Kr = Kc + (r * kv + kvh) * cap * hd;
        const float* Vr = Vc + (r * kv + kvh) * cap * hd;
        for (int64_t t = 0; t < counts[i]; t++) {
          int64_t m = off[i] + t, T = lens[i] + t + 1;
          const float* qv = &q[m * qd + a * hd];
          sc.resize(T);
          e.resize(T);
          attend_scores(qv, Kr, T, hd, scale, sc.data());
          float mx = maxv(sc.data(), T);
          exp_shift(sc.data(), mx, e.data(), T);
          float tot = sum(e.data(), T);
          attend_values(e.data(), tot, Vr, T, hd, &att[m * qd + a * hd]);
        }
      }
    });
    linear(att.data(), M, qd, data_f32(p.P(ly.o_w)), H, nullptr, o.data());
    for (int64_t j = 0; j < M * H; j++) x[j] = x[j] + o[j];
    const float* w_post = data_f32(p.P(ly.post_norm));
    for (int64_t m = 0; m < M; m++) rms_norm_row(&x[m * H], w_post, eps, H, &h[m * H]);
    linear(h.data(), M, H, data_f32(p.P(ly.gate)), I, nullptr, gt.data());
    linear(h.data(), M, H, data_f32(p.P(ly.up)), I, nullptr, up.data());
    for (int64_t m = 0; m < M; m++) silu_mul(&gt[m * I], &up[m * I], &gt[m * I], I);
    linear(gt.data(), M, I, data_f32(p.P(ly.down)), H, nullptr, o.data());
    for (int64_t j = 0; j < M * H; j++) x[j] = x[j] + o[j];
  }
  for (int64_t i = 0; i < n; i++) c.len[rows[i]] += counts[i];

  // Only the last new position of each row needs logits.
  std::vector<float> hn(n * H);
  // The logits live in a buffer of the calling thread kept between steps:
  // a batch's logits over a full vocabulary are tens of MB, which the
  // allocator would otherwise map, fault in and unmap every step. (The
  // shares of a split call run on threads of their own.) Every element is
  // written by linear; only the size matters.
  thread_local std::vector<float> scratch;
  if ((int64_t)scratch.size() < n * V) scratch.resize(n * V);
  float* logits = scratch.data();
  const float* w_norm = data_f32(p.P(p.norm));
  for (int64_t i = 0; i < n; i++) rms_norm_row(&x[(off[i + 1] - 1) * H], w_norm, eps, H, &hn[i * H]);
  linear(hn.data(), n, H, data_f32(p.P(p.lm_head)), V, nullptr, logits);

  std::vector<float> uniforms(n);
  for (int64_t i = 0; i < n; i++) uniforms[i] = row_uniform(gen_seed, (uint64_t)(so->row_base + rows[i]), c.len[rows[i]]);
  bool want_logp = so->want_logp != 0 && out_logp != nullptr;
  std::vector<std::string> errs(n);
  at::parallel_for(0, n, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> buf, buf2;
    std::vector<int64_t> order;
    for (int64_t i = b0; i < b1; i++) {
      try {
        auto rs = sample_row(&logits[i * V], V, so, so->ban ? so->ban + ban_off[i] : nullptr,
                             so->ban ? so->ban_counts[i] : 0, uniforms[i], want_logp, buf, buf2, order);
        out_tokens[i] = rs.next;
        if (out_logp) out_logp[i] = want_logp ? rs.logp : 0.f;
      } catch (const std::exception& ex) {
        errs[i] = ex.what();
      }
    }
  });
  for (auto& e : errs)
    if (!e.empty()) fail(e);
  if (out_logits) std::memcpy(out_logits, logits, sizeof(float) * n * V);
}

namespace {

// A reproducible stream of test values: normal-ish floats of several scales,
// with some zeros.
struct TestValues {
  uint64_t state;
  float next() {
    state = splitmix64(state);
    double u = (double)(state >> 11) * (1.0 / 9007199254740992.0);
    int kind = (int)(state & 7);
    if (kind == 0) return 0.f;
    float v = (float)(std::tan((u - 0.5) * 3.0));  // heavy tails
    return kind == 1 ? v * 1e-3f : kind == 2 ? v * 30.f : v;
  }
  std::vector<float> vec(int64_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = next();
    return v;
  }
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string fstr(float v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

}  // namespace

void kernels_check(uint64_t seed) {
  if (!have_avx2()) return;
  TestValues tv{seed};
  auto expect = [](bool ok, const std::string& what) {
    if (!ok) fail("row kernels: the AVX2 and portable paths differ: " + what);
  };
  for (int64_t K : {1, 3, 7, 8, 9, 16, 31, 64, 130}) {
    auto a = tv.vec(K), b = tv.vec(K);
    float d1 = dot_avx2(a.data(), b.data(), K), d2 = dot_ref(a.data(), b.data(), K);
    expect(same_bits(d1, d2), "dot, K=" + std::to_string(K) + ": " + fstr(d1) + " vs " + fstr(d2));
    float s1 = sum_avx2(a.data(), K), s2 = sum_ref(a.data(), K);
    expect(same_bits(s1, s2), "sum, K=" + std::to_string(K) + ": " + fstr(s1) + " vs " + fstr(s2));
    float m1 = max_avx2(a.data(), K), m2 = max_ref(a.data(), K);
    expect(same_bits(m1, m2), "max, K=" + std::to_string(K) + ": " + fstr(m1) + " vs " + fstr(m2));
    for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 9, 17, 40})
      for (int64_t N : {1, 2, 3, 4, 5, 9, 67, 130}) {
        auto x = tv.vec(M * K), W = tv.vec(N * K), bias = tv.vec(N);
        std::vector<float> y(M * N);
        for (LinearPath path : {kAVX2, kAVX512}) {
          if (path == kAVX512 && !have_avx512()) continue;
          std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
          linear_on(path, x.data(), M, K, W.data(), N, (M + N) % 2 ? bias.data() : nullptr, y.data());
          for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
              float r = dot_ref(&x[i * K], &W[j * K], K);
              if ((M + N) % 2) r = r + bias[j];
              expect(same_bits(y[i * N + j], r), std::string(path == kAVX512 ? "AVX-512 " : "") + "linear, M=" +
                                                     std::to_string(M) + " K=" + std::to_string(K) + " N=" +
                                                     std::to_string(N) + ", element (" + std::to_string(i) + ", " +
                                                     std::to_string(j) + "): " + fstr(y[i * N + j]) + " vs " + fstr(r));
            }
        }
      }
  }
  // Attention's loops: scores and the weighted values against the portable
  // loops over dot_ref and axpy's scalar fused multiply-adds.
  for (int64_t D : {1, 5, 8, 32, 64, 72, 128, 131})
    for (int64_t T : {1, 2, 7, 33}) {
      auto q = tv.vec(D), K = tv.vec(T * D), V = tv.vec(T * D), e = tv.vec(T);
      for (auto& w : e) w = std::fabs(w);
      float tot = 0.5f + e[0], scale = 0.17677669f;
      std::vector<float> s1(T), o1(D), o2(D, 0.f);
      scores_avx2(q.data(), K.data(), T, D, scale, s1.data());
      values_avx2(e.data(), tot, V.data(), T, D, o1.data());
      for (int64_t t = 0; t < T; t++) {
        float r = dot_ref(q.data(), &K[t * D], D) * scale;
        expect(same_bits(s1[t], r), "attention scores, D=" + std::to_string(D) + " T=" + std::to_string(T) + ": " +
                                        fstr(s1[t]) + " vs " + fstr(r));
        for (int64_t d = 0; d < D; d++) o2[d] = std::fmaf(e[t] / tot, V[t * D + d], o2[d]);
      }
      for (int64_t d = 0; d < D; d++)
        expect(same_bits(o1[d], o2[d]), "attention values, D=" + std::to_string(D) + " T=" + std::to_string(T) +
                                            ", element " + std::to_string(d) + ": " + fstr(o1[d]) + " vs " + fstr(o2[d]));
    }
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> xs = {0.f, -0.f, 1.f, -1.f, 88.7f, 88.8f, 89.f, -87.3f, -87.4f, -103.f, -inf, inf,
                           std::numeric_limits<float>::quiet_NaN(), 1e-30f, -1e-30f, 0.34657359f, -0.34657359f};
  for (int i = 0; i < 20000; i++) xs.push_back((tv.next() * 12.f));
  std::vector<float> e1(xs.size()), g = xs, u = tv.vec(xs.size()), a1(xs.size());
  exp_shift_avx2(xs.data(), 0.f, e1.data(), xs.size());
  silu_mul_avx2(g.data(), u.data(), a1.data(), xs.size());
  for (size_t i = 0; i < xs.size(); i++) {
    float e2 = exp_ref(xs[i]);
    expect(same_bits(e1[i], e2), "exp(" + fstr(xs[i]) + "): " + fstr(e1[i]) + " vs " + fstr(e2));
    float a2 = (g[i] / (1.f + exp_ref(0.f - g[i]))) * u[i];
    expect(same_bits(a1[i], a2), "silu(" + fstr(g[i]) + ") * " + fstr(u[i]) + ": " + fstr(a1[i]) + " vs " + fstr(a2));
    double want = std::exp((double)xs[i]);
    if (std::isfinite(xs[i]) && xs[i] > -87.f && xs[i] < 88.f && std::fabs(e2 - want) > 4e-7 * want)
      fail("row kernels: exp(" + fstr(xs[i]) + ") = " + fstr(e2) + ", want " + fstr((float)want) + " within 4e-7 relative");
  }
  auto v = tv.vec(37), out1 = tv.vec(37);
  auto out2 = out1;
  axpy_avx2(0.37f, v.data(), out1.data(), 37);
  for (int64_t d = 0; d < 37; d++) out2[d] = std::fmaf(0.37f, v[d], out2[d]);
  for (int64_t d = 0; d < 37; d++) expect(same_bits(out1[d], out2[d]), "axpy, element " + std::to_string(d));
}

}  // namespace recal

extern "C" int rc_kernels_check(uint64_t seed, int32_t* vector, char** err) {
  return recal::guarded(err, [&] {
    *vector = recal::have_avx512() ? 2 : recal::have_avx2() ? 1 : 0;
    recal::kernels_check(seed);
  });
}
