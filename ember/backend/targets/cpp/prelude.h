// No libmvec (glibc's SIMD math, declared under __FAST_MATH__): its logf differs from libm's
// in 36% of results, so a value differed with the loop that computed it (vectorised or a
// scalar tail), and max's backward, which finds the maximum by comparing it with the input
// recomputed elsewhere, lost gradients. Math functions are the prelude's inline code (the
// same bits in every loop) or libm's scalar ones
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <limits>
#include <type_traits>
// float exp, erf, tanh and sigmoid inline, in straight-line code g++ vectorises without a
// call (glibc's vector expf was 4x slower than eager's exp here, 12x on -inf lanes; its erff
// and tanhf 2x); double keeps libm's
#if defined(__FMA__)
#define EMBER_FMA(a, b, c) __builtin_fmaf(a, b, c)
#else
#define EMBER_FMA(a, b, c) ((a) * (b) + (c))
#endif
// a select of bits: with `?:` g++ may branch around the costlier side (or sink a load into
// the branch: a padded pooling window's), and a loop with a branch stays scalar
static inline float ember_select(bool take, float a, float b) {
  int32_t keep = -static_cast<int32_t>(take);
  return __builtin_bit_cast(float, (__builtin_bit_cast(int32_t, a) & keep) |
                                   (__builtin_bit_cast(int32_t, b) & ~keep)); }
static inline double ember_select(bool take, double a, double b) {
  int64_t keep = -static_cast<int64_t>(take);
  return __builtin_bit_cast(double, (__builtin_bit_cast(int64_t, a) & keep) |
                                    (__builtin_bit_cast(int64_t, b) & ~keep)); }
// bfloat16 and float16 live in memory as uint16_t bits and are computed in float, as eager's
// CPU kernels compute them: a load widens exactly, a store rounds once, to nearest even. Bit
// arithmetic and bit selects only, so loops converting them vectorise (F16C's scalar
// _cvtss_sh would leave them scalar, and g++ 12 vectorises no _Float16 conversion without
// AVX512-FP16: 16M float -> half, 2 threads: 5.3 ms so, 9.3 ms with _cvtss_sh). AVX512-BF16's
// vcvtneps2bf16 is no substitute: it flushes float32 subnormals to 0, eager keeps them
static inline uint32_t ember_pick(bool take, uint32_t a, uint32_t b) {
  uint32_t keep = -static_cast<uint32_t>(take); return (a & keep) | (b & ~keep); }
static inline float ember_from_bf16(uint16_t h) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(h) << 16); }
static inline uint16_t ember_bf16_bits(float f) {   // f not NaN: rounded to nearest even
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }
// NaN is eager's scalar NaN, 0x7fc0: made 0x7fc00000 before the rounding, in 32-bit lanes (a
// pick of the 16-bit results took three more shuffles a vector). A store selects with ?:
// (one masked move); ember_round_bf16, inside chains, with bits: there g++ merged ?: with a
// ReLU's NaN test into mask juggling (bf16 batch norm + ReLU, 16 channels: 1.25x slower)
static inline uint16_t ember_to_bf16(float f) {
  return ember_bf16_bits(f != f ? std::numeric_limits<float>::quiet_NaN() : f); }
static inline float ember_from_f16(uint16_t h) {
  uint32_t em = h & 0x7fffu, sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t normal = (em << 13) + 0x38000000u;            // exponent rebiased, 15 -> 127
  uint32_t special = (em << 13) | 0x7f800000u;           // inf, NaN
  uint32_t subnormal = __builtin_bit_cast(uint32_t,      // em * 2^-24, exact
                                          static_cast<float>(static_cast<int32_t>(em)) *
                                          5.9604644775390625e-08f);
  return __builtin_bit_cast(float, sign | ember_pick(em < 0x400u, subnormal,
                                                     ember_pick(em >= 0x7c00u, special, normal))); }
