// Bit-packed ternary / binary convolution on the CPU (MBU-Net, "subtractive bit encoding" in AND+popcount form).
//
// Activations are sign bits packed along channels: x[n, y, x, k] holds channels 64k..64k+63 of one pixel, bit 1
// meaning +1 and bit 0 meaning -1; bits past the channel count are 0. Weights w in {-1, 0, +1} are two planes,
// pos = [w > 0] and neg = [w < 0] (both 0 for a zero weight and for padding channels). For one in-bounds tap
//     sum_c (2a_c - 1) w_c = 2 (popc(a & pos) - popc(a & neg)) - (popc(pos) - popc(neg)),
// so zero weights and padding channels drop out, and an out-of-bounds tap (zero padding) is simply skipped,
// together with its constant popc(pos) - popc(neg). For binary weights neg = valid & ~pos, hence
// popc(a & neg) = popc(a) - popc(a & pos): one plane suffices, at half the bit operations of the ternary form.
// The fused epilogue compares each sum with a per-channel integer threshold (batch norm folded, `flip` for a
// negative BN scale) and writes packed output bits.
//
// The popcount core runs on AVX-512 VPOPCNTDQ, AVX2 (nibble lookup) or scalar POPCNT, chosen at run time from
// what the processor supports; each is compiled with a function-level target attribute, so the build itself needs
// no -march flag.
//
// Weights are laid out for the kernel once, at load: `ternary_prepack` turns the planes [O, kh, kw, words] and the
// thresholds into the layout below, and `ternary_conv2d_prepacked` / `ternary_conv2d_sign_prepacked` read that
// layout as it is (no per-call re-layout). `ternary_conv2d` / `ternary_conv2d_sign` on raw planes remain as one-shot
// conveniences (prepack + prepacked kernel in one call).
#include <torch/extension.h>

#include <cstdint>
#include <immintrin.h>
#include <limits>
#include <tuple>

namespace {

constexpr int64_t kBlock = 64;  // output channels per block = bits in one output word

struct Geometry {
  int64_t N, H, W, KW, O, O_pad, kh, kw, stride, pad, Ho, Wo;
  bool binary;
};

struct Operands {
  const uint64_t* x;     // [N, H, W, KW]
  const uint64_t* pos;   // [kh*kw, KW, O_pad]
  const uint64_t* neg;   // [kh*kw, KW, O_pad]
  const int64_t* tap_c;  // [kh*kw, O_pad]: popc(pos) - popc(neg) per tap and output channel
  const int64_t* threshold = nullptr;  // [O_pad] (padding channels: INT64_MAX, so their bits stay 0)
  const uint8_t* flip_bits = nullptr;  // [O_pad / 8], bit j of byte v = flip of channel 8v + j
};

constexpr int64_t kMaxTaps = 64;

// The in-bounds taps of one output pixel and the addresses of their KW activation words.
struct Taps {
  int64_t count = 0;
  int64_t index[kMaxTaps];
  const uint64_t* words[kMaxTaps];
};

inline void collect_taps(const Geometry& g, const Operands& op, int64_t n, int64_t oy, int64_t ox, Taps& t) {
  t.count = 0;
  for (int64_t ky = 0; ky < g.kh; ++ky) {
    const int64_t iy = oy * g.stride - g.pad + ky;
    if (iy < 0 || iy >= g.H) continue;
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      const int64_t ix = ox * g.stride - g.pad + kx;
      if (ix < 0 || ix >= g.W) continue;
      t.index[t.count] = ky * g.kw + kx;
      t.words[t.count++] = op.x + ((n * g.H + iy) * g.W + ix) * g.KW;
    }
  }
}

// Packed output word of one 64-channel block from its sums: bit j = flip ? s <= t : s >= t.
inline uint64_t threshold_word(const Operands& op, int64_t ob, int width, const int64_t* s) {
  uint64_t word = 0;
  for (int j = 0; j < width; ++j) {
    const int64_t o = ob * kBlock + j;
    const bool flip = (op.flip_bits[o / 8] >> (o % 8)) & 1;
    word |= static_cast<uint64_t>(flip ? s[j] <= op.threshold[o] : s[j] >= op.threshold[o]) << j;
  }
  return word;
}