static inline uint16_t ember_to_f16(float f) {
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  uint32_t a = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
  uint32_t r = a - 0x38000000u;                           // exponent rebiased, 127 -> 15
  uint32_t normal = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  // below 2^-14: 0.5f's ulp is 2^-24, float16's subnormal step, so the addition rounds
  // |f| to it (to nearest even); a carry into 2^-14 is the smallest normal's encoding
  uint32_t subnormal = __builtin_bit_cast(uint32_t, __builtin_bit_cast(float, a) + 0.5f) -
                       0x3f000000u;
  uint32_t mag = ember_pick(a < 0x38800000u, subnormal,
                            ember_pick(a >= 0x477ff000u, 0x7c00u, normal));  // 65520 and up: inf
  mag = ember_pick(a > 0x7f800000u, 0x7e00u | ((a >> 13) & 0x3ffu), mag);   // NaN, quiet
  return static_cast<uint16_t>(sign | mag); }
static inline float ember_round_bf16(float f) {
  return ember_from_bf16(ember_bf16_bits(
      ember_select(f != f, std::numeric_limits<float>::quiet_NaN(), f))); }
static inline float ember_round_f16(float f) { return ember_from_f16(ember_to_f16(f)); }
// c0 + c1 x + c2 x^2 + ..., by Horner's rule (straight-line code: a loop over an array of
// coefficients left the calling loop scalar)
static inline float ember_horner(float, float c) { return c; }
template <typename... C> static inline float ember_horner(float x, float c, C... rest) {
  return EMBER_FMA(ember_horner(x, rest...), x, c); }
// exp(x) = 2^k exp(r): k = rint(x / ln 2) by the 1.5 * 2^23 rounding trick, r = x - k ln 2 with
// ln 2 in two parts (Cody & Waite: k * hi is exact), exp(r) = 1 + r + r^2 q(r), q a degree-4
// minimax fit (|r| <= ln 2 / 2, relative error 3.8e-9; Taylor needed degree 7: one FMA more,
// 7% of exp's time); 2^k as two normal factors, so subnormal results round once. < 1 ulp.
// Lanes whose exp rounds to 0 (-inf under a causal mask) compute exp(0) and are zeroed after:
// a subnormal product costs a microcode assist, 10x the whole exp; the clamp at 89 keeps k
// at most 128 (inf) and lets NaN through
// exp(xc) as p * 2^k: k = round(xc / ln 2), p = exp(xc - k ln 2) (shared by the two exps)
static inline float ember_exp_parts(float xc, uint32_t& k) {
  float j = EMBER_FMA(xc, 1.44269504088896341f, 12582912.0f);
  k = __builtin_bit_cast(uint32_t, j) - __builtin_bit_cast(uint32_t, 12582912.0f);
  float kf = j - 12582912.0f;
  float r = EMBER_FMA(-kf, 1.428606765330187e-06f, EMBER_FMA(-kf, 0.693145751953125f, xc));
  return ember_horner(r, 1.0f, 1.0f, 0.49999994f, 0.166665211f, 0.041668389f,
                      0.00836871658f, 0.00138145988f); }
static inline float ember_expf(float x) {
  bool zero = x < -103.972077f;
  float xz = zero ? 0.0f : x;       // one masked move, and one vminps (NaN passes):
  uint32_t k;                       // bit selects and std::min took 5 instructions
  float p = ember_exp_parts(89.0f < xz ? 89.0f : xz, k);
  uint32_t k1 = static_cast<uint32_t>(static_cast<int32_t>(k) >> 1), k2 = k - k1;
  return ember_select(zero, 0.0f, p * __builtin_bit_cast(float, (k1 + 127u) << 23) *
                                  __builtin_bit_cast(float, (k2 + 127u) << 23)); }
// erf: below 1, a + a q(a^2) with q a minimax fit of erf(x) / x - 1 (the fused last step
// keeps q's rounding small against erf); from 1 to 3.92 a degree-12 Chebyshev fit of erf in
// t = (x - 2.46) / 1.46; past 3.92 erf rounds to +-1. No division or exp: GELU of 1M floats,
// 2 threads, 0.33 ms with Abramowitz & Stegun 7.1.26 before. Max error over a dense sweep of
// floats against float64 (tests/backend/targets/cpp_target/test_erf_gelu_accuracy.py):
// 1.86 ulp, 1.1e-7 (eager's erf: 0.75 ulp, 3.3e-8, at 2.8x the time)
static inline float ember_erff(float a) {
  float x = std::abs(a);
  float t = EMBER_FMA(3.92f < x ? 3.92f : x, 0.684931507f, -1.684931507f);  // one vminps
  float tail = ember_horner(t, 9.994966731e-01f, 3.878064914e-03f, -1.393160185e-02f,
                            3.060109757e-02f, -4.500537437e-02f, 4.509779087e-02f,
                            -2.869897327e-02f, 6.526904800e-03f, 8.065710158e-03f,
                            -9.083879432e-03f, 2.283840762e-03f, 1.629612987e-03f,
                            -8.599194103e-04f);
  float series = EMBER_FMA(a, ember_horner(a * a, 0.128379166f, -0.37612626f, 0.112835854f,
                                           -0.0268538147f, 0.00518833473f, -0.000801026123f,
                                           7.85409866e-05f), a);
  return ember_select(x < 1.0f, series, std::copysign(std::min(tail, 1.0f), a)); }
// GELU, x Phi(x) (Phi: the normal CDF), in 20 multiplies and FMAs where 0.5 x (1 + erf(x /
// sqrt 2)) took 25, the loop's bottleneck (1 thread, 1M floats: 0.53 -> 0.455 ms; eager's
// 0.47). Below 2, Phi = 1/2 + x q(x^2), q a minimax fit of (Phi(x) - 1/2) / x relative to
// Phi(-x) where |x| <= 1 (eager's error there is relative) and to 1e-7 absolute beyond;
// from 2 to 5.54 Phi = e or 1 - e, e = Phi(-|x|) by a degree-10 fit in |x| - 3.7699 (exact),
// of error 4.6e-8 weighted by |x| (x e is the result); past 5.54 e is 0: Phi rounds to 1,
// and x < -5.54 gives eager's -0.0 (NaN at -inf, as eager's). Max error over a dense sweep
// against float64, eager's (oneDNN's gelu_erf) in brackets: |x| < 1: 1.93 ulp (2.58);
// x >= 1: 1.71 ulp (4.89); x < -1, where eager's error is absolute: 9.6e-8 (1.1e-6).
// Eager's overflows to inf from 1.7e38 (it doubles x first); ours is x there
static inline float ember_gelu_f(float x) {
  float z = std::abs(x);
  float small = EMBER_FMA(x, ember_horner(x * x, 0.398942262f, -0.0664901733f, 0.00997283217f,
                                          -0.00118615979f, 0.000114427952f, -8.94548066e-06f,
                                          5.2003486e-07f, -1.65509828e-08f), 0.5f);
  float e = ember_horner(z - 3.76990008f, 8.16328102e-05f, -0.000327200542f, 0.000617259997f,
                         -0.000720373704f, 0.000574173988f, -0.000326269597f, 0.000131013338f,
                         -3.06586917e-05f, -1.17021204e-06f, 3.12517614e-06f, -6.26618998e-07f);
  e = z < 5.54f ? e : 0.0f;             // inf and NaN too (a NaN x stays NaN: x * 1)
  return x * (z < 2.0f ? small : (x < 0.0f ? e : 1.0f - e)); }