// s[j] = integer dot product of output channel ob*64+j, from the popcount partial sums.
inline void finish_block(const Geometry& g, const int64_t* dp, const int64_t* c, int64_t pa, int width, int64_t* s) {
  for (int j = 0; j < width; ++j) s[j] = (g.binary ? 2 * (2 * dp[j] - pa) : 2 * dp[j]) - c[j];
}

__attribute__((target("popcnt"))) void block_scalar(const Geometry& g, const Operands& op, const Taps& taps,
                                                    int64_t ob, int width, int64_t* s, uint64_t* word) {
  int64_t dp[kBlock] = {0}, c[kBlock] = {0}, pa = 0;
  for (int64_t i = 0; i < taps.count; ++i) {
    const int64_t tap = taps.index[i];
    const uint64_t* a = taps.words[i];
    for (int64_t k = 0; k < g.KW; ++k) {
      const uint64_t av = a[k];
      const uint64_t* P = op.pos + (tap * g.KW + k) * g.O_pad + ob * kBlock;
      const uint64_t* Q = op.neg + (tap * g.KW + k) * g.O_pad + ob * kBlock;
      if (g.binary) {
        pa += __builtin_popcountll(av);
        for (int j = 0; j < width; ++j) dp[j] += __builtin_popcountll(av & P[j]);
      } else {
        for (int j = 0; j < width; ++j)
          dp[j] += __builtin_popcountll(av & P[j]) - __builtin_popcountll(av & Q[j]);
      }
    }
    const int64_t* tc = op.tap_c + tap * g.O_pad + ob * kBlock;
    for (int j = 0; j < width; ++j) c[j] += tc[j];
  }
  finish_block(g, dp, c, pa, width, s);
  if (word) *word = threshold_word(op, ob, width, s);
}

__attribute__((target("avx2"))) inline __m256i popcount256(__m256i v) {
  const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2,
                                       2, 3, 2, 3, 3, 4);
  const __m256i low = _mm256_set1_epi8(0x0f);
  const __m256i lo = _mm256_and_si256(v, low);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
  const __m256i bytes = _mm256_add_epi8(_mm256_shuffle_epi8(lut, lo), _mm256_shuffle_epi8(lut, hi));
  return _mm256_sad_epu8(bytes, _mm256_setzero_si256());  // four 64-bit counts
}

__attribute__((target("avx2,popcnt"))) void block_avx2(const Geometry& g, const Operands& op, const Taps& taps,
                                                        int64_t ob, int width, int64_t* s, uint64_t* word) {
  const int V = width / 4;
  __m256i acc[kBlock / 4];
  for (int v = 0; v < V; ++v) acc[v] = _mm256_setzero_si256();
  int64_t c[kBlock] = {0}, pa = 0;
  for (int64_t i = 0; i < taps.count; ++i) {
    const int64_t tap = taps.index[i];
    const uint64_t* a = taps.words[i];
    for (int64_t k = 0; k < g.KW; ++k) {
      const __m256i av = _mm256_set1_epi64x(static_cast<long long>(a[k]));
      const uint64_t* P = op.pos + (tap * g.KW + k) * g.O_pad + ob * kBlock;
      const uint64_t* Q = op.neg + (tap * g.KW + k) * g.O_pad + ob * kBlock;
      if (g.binary) pa += __builtin_popcountll(a[k]);
      for (int v = 0; v < V; ++v) {
        const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(P + 4 * v));
        acc[v] = _mm256_add_epi64(acc[v], popcount256(_mm256_and_si256(av, p)));
        if (!g.binary) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Q + 4 * v));
          acc[v] = _mm256_sub_epi64(acc[v], popcount256(_mm256_and_si256(av, q)));
        }
      }
    }
    const int64_t* tc = op.tap_c + tap * g.O_pad + ob * kBlock;
    for (int j = 0; j < width; ++j) c[j] += tc[j];
  }
  int64_t dp[kBlock];
  for (int v = 0; v < V; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dp + 4 * v), acc[v]);
  finish_block(g, dp, c, pa, width, s);
  if (word) *word = threshold_word(op, ob, width, s);
}

// V = 8-channel vectors in this block (1..8), a compile-time constant so the accumulators stay in registers.
// With `word`, the threshold compare and bit-packing happen in registers (mask compares), else sums go to s.
template <int V>
__attribute__((target("avx512f,avx512vpopcntdq,popcnt"))) void block_avx512_v(const Geometry& g, const Operands& op,
                                                                                const Taps& taps, int64_t ob,
                                                                                int64_t* s, uint64_t* word) {
  __m512i acc[V], cv[V];
  for (int v = 0; v < V; ++v) acc[v] = cv[v] = _mm512_setzero_si512();
  int64_t pa = 0;
  for (int64_t i = 0; i < taps.count; ++i) {
    const int64_t tap = taps.index[i];
    const uint64_t* a = taps.words[i];
    for (int64_t k = 0; k < g.KW; ++k) {
      const __m512i av = _mm512_set1_epi64(static_cast<long long>(a[k]));
      const uint64_t* P = op.pos + (tap * g.KW + k) * g.O_pad + ob * kBlock;
      const uint64_t* Q = op.neg + (tap * g.KW + k) * g.O_pad + ob * kBlock;
      if (g.binary) {
        pa += __builtin_popcountll(a[k]);
        for (int v = 0; v < V; ++v)
          acc[v] = _mm512_add_epi64(acc[v], _mm512_popcnt_epi64(_mm512_and_si512(av, _mm512_loadu_si512(P + 8 * v))));
      } else {
        for (int v = 0; v < V; ++v) {
          const __m512i p = _mm512_popcnt_epi64(_mm512_and_si512(av, _mm512_loadu_si512(P + 8 * v)));
          const __m512i q = _mm512_popcnt_epi64(_mm512_and_si512(av, _mm512_loadu_si512(Q + 8 * v)));
          acc[v] = _mm512_add_epi64(acc[v], _mm512_sub_epi64(p, q));
        }
      }
    }
    const int64_t* tc = op.tap_c + tap * g.O_pad + ob * kBlock;
    for (int v = 0; v < V; ++v) cv[v] = _mm512_add_epi64(cv[v], _mm512_loadu_si512(tc + 8 * v));
  }
  const __m512i two_pa = _mm512_set1_epi64(2 * pa);
  uint64_t bits = 0;
  for (int v = 0; v < V; ++v) {
    // ternary: s = 2·acc - c;  binary: s = 2·(2·acc - pa) - c
    __m512i sv = _mm512_slli_epi64(acc[v], g.binary ? 2 : 1);
    if (g.binary) sv = _mm512_sub_epi64(sv, two_pa);
    sv = _mm512_sub_epi64(sv, cv[v]);
    if (word) {
      const __m512i t = _mm512_loadu_si512(op.threshold + ob * kBlock + 8 * v);
      const __mmask8 flip = op.flip_bits[(ob * kBlock) / 8 + v];
      const __mmask8 ge = _mm512_cmpge_epi64_mask(sv, t), le = _mm512_cmple_epi64_mask(sv, t);
      bits |= static_cast<uint64_t>((ge & ~flip) | (le & flip)) << (8 * v);
    } else {
      _mm512_storeu_si512(s + 8 * v, sv);
    }
  }
  if (word) *word = bits;
}

__attribute__((target("avx512f,avx512vpopcntdq,popcnt"))) void block_avx512(const Geometry& g, const Operands& op,
                                                                              const Taps& taps, int64_t ob, int width,
                                                                              int64_t* s, uint64_t* word) {
  switch (width / 8) {
    case 1: return block_avx512_v<1>(g, op, taps, ob, s, word);
    case 2: return block_avx512_v<2>(g, op, taps, ob, s, word);
    case 3: return block_avx512_v<3>(g, op, taps, ob, s, word);
    case 4: return block_avx512_v<4>(g, op, taps, ob, s, word);
    case 5: return block_avx512_v<5>(g, op, taps, ob, s, word);
    case 6: return block_avx512_v<6>(g, op, taps, ob, s, word);
    case 7: return block_avx512_v<7>(g, op, taps, ob, s, word);
    default: return block_avx512_v<8>(g, op, taps, ob, s, word);
  }
}