// tanh: below 0.625 a polynomial (a minimax fit of tanh(x) / x in x^2, 0.1 ulp), above it
// 1 - 2 / (exp(2|x|) + 1); 1.4 ulp at most. Past |x| = 9.02 tanh rounds to +-1, so the exp
// needs no zeroed lanes or second scaling factor (20% less time than ember_expf's)
static inline float ember_tanhf(float a) {
  uint32_t k;
  float p = ember_exp_parts(2.0f * std::min(std::abs(a), 9.02f), k);   // NaN passes min
  float e = p * __builtin_bit_cast(float, (k + 127u) << 23);
  float tail = std::copysign(1.0f - 2.0f / (e + 1.0f), a);
  float series = a * ember_horner(a * a, 1.0f, -0.333332598f, 0.133311272f, -0.0537210815f,
                                  0.0205910206f, -0.00566001935f);
  return ember_select(std::abs(a) < 0.625f, series, tail); }
template <typename T> static inline T ember_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> static inline T ember_min(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T> static inline T ember_relu(T a) { return (a != a) ? a : (a > T(0) ? a : T(0)); }
// log(x) = k ln 2 + log(m), x = 2^k m with m in [sqrt(2)/2, sqrt(2)): log(m) = log1p(f) from
// s = f / (2 + f) as 2 atanh(s), a minimax fit in s^2 (fdlibm's logf, log2f and log10f);
// subnormals scaled by 2^25 first, special values selected after. Straight-line code,
// vectorised without a call. At most, over every float: log 0.84 ulp, log2 0.86 (exact at
// powers of 2), log10 0.83 (libmvec's: up to 4 ulp; libm's scalar ones were 3-12x slower)
static inline void ember_log_reduce(float a, float& dk, float& f, float& hfsq, float& sr) {
  uint32_t bits = __builtin_bit_cast(uint32_t, a);
  bool tiny = bits < 0x00800000u;                       // +0 and subnormals (not negatives)
  uint32_t ix = __builtin_bit_cast(uint32_t, tiny ? a * 33554432.0f : a);
  ix += 0x3f800000u - 0x3f3504f3u;
  dk = static_cast<float>(static_cast<int32_t>(ix >> 23) - 0x7f - (tiny ? 25 : 0));
  f = __builtin_bit_cast(float, (ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
  float s = f / (2.0f + f);
  float z = s * s, w = z * z;
  float r = z * (0.66666662693f + w * 0.28498786688f) + w * (0.40000972152f + w * 0.24279078841f);
  hfsq = 0.5f * f * f;
  sr = s * (hfsq + r); }
static inline float ember_log_special(float a, float y) {   // +inf and NaN, 0, negatives
  uint32_t bits = __builtin_bit_cast(uint32_t, a);
  y = bits >= 0x7f800000u ? a : y;
  y = (bits & 0x7fffffffu) == 0 ? -std::numeric_limits<float>::infinity() : y;
  return (bits >> 31) && (bits & 0x7fffffffu) ? std::numeric_limits<float>::quiet_NaN() : y; }
static inline float ember_logf(float a) {
  float dk, f, hfsq, sr; ember_log_reduce(a, dk, f, hfsq, sr);
  return ember_log_special(a, sr + dk * 9.0580006145e-06f - hfsq + f + dk * 6.9313812256e-01f); }
// log2 and log10 scale f - hfsq in two parts: hi (its top 12 bits) and lo
static inline float ember_log_hi(float f, float hfsq) {
  return __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, f - hfsq) & 0xfffff000u); }
static inline float ember_log2f(float a) {
  float dk, f, hfsq, sr; ember_log_reduce(a, dk, f, hfsq, sr);
  float hi = ember_log_hi(f, hfsq), lo = (f - hi) - hfsq + sr;
  return ember_log_special(a, (lo + hi) * -1.7605285393e-04f + lo * 1.4428710938e+00f +
                              hi * 1.4428710938e+00f + dk); }
static inline float ember_log10f(float a) {
  float dk, f, hfsq, sr; ember_log_reduce(a, dk, f, hfsq, sr);
  float hi = ember_log_hi(f, hfsq), lo = (f - hi) - hfsq + sr;
  return ember_log_special(a, dk * 7.9034151668e-07f + (lo + hi) * -3.1689971365e-05f +
                              lo * 4.3432617188e-01f + hi * 4.3432617188e-01f +
                              dk * 3.0102920532e-01f); }
template <typename T> static inline T ember_log2(T a) { return std::log2(a); }
static inline float ember_log2(float a) { return ember_log2f(a); }
template <typename T> static inline T ember_log10(T a) { return std::log10(a); }
static inline float ember_log10(float a) { return ember_log10f(a); }
template <typename T> static inline T ember_log(T a) { return std::log(a); }
// log1p and expm1 from log and exp by Goldberg's and Kahan's tricks: (1 + a) rounded is
// u, log1p(a) = log(u) a / (u - 1) and expm1(a) = (u - 1) a / log(u) for u = exp(a) (the
// rounding errors of u cancel). 2.42 ulp at most over a dense sweep of floats (libm's
// scalar ones, 12x slower here, were the alternative)
static inline float ember_log1pf(float a) {
  float u = 1.0f + a;
  float y = ember_logf(u) * (a / (u - 1.0f));
  y = u == 1.0f ? a : y;                                // |a| below half an ulp of 1
  return a == std::numeric_limits<float>::infinity() ? a : y; }
static inline float ember_expm1f(float a) {
  float u = ember_expf(a);
  float um1 = u - 1.0f;
  float y = um1 * (a / ember_logf(u));
  y = u == 1.0f ? a : y;
  y = um1 == -1.0f ? -1.0f : y;                         // exp(a) below half an ulp of 1
  return u == std::numeric_limits<float>::infinity() ? u : y; }
template <typename T> static inline T ember_log1p(T a) { return std::log1p(a); }
static inline float ember_log1p(float a) { return ember_log1pf(a); }
template <typename T> static inline T ember_expm1(T a) { return std::expm1(a); }
static inline float ember_expm1(float a) { return ember_expm1f(a); }
static inline float ember_log(float a) { return ember_logf(a); }
template <typename T> static inline T ember_exp(T a) { return std::exp(a); }
static inline float ember_exp(float a) { return ember_expf(a); }
template <typename T> static inline T ember_erf(T a) { return std::erf(a); }
static inline float ember_erf(float a) { return ember_erff(a); }
template <typename T> static inline T ember_gelu(T a) {   // the decomposition's own order
  return a * T(0.5) * (T(1) + std::erf(a * T(0.70710678118654752440))); }
static inline float ember_gelu(float a) { return ember_gelu_f(a); }
// GELU's derivative, Phi(x) + x phi(x) (phi: the normal density), from one exp: Phi(-|x|) =
// phi(x) (b1 t + ... + b5 t^5), t = 1 / (1 + p |x|) (Abramowitz & Stegun 26.2.17), where
// 0.5 (1 + erf(x / sqrt 2)) took a second polynomial pair: gelu's backward over 262144
// floats, 1 thread, 434 -> 296 us (eager's 300). Max abs error over a dense sweep against
// float64: 2.8e-7 (eager's, whose erf is A&S 7.1.26 with an exp of its own: 2.6e-7)
static inline float ember_gelu_grad_f(float x) {
  float pdf = 0.398942280f * ember_expf(-0.5f * x * x);
  float t = 1.0f / EMBER_FMA(0.2316419f, std::abs(x), 1.0f);
  float tail = pdf * (t * ember_horner(t, 0.319381530f, -0.356563782f, 1.781477937f,
                                       -1.821255978f, 1.330274429f));
  return EMBER_FMA(x, pdf, x < 0.0f ? tail : 1.0f - tail); }
template <typename T> static inline T ember_gelu_grad(T a) {   // the decomposition's order
  return T(0.5) * (T(1) + std::erf(a * T(0.70710678118654752440))) +
         a * (T(0.39894228040143267794) * std::exp(a * a * T(-0.5))); }
static inline float ember_gelu_grad(float a) { return ember_gelu_grad_f(a); }
template <typename T> static inline T ember_tanh(T a) { return std::tanh(a); }
static inline float ember_tanh(float a) { return ember_tanhf(a); }
template <typename T> static inline T ember_sigmoid(T a) { return T(1) / (T(1) + ember_exp(-a)); }
template <typename T> static inline T ember_sign(T a) {   // 0 for NaN, as eager's
  return static_cast<T>((T(0) < a) - (a < T(0))); }
// float floor division as Python's (and eager's): from the exact remainder, since floor(a / b)
// is off by one where the quotient rounds up to an integer (-2.1000001f // 0.3f: -7, not -8)
template <typename T> static inline T ember_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    if (b == 0) return a / b;
    T m = std::fmod(a, b);
    T d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;
    if (d == 0) return std::copysign(T(0), a / b);
    T f = std::floor(d);
    return d - f > T(0.5) ? f + 1 : f; }
  else { T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q; } }