using BlockFn = void (*)(const Geometry&, const Operands&, const Taps&, int64_t, int, int64_t*, uint64_t*);

// impl: 0 = best available, 1 = scalar POPCNT, 2 = AVX2, 3 = AVX-512 VPOPCNTDQ.
BlockFn pick_impl(int64_t impl) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vpopcntdq");
  const bool avx2 = __builtin_cpu_supports("avx2");
  TORCH_CHECK(__builtin_cpu_supports("popcnt"), "ternary_conv2d: this processor has no POPCNT instruction");
  TORCH_CHECK(impl >= 0 && impl <= 3, "ternary_conv2d: impl must be 0..3, got ", impl);
  if (impl == 3) TORCH_CHECK(avx512, "ternary_conv2d: AVX-512 VPOPCNTDQ is not available on this processor");
  if (impl == 2) TORCH_CHECK(avx2, "ternary_conv2d: AVX2 is not available on this processor");
  if (impl == 3 || (impl == 0 && avx512)) return block_avx512;
  if (impl == 2 || (impl == 0 && avx2)) return block_avx2;
  return block_scalar;
}

// ---- The prepacked layout, built once at load by `ternary_prepack` (never per call) ----
//   w_pos / w_neg  int64 [kh, kw, KW, O_pad]   output channel fastest (O_pad = O rounded up to 8; padding zeros)
//   tap_c          int64 [kh, kw, O_pad]       popc(pos) - popc(neg) per tap and output channel
//   threshold      int64 [O_pad]               padding channels INT64_MAX, so their bits stay 0
//   flip           uint8 [O_pad / 8]           bit j of byte v = flip of channel 8v + j
// toolkit/segment/kernels.py's pure-torch `_prepack_reference` builds the same tensors (tested bit for bit).
int64_t padded_channels(int64_t O) { return (O + 7) / 8 * 8; }  // 64-channel blocks, the last a multiple of 8

void check_planes(const torch::Tensor& pos, const torch::Tensor& neg, const char* op) {
  TORCH_CHECK(pos.dim() == 4 && pos.scalar_type() == torch::kInt64, op, ": w_pos must be int64 [O, kh, kw, words]");
  TORCH_CHECK(neg.sizes() == pos.sizes() && neg.scalar_type() == torch::kInt64, op, ": w_neg must match w_pos");
  TORCH_CHECK(pos.size(1) * pos.size(2) <= kMaxTaps, op, ": at most ", kMaxTaps, " kernel taps");
}

// [O, kh, kw, KW] planes -> [kh, kw, KW, O_pad] and the tap constants [kh, kw, O_pad].
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> prepack_planes(const torch::Tensor& pos_in,
                                                                       const torch::Tensor& neg_in) {
  const auto pos = pos_in.contiguous(), neg = neg_in.contiguous();
  const int64_t O = pos.size(0), kh = pos.size(1), kw = pos.size(2), KW = pos.size(3), O_pad = padded_channels(O);
  auto to_taps = [&](const torch::Tensor& w) {
    auto t = torch::zeros({kh, kw, KW, O_pad}, w.options());
    t.narrow(3, 0, O).copy_(w.permute({1, 2, 3, 0}));
    return t.contiguous();
  };
  auto P = to_taps(pos), Q = to_taps(neg);
  auto tap_c = torch::zeros({kh, kw, O_pad}, torch::kInt64);
  const uint64_t* p = reinterpret_cast<const uint64_t*>(P.data_ptr<int64_t>());
  const uint64_t* q = reinterpret_cast<const uint64_t*>(Q.data_ptr<int64_t>());
  int64_t* c = tap_c.data_ptr<int64_t>();
  for (int64_t t = 0; t < kh * kw; ++t)
    for (int64_t k = 0; k < KW; ++k)
      for (int64_t o = 0; o < O_pad; ++o)
        c[t * O_pad + o] += __builtin_popcountll(p[(t * KW + k) * O_pad + o]) -
                            __builtin_popcountll(q[(t * KW + k) * O_pad + o]);
  return {P, Q, tap_c};
}