template <typename T> static inline T ember_remainder(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    T m = std::fmod(a, b); if (m != 0 && ((m < 0) != (b < 0))) m += b; return m; }
  else { T m = a % b; if (m != 0 && ((m < 0) != (b < 0))) m += b; return m; } }
// Integer division as eager's: a zero divisor sets EMBER_ZERO_DIVISION in ``flags`` (the
// wrapper then raises eager's ZeroDivisionError) and divides by 1 instead, and a divisor of
// -1 negates, wrapping: x86's idiv traps on both, and on INT_MIN / -1
// (bits 2 and up: the kernel's index checks, one per op kind: Kernel.index_check_slot)
#define EMBER_ZERO_DIVISION 2
template <typename T> static inline bool ember_minus_one(T b) {
  if constexpr (std::is_signed<T>::value) return b == T(-1); else return false; }
template <typename T> static inline T ember_divisor(T b, int& flags) {
  flags |= b == 0 ? EMBER_ZERO_DIVISION : 0;
  return (b == 0 || ember_minus_one(b)) ? T(1) : b; }
template <typename T> static inline T ember_wrapping_neg(T a) {
  using U = typename std::make_unsigned<T>::type;
  return static_cast<T>(static_cast<U>(0) - static_cast<U>(a)); }
template <typename T> static inline T ember_negated_by(T b, T q) {
  if constexpr (std::is_signed<T>::value) { if (b == T(-1)) return ember_wrapping_neg(q); }
  return q; }
template <typename T> static inline T ember_checked_truncdiv(T a, T b, int& flags) {
  return ember_negated_by(b, static_cast<T>(a / ember_divisor(b, flags))); }
template <typename T> static inline T ember_checked_floordiv(T a, T b, int& flags) {
  return ember_negated_by(b, ember_floordiv(a, ember_divisor(b, flags))); }
template <typename T> static inline T ember_checked_remainder(T a, T b, int& flags) {
  return ember_remainder(a, ember_divisor(b, flags)); }   // x % -1 == x % 1 == 0
template <typename T> static inline T ember_checked_fmod(T a, T b, int& flags) {
  return static_cast<T>(a % ember_divisor(b, flags)); }
template <typename T> static inline void ember_welford_update(T& mean, T& m2, int64_t& n,
                                                          T v) {
  n += 1; T d = v - mean; mean = mean + d / static_cast<T>(n); m2 = m2 + d * (v - mean); }
// Chan et al.'s merge of the state (mean_b, m2_b, n_b) of later elements into (mean, m2, n)
template <typename T> static inline void ember_welford_combine(T& mean, T& m2, int64_t& n,
                                                           T mean_b, T m2_b, int64_t n_b) {
  if (n_b == 0) return;
  if (n == 0) { mean = mean_b; m2 = m2_b; n = n_b; return; }
  int64_t total = n + n_b; T d = mean_b - mean;
  T w = static_cast<T>(n_b) / static_cast<T>(total);
  mean = mean + d * w; m2 = m2 + m2_b + d * d * static_cast<T>(n) * w; n = total; }