// threshold [O] (any integer dtype) and flip [O] (bool or integer) -> int64 [O_pad] and the uint8 bit mask.
std::tuple<torch::Tensor, torch::Tensor> prepack_threshold(const torch::Tensor& threshold, const torch::Tensor& flip,
                                                           int64_t O) {
  TORCH_CHECK(threshold.numel() == O && flip.numel() == O, "ternary_prepack: one threshold and flip per output "
              "channel expected (", O, "), got ", threshold.numel(), " and ", flip.numel());
  const int64_t O_pad = padded_channels(O);
  auto thr = torch::full({O_pad}, std::numeric_limits<int64_t>::max(), torch::kInt64);
  thr.narrow(0, 0, O).copy_(threshold.reshape(-1).to(torch::kInt64));
  auto flip_bits = torch::zeros({O_pad / 8}, torch::kUInt8);
  const auto flp = flip.reshape(-1).to(torch::kBool).contiguous();
  for (int64_t o = 0; o < O; ++o)
    if (flp.data_ptr<bool>()[o]) flip_bits.data_ptr<uint8_t>()[o / 8] |= static_cast<uint8_t>(1u << (o % 8));
  return {thr, flip_bits};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> ternary_prepack_cpu(
    const torch::Tensor& pos, const torch::Tensor& neg, const torch::Tensor& threshold, const torch::Tensor& flip) {
  check_planes(pos, neg, "ternary_prepack");
  auto [P, Q, tap_c] = prepack_planes(pos, neg);
  auto [thr, flip_bits] = prepack_threshold(threshold, flip, pos.size(0));
  return {P, Q, tap_c, thr, flip_bits};
}

// Checks the prepacked operands (exactly the layout above: a wrong layout fails here instead of being re-laid).
Geometry check_prepacked(const torch::Tensor& x, const torch::Tensor& pos, const torch::Tensor& neg,
                         const torch::Tensor& tap_c, int64_t O, int64_t stride, int64_t padding, bool binary) {
  const char* op = "ternary_conv2d_prepacked";
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == torch::kInt64, op, ": x must be int64 [N, H, W, words]");
  TORCH_CHECK(pos.dim() == 4 && pos.scalar_type() == torch::kInt64 && pos.is_contiguous(), op,
              ": w_pos must be the contiguous int64 [kh, kw, words, O_pad] layout of ternary_prepack");
  TORCH_CHECK(neg.sizes() == pos.sizes() && neg.scalar_type() == torch::kInt64 && neg.is_contiguous(), op,
              ": w_neg must match w_pos");
  TORCH_CHECK(O >= 1 && pos.size(3) == padded_channels(O), op, ": ", O, " output channels need O_pad ",
              padded_channels(O), ", the weights have ", pos.size(3), " (not the ternary_prepack layout)");
  TORCH_CHECK(tap_c.scalar_type() == torch::kInt64 && tap_c.is_contiguous() && tap_c.dim() == 3 &&
                  tap_c.size(0) == pos.size(0) && tap_c.size(1) == pos.size(1) && tap_c.size(2) == pos.size(3),
              op, ": tap_c must be the contiguous int64 [kh, kw, O_pad] of ternary_prepack");
  TORCH_CHECK(pos.size(2) == x.size(3), op, ": weight words ", pos.size(2), " != activation words ", x.size(3));
  TORCH_CHECK(stride >= 1 && padding >= 0, op, ": stride >= 1 and padding >= 0 required");
  TORCH_CHECK(pos.size(0) * pos.size(1) <= kMaxTaps, op, ": at most ", kMaxTaps, " kernel taps");
  Geometry g{};
  g.N = x.size(0), g.H = x.size(1), g.W = x.size(2), g.KW = x.size(3);
  g.O = O, g.kh = pos.size(0), g.kw = pos.size(1), g.O_pad = pos.size(3);
  g.stride = stride, g.pad = padding, g.binary = binary;
  g.Ho = (g.H + 2 * padding - g.kh) / stride + 1;
  g.Wo = (g.W + 2 * padding - g.kw) / stride + 1;
  TORCH_CHECK(g.Ho > 0 && g.Wo > 0, op, ": kernel larger than the padded input");
  return g;
}
// Runs every output pixel and channel block, rows in parallel. Without a threshold (`op.threshold` null) the sums go
// to y32 [N, Ho, Wo, O]; with one, the packed bits go to y64 [N, Ho, Wo, ceil(O/64)].
void run_conv(const Geometry& g, const Operands& op, int64_t impl, int32_t* y32, uint64_t* y64) {
  const BlockFn block = pick_impl(impl);
  const int64_t rows = g.N * g.Ho, blocks = (g.O_pad + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = r / g.Ho, oy = r % g.Ho;
    int64_t s[kBlock];
    Taps taps;
    for (int64_t ox = 0; ox < g.Wo; ++ox) {
      collect_taps(g, op, n, oy, ox, taps);
      const int64_t pixel = r * g.Wo + ox;
      for (int64_t ob = 0; ob < blocks; ++ob) {
        const int width = static_cast<int>(std::min(kBlock, g.O_pad - ob * kBlock));
        if (y64) {
          block(g, op, taps, ob, width, s, y64 + pixel * blocks + ob);
        } else {
          block(g, op, taps, ob, width, s, nullptr);
          const int64_t hi = std::min(kBlock, g.O - ob * kBlock);
          for (int64_t j = 0; j < hi; ++j) y32[pixel * g.O + ob * kBlock + j] = static_cast<int32_t>(s[j]);
        }
      }
    }
  }
}

Operands operands(const torch::Tensor& x, const torch::Tensor& pos, const torch::Tensor& neg,
                  const torch::Tensor& tap_c) {
  return Operands{reinterpret_cast<const uint64_t*>(x.data_ptr<int64_t>()),
                  reinterpret_cast<const uint64_t*>(pos.data_ptr<int64_t>()),
                  reinterpret_cast<const uint64_t*>(neg.data_ptr<int64_t>()), tap_c.data_ptr<int64_t>()};
}

// Integer sums [N, Ho, Wo, O] (int32): the exact ±1 x {-1, 0, +1} convolution, on the prepacked weights.
torch::Tensor ternary_conv2d_prepacked_cpu(const torch::Tensor& x_in, const torch::Tensor& pos,
                                           const torch::Tensor& neg, const torch::Tensor& tap_c, int64_t O,
                                           int64_t stride, int64_t padding, bool binary, int64_t impl) {
  const Geometry g = check_prepacked(x_in, pos, neg, tap_c, O, stride, padding, binary);
  const auto x = x_in.contiguous();
  auto out = torch::empty({g.N, g.Ho, g.Wo, g.O}, torch::kInt32);
  run_conv(g, operands(x, pos, neg, tap_c), impl, out.data_ptr<int32_t>(), nullptr);
  return out;
}

// Fused threshold and packing: bit o = flip[o] ? s <= threshold[o] : s >= threshold[o]; [N, Ho, Wo, ceil(O/64)].
torch::Tensor ternary_conv2d_sign_prepacked_cpu(const torch::Tensor& x_in, const torch::Tensor& pos,
                                                const torch::Tensor& neg, const torch::Tensor& tap_c,
                                                const torch::Tensor& threshold, const torch::Tensor& flip, int64_t O,
                                                int64_t stride, int64_t padding, bool binary, int64_t impl) {
  const Geometry g = check_prepacked(x_in, pos, neg, tap_c, O, stride, padding, binary);
  TORCH_CHECK(threshold.scalar_type() == torch::kInt64 && threshold.is_contiguous() &&
                  threshold.numel() == g.O_pad && flip.scalar_type() == torch::kUInt8 && flip.is_contiguous() &&
                  flip.numel() == g.O_pad / 8,
              "ternary_conv2d_sign_prepacked: threshold int64 [O_pad] and flip uint8 [O_pad / 8] of ternary_prepack "
              "expected");
  const auto x = x_in.contiguous();
  auto out = torch::empty({g.N, g.Ho, g.Wo, (g.O + kBlock - 1) / kBlock}, torch::kInt64);
  Operands op = operands(x, pos, neg, tap_c);
  op.threshold = threshold.data_ptr<int64_t>();
  op.flip_bits = flip.data_ptr<uint8_t>();
  run_conv(g, op, impl, nullptr, reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>()));
  return out;
}