// 1 / (k + 1) for the Welford updates of fine accumulators (k < CASCADE steps): a table
// lookup keeps the int-to-float conversion and the division off the loop's dependency chain
template <typename T> struct ember_inverse_table {
  T v[EMBER_CASCADE];
  ember_inverse_table() { for (int k = 0; k < EMBER_CASCADE; k++) v[k] = T(1) / T(k + 1); } };
template <typename T> static const ember_inverse_table<T> ember_inverse{};
// Philox4x32-10 (Salmon et al., 2011): a counter-based generator; rand/randn of an
// element are a pure function of (seed, offset)
static inline void ember_philox(uint64_t seed, uint64_t offset, uint32_t out[4]) {
  uint32_t c0 = static_cast<uint32_t>(offset), c1 = static_cast<uint32_t>(offset >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1); c3 = static_cast<uint32_t>(p0); c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3; }
static inline float ember_uniform(uint32_t bits) {   // [0, 1) from the top 24 bits
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }
static inline float ember_rand(int64_t seed, int64_t offset) {
  uint32_t r[4]; ember_philox(seed, offset, r); return ember_uniform(r[0]); }
static inline float ember_randn(int64_t seed, int64_t offset) {   // Box-Muller
  uint32_t r[4]; ember_philox(seed, offset, r);
  float u = ember_uniform(r[0]) + (1.0f / 33554432.0f), v = ember_uniform(r[1]);
  return std::sqrt(-2.0f * std::log(u)) * std::cos(6.283185307179586f * v); }
// A tile of a transposed read (strategies/tiles.py): dst[i * TR + j] = src[i + j * stride]
// for i < nx, j < nr. Full 8 x 8 blocks move as 8 vector loads, three rounds that
// interleave row k with row k + 4 (together a transpose) and 8 vector stores; g++ picks the
// host ISA's shuffles. Only bits move (vectors of an unsigned type of the element's size,
// through memcpy). x.t().contiguous() of 4096 x 1024 floats, 1 thread: 31 ms untiled, 2.2 tiled
template <typename U, typename T> static inline void ember_transpose8(
    const T* src, int64_t stride, T* dst, int64_t dst_stride) {
  typedef U V __attribute__((vector_size(8 * sizeof(U))));
  V r[8], o[8];
  for (int i = 0; i < 8; i++) __builtin_memcpy(&r[i], src + i * stride, sizeof(V));
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 4; i++) {
      o[2 * i] = __builtin_shufflevector(r[i], r[i + 4], 0, 8, 1, 9, 2, 10, 3, 11);
      o[2 * i + 1] = __builtin_shufflevector(r[i], r[i + 4], 4, 12, 5, 13, 6, 14, 7, 15); }
    for (int i = 0; i < 8; i++) r[i] = o[i]; }
  for (int i = 0; i < 8; i++) __builtin_memcpy(dst + i * dst_stride, &r[i], sizeof(V)); }
template <int TR, typename T> static inline void ember_transpose_tile(
    const T* src, int64_t stride, T* dst, int64_t nx, int64_t nr) {
  typedef std::conditional_t<sizeof(T) == 1, uint8_t, std::conditional_t<sizeof(T) == 2,
          uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>> U;
  static_assert(sizeof(T) == sizeof(U), "an element of 1, 2, 4 or 8 bytes");
  int64_t bx = nx & ~int64_t(7), br = nr & ~int64_t(7);
  for (int64_t i = 0; i < bx; i += 8)
    for (int64_t j = 0; j < br; j += 8)
      ember_transpose8<U>(src + i + j * stride, stride, dst + i * TR + j, TR);
  for (int64_t i = 0; i < nx; i++)      // the edges: columns from br on, rows from bx on
    for (int64_t j = i < bx ? br : 0; j < nr; j++) dst[i * TR + j] = src[i + j * stride]; }
template <typename T> static inline T ember_lowest() {
  return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                              : std::numeric_limits<T>::lowest(); }
template <typename T> static inline T ember_highest() {
  return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                              : std::numeric_limits<T>::max(); }