// One-shot ops on the raw planes [O, kh, kw, words]: prepack, then the prepacked kernel. They re-lay the weights on
// every call, so they serve tests and single calls; layers prepack once at load (toolkit/segment/packed.py).
torch::Tensor ternary_conv2d_cpu(const torch::Tensor& x, const torch::Tensor& pos, const torch::Tensor& neg,
                                 int64_t stride, int64_t padding, bool binary, int64_t impl) {
  check_planes(pos, neg, "ternary_conv2d");
  const auto [P, Q, tap_c] = prepack_planes(pos, neg);
  return ternary_conv2d_prepacked_cpu(x, P, Q, tap_c, pos.size(0), stride, padding, binary, impl);
}

torch::Tensor ternary_conv2d_sign_cpu(const torch::Tensor& x, const torch::Tensor& pos, const torch::Tensor& neg,
                                      const torch::Tensor& threshold, const torch::Tensor& flip, int64_t stride,
                                      int64_t padding, bool binary, int64_t impl) {
  check_planes(pos, neg, "ternary_conv2d_sign");
  const auto [P, Q, tap_c] = prepack_planes(pos, neg);
  const auto [thr, flip_bits] = prepack_threshold(threshold, flip, pos.size(0));
  return ternary_conv2d_sign_prepacked_cpu(x, P, Q, tap_c, thr, flip_bits, pos.size(0), stride, padding, binary,
                                           impl);
}

// Sign bits of a float NCHW tensor packed along channels: [N, H, W, ceil(C/64)], bit = x >= 0.
torch::Tensor pack_sign_cpu(const torch::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 4 && x_in.is_floating_point(), "pack_sign: float [N, C, H, W] expected");
  const auto x = x_in.to(torch::kFloat).contiguous();
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), KW = (C + 63) / 64;
  auto out = torch::zeros({N, H, W, KW}, torch::kInt64);
  const float* src = x.data_ptr<float>();
  uint64_t* y = reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>());
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t r = 0; r < N * H; ++r) {
    const int64_t n = r / H, h = r % H;
    for (int64_t c = 0; c < C; ++c) {
      const float* row = src + ((n * C + c) * H + h) * W;
      uint64_t* dst = y + (r * W) * KW + c / 64;
      const uint64_t bit = uint64_t{1} << (c % 64);
      for (int64_t w = 0; w < W; ++w)
        if (row[w] >= 0.f) dst[w * KW] |= bit;
    }
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(iclrkit, m) {
  m.def("ternary_prepack(Tensor w_pos, Tensor w_neg, Tensor threshold, Tensor flip) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("ternary_conv2d_prepacked(Tensor x, Tensor w_pos, Tensor w_neg, Tensor tap_c, int out_channels, int stride, "
        "int padding, bool binary, int impl) -> Tensor");
  m.def("ternary_conv2d_sign_prepacked(Tensor x, Tensor w_pos, Tensor w_neg, Tensor tap_c, Tensor threshold, "
        "Tensor flip, int out_channels, int stride, int padding, bool binary, int impl) -> Tensor");
  m.def("ternary_conv2d(Tensor x, Tensor w_pos, Tensor w_neg, int stride, int padding, bool binary, int impl) "
        "-> Tensor");
  m.def("ternary_conv2d_sign(Tensor x, Tensor w_pos, Tensor w_neg, Tensor threshold, Tensor flip, int stride, "
        "int padding, bool binary, int impl) -> Tensor");
  m.def("pack_sign(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(iclrkit, CPU, m) {
  m.impl("ternary_prepack", &ternary_prepack_cpu);
  m.impl("ternary_conv2d_prepacked", &ternary_conv2d_prepacked_cpu);
  m.impl("ternary_conv2d_sign_prepacked", &ternary_conv2d_sign_prepacked_cpu);
  m.impl("ternary_conv2d", &ternary_conv2d_cpu);
  m.impl("ternary_conv2d_sign", &ternary_conv2d_sign_cpu);
  m.impl("pack_sign", &pack_sign_cpu);
}
