// W4A8 / W4A4 GEMM over packed INT4 weights, dense and 2:4 sparse, with exact int32 accumulation.
//
//   y[m, n] = float(acc[m, n]) * x_scale[m] * w_scale[n],   acc[m, n] = sum_k xq[m, k] * wq[n, k]
//
// Kernel layout (built by toolkit.ops.int4.to_kernel_layout from the OBR packed format; the OBR format stores
// the codes of one matrix as one continuous nibble stream plus a bitmask, which has no per-row or per-block
// addressability, so it is converted once at load time):
//   dense  w   uint8 [N, Kp/2]   Kp = K rounded up to 128. In block b (128 columns, 64 bytes) byte j holds
//                               code(k0+j)+8 in the low nibble and code(k0+64+j)+8 in the high nibble.
//   sparse v   uint8 [N, Kp/4]   the two kept codes of every group of 4 columns; per 128-column block (64 kept
//                               values, 32 bytes) byte j holds kept j (low) and kept 32+j (high), offset +8.
//          meta uint8 [N, Kp/8]  the 2-bit column index (within its group of 4) of kept value j sits at
//                               byte j/4, bits 2*(j%4) (per block: 16 bytes).
//   rowsum int32 [N]             sum_k wq[n, k], to undo the +128 offset applied to activations.
// Activations are made unsigned (xq + 128) so one u8 x s8 dot instruction (vpdpbusd / vpmaddubsw) does the
// multiply: sum (x+128) w = sum x w + 128 * rowsum.
#include <torch/extension.h>

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kBlock = 128;

struct Problem {
  const uint8_t* x;     // [M, Kp] activations + 128, zero-padded columns hold 128
  const uint8_t* w;     // dense packed or sparse values
  const uint8_t* meta;  // sparse only
  const int32_t* rowsum;
  const float* x_scale;
  const float* w_scale;
  float* y;
  int64_t m, n, kp;
};

inline float finish(const Problem& p, int64_t row, int64_t col, int32_t acc) {
  const int32_t exact = acc - 128 * p.rowsum[col];
  return static_cast<float>(exact) * p.x_scale[row] * p.w_scale[col];
}

inline int32_t dense_code(const uint8_t* wrow, int64_t k) {
  const int64_t block = k / kBlock, j = k % kBlock;
  const uint8_t byte = wrow[block * 64 + (j & 63)];
  return static_cast<int32_t>(j < 64 ? (byte & 0x0F) : (byte >> 4)) - 8;
}

// ---------------------------------------------------------------- portable scalar paths
void dense_scalar(const Problem& p) {
#pragma omp parallel for schedule(static)
  for (int64_t col = 0; col < p.n; ++col) {
    const uint8_t* wrow = p.w + col * (p.kp / 2);
    for (int64_t row = 0; row < p.m; ++row) {
      const uint8_t* xrow = p.x + row * p.kp;
      int32_t acc = 0;
      for (int64_t k = 0; k < p.kp; ++k) acc += static_cast<int32_t>(xrow[k]) * dense_code(wrow, k);
      p.y[row * p.n + col] = finish(p, row, col, acc);
    }
  }
}

void sparse_scalar(const Problem& p) {
  const int64_t kept = p.kp / 2;
#pragma omp parallel for schedule(static)
  for (int64_t col = 0; col < p.n; ++col) {
    const uint8_t* vrow = p.w + col * (kept / 2);
    const uint8_t* mrow = p.meta + col * (kept / 4);
    for (int64_t row = 0; row < p.m; ++row) {
      const uint8_t* xrow = p.x + row * p.kp;
      int32_t acc = 0;
      for (int64_t i = 0; i < kept; ++i) {
        const int64_t block = i / 64, j = i % 64;
        const uint8_t byte = vrow[block * 32 + (j & 31)];
        const int32_t code = static_cast<int32_t>(j < 32 ? (byte & 0x0F) : (byte >> 4)) - 8;
        const int64_t column = (i / 2) * 4 + ((mrow[i / 4] >> (2 * (i % 4))) & 3);
        acc += static_cast<int32_t>(xrow[column]) * code;
      }
      p.y[row * p.n + col] = finish(p, row, col, acc);
    }
  }
}

// ---------------------------------------------------------------- AVX2 (dense)
__attribute__((target("avx2,fma"))) inline int32_t hsum256(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// u8 x s8 -> int32 lanes; products are at most 255 * 8 * 2 < 2^15, so vpmaddubsw never saturates.
__attribute__((target("avx2,fma"))) inline __m256i dot_u8s8_avx2(__m256i acc, __m256i x, __m256i w) {
  const __m256i pairs = _mm256_maddubs_epi16(x, w);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

template <int MT>
__attribute__((target("avx2,fma"))) void dense_avx2_tile(const Problem& p, int64_t col, int64_t row0) {
  const __m256i low = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  const uint8_t* wrow = p.w + col * (p.kp / 2);
  __m256i acc[MT];
  for (int t = 0; t < MT; ++t) acc[t] = _mm256_setzero_si256();
  for (int64_t k0 = 0; k0 < p.kp; k0 += kBlock) {
    const uint8_t* wb = wrow + k0 / 2;
    for (int half = 0; half < 2; ++half) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 32 * half));
      const __m256i wlo = _mm256_sub_epi8(_mm256_and_si256(bytes, low), eight);
      const __m256i whi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), low), eight);
      for (int t = 0; t < MT; ++t) {
        const uint8_t* xb = p.x + (row0 + t) * p.kp + k0 + 32 * half;
        acc[t] = dot_u8s8_avx2(acc[t], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb)), wlo);
        acc[t] = dot_u8s8_avx2(acc[t], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 64)), whi);
      }
    }
  }
  for (int t = 0; t < MT; ++t) p.y[(row0 + t) * p.n + col] = finish(p, row0 + t, col, hsum256(acc[t]));
}

__attribute__((target("avx2,fma"))) void dense_avx2(const Problem& p) {
#pragma omp parallel for schedule(static)
  for (int64_t col = 0; col < p.n; ++col) {
    int64_t row = 0;
    for (; row + 4 <= p.m; row += 4) dense_avx2_tile<4>(p, col, row);
    for (; row < p.m; ++row) dense_avx2_tile<1>(p, col, row);
  }
}

// ---------------------------------------------------------------- AVX-512 VNNI (+ VBMI for 2:4)
#define ICLRKIT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")))

// NT output channels x MT tokens per tile: NT*MT accumulators stay in registers, each unpacked weight vector
// is reused by MT tokens and each activation vector by NT channels.
template <int NT, int MT>
ICLRKIT_AVX512 void dense_vnni_tile(const Problem& p, int64_t col0, int64_t row0) {
  const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  __m512i acc[NT][MT];
  for (int c = 0; c < NT; ++c)
    for (int t = 0; t < MT; ++t) acc[c][t] = _mm512_setzero_si512();
  for (int64_t k0 = 0; k0 < p.kp; k0 += kBlock) {
    __m512i wlo[NT], whi[NT];
    for (int c = 0; c < NT; ++c) {
      const __m512i bytes = _mm512_loadu_si512(p.w + (col0 + c) * (p.kp / 2) + k0 / 2);
      wlo[c] = _mm512_sub_epi8(_mm512_and_si512(bytes, low), eight);
      whi[c] = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(bytes, 4), low), eight);
    }
    for (int t = 0; t < MT; ++t) {
      const uint8_t* xb = p.x + (row0 + t) * p.kp + k0;
      const __m512i xlo = _mm512_loadu_si512(xb), xhi = _mm512_loadu_si512(xb + 64);
      for (int c = 0; c < NT; ++c) {
        acc[c][t] = _mm512_dpbusd_epi32(acc[c][t], xlo, wlo[c]);
        acc[c][t] = _mm512_dpbusd_epi32(acc[c][t], xhi, whi[c]);
      }
    }
  }
  for (int c = 0; c < NT; ++c)
    for (int t = 0; t < MT; ++t)
      p.y[(row0 + t) * p.n + col0 + c] = finish(p, row0 + t, col0 + c, _mm512_reduce_add_epi32(acc[c][t]));
}

// Column index (0..127 inside the block) of each of the 64 kept values, from 16 bytes of 2-bit metadata:
// kept value j lives in group j/2, i.e. at 4*(j/2) + meta_j.
ICLRKIT_AVX512 inline __m512i sparse_indices(const uint8_t* meta) {
  const __m512i words = _mm512_cvtepu16_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta)));
  const __m512i shifts = _mm512_set1_epi64(0x0E0C0A0806040200LL);
  const __m512i fields = _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, words), _mm512_set1_epi8(3));
  alignas(64) static const uint8_t base[64] = {
      0,  0,  4,  4,  8,  8,  12, 12, 16, 16, 20, 20, 24,  24,  28,  28,  32,  32,  36,  36,  40, 40,
      44, 44, 48, 48, 52, 52, 56, 56, 60, 60, 64, 64, 68, 68, 72,  72,  76,  76,  80,  80,  84,  84,
      88, 88, 92, 92, 96, 96, 100, 100, 104, 104, 108, 108, 112, 112, 116, 116, 120, 120, 124, 124};
  return _mm512_add_epi8(fields, _mm512_load_si512(base));
}

// The 2:4 kernel gathers the two activations each kept weight meets (one vpermt2b per token and block) and then
// does half the multiply-adds of the dense kernel; weights stream at 0.625 of the dense bytes.
template <int NT, int MT>
ICLRKIT_AVX512 void sparse_vnni_tile(const Problem& p, int64_t col0, int64_t row0) {
  const __m256i low = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  __m512i acc[NT][MT];
  for (int c = 0; c < NT; ++c)
    for (int t = 0; t < MT; ++t) acc[c][t] = _mm512_setzero_si512();
  for (int64_t k0 = 0; k0 < p.kp; k0 += kBlock) {
    __m512i wv[NT], idx[NT];
    for (int c = 0; c < NT; ++c) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.w + (col0 + c) * (p.kp / 4) + k0 / 4));
      const __m256i vlo = _mm256_sub_epi8(_mm256_and_si256(bytes, low), eight);
      const __m256i vhi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), low), eight);
      wv[c] = _mm512_inserti64x4(_mm512_castsi256_si512(vlo), vhi, 1);
      idx[c] = sparse_indices(p.meta + (col0 + c) * (p.kp / 8) + k0 / 8);
    }
    for (int t = 0; t < MT; ++t) {
      const uint8_t* xb = p.x + (row0 + t) * p.kp + k0;
      const __m512i xlo = _mm512_loadu_si512(xb), xhi = _mm512_loadu_si512(xb + 64);
      for (int c = 0; c < NT; ++c) {
        const __m512i picked = _mm512_permutex2var_epi8(xlo, idx[c], xhi);
        acc[c][t] = _mm512_dpbusd_epi32(acc[c][t], picked, wv[c]);
      }
    }
  }
  for (int c = 0; c < NT; ++c)
    for (int t = 0; t < MT; ++t)
      p.y[(row0 + t) * p.n + col0 + c] = finish(p, row0 + t, col0 + c, _mm512_reduce_add_epi32(acc[c][t]));
}

template <template <int, int> class Tile>
void run_tiles(const Problem& p) {
  const int64_t col_tiles = (p.n + 3) / 4;
#pragma omp parallel for schedule(static)
  for (int64_t ct = 0; ct < col_tiles; ++ct) {
    const int64_t col0 = ct * 4;
    const bool full = col0 + 4 <= p.n;
    int64_t row = 0;
    for (; row + 4 <= p.m; row += 4) {
      if (full) Tile<4, 4>::run(p, col0, row);
      else
        for (int64_t c = col0; c < p.n; ++c) Tile<1, 4>::run(p, c, row);
    }
    for (; row < p.m; ++row) {
      if (full) Tile<4, 1>::run(p, col0, row);
      else
        for (int64_t c = col0; c < p.n; ++c) Tile<1, 1>::run(p, c, row);
    }
  }
}

template <int NT, int MT>
struct DenseTile {
  static void run(const Problem& p, int64_t col, int64_t row) { dense_vnni_tile<NT, MT>(p, col, row); }
};
template <int NT, int MT>
struct SparseTile {
  static void run(const Problem& p, int64_t col, int64_t row) { sparse_vnni_tile<NT, MT>(p, col, row); }
};

// ---------------------------------------------------------------- dispatch
enum class Path { Scalar, Avx2, Vnni };

Path best_path() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
      __builtin_cpu_supports("avx512vbmi"))
    return Path::Vnni;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Path::Avx2;
  return Path::Scalar;
}

Path choose(const std::string& path) {
  if (path == "auto") return best_path();
  if (path == "scalar") return Path::Scalar;
  const Path available = best_path();
  if (path == "avx2") {
    TORCH_CHECK(available != Path::Scalar, "int4_gemm: this CPU has no AVX2");
    return Path::Avx2;
  }
  TORCH_CHECK(path == "vnni", "int4_gemm: path must be auto|scalar|avx2|vnni, got ", path);
  TORCH_CHECK(available == Path::Vnni, "int4_gemm: this CPU has no AVX-512 VNNI/VBMI");
  return Path::Vnni;
}

// Activations + 128 as unsigned bytes, columns padded to Kp with 128 (= activation 0).
std::vector<uint8_t> offset_activations(const torch::Tensor& xq, int64_t kp) {
  const int64_t m = xq.size(0), k = xq.size(1);
  std::vector<uint8_t> out(static_cast<size_t>(m * kp), 128);
  const int8_t* src = xq.data_ptr<int8_t>();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c) out[r * kp + c] = static_cast<uint8_t>(static_cast<int32_t>(src[r * k + c]) + 128);
  return out;
}

void check_common(const torch::Tensor& xq, const torch::Tensor& x_scale, const torch::Tensor& w_scale,
                  const torch::Tensor& rowsum, int64_t k) {
  TORCH_CHECK(xq.dim() == 2 && xq.scalar_type() == torch::kChar, "int4_gemm: x must be int8 [M, K]");
  TORCH_CHECK(xq.size(1) == k, "int4_gemm: x has ", xq.size(1), " columns, weights have ", k);
  TORCH_CHECK(x_scale.scalar_type() == torch::kFloat && x_scale.numel() == xq.size(0),
              "int4_gemm: x_scale must be float32 [M]");
  TORCH_CHECK(w_scale.scalar_type() == torch::kFloat, "int4_gemm: w_scale must be float32 [N]");
  TORCH_CHECK(rowsum.scalar_type() == torch::kInt && rowsum.numel() == w_scale.numel(),
              "int4_gemm: rowsum must be int32 [N]");
}

torch::Tensor gemm(const torch::Tensor& xq_in, const torch::Tensor& x_scale_in, const torch::Tensor& w_in,
                   const torch::Tensor* meta_in, const torch::Tensor& w_scale_in, const torch::Tensor& rowsum_in,
                   int64_t k, const std::string& path) {
  const auto xq = xq_in.contiguous(), x_scale = x_scale_in.contiguous(), w = w_in.contiguous();
  const auto w_scale = w_scale_in.contiguous(), rowsum = rowsum_in.contiguous();
  check_common(xq, x_scale, w_scale, rowsum, k);
  const int64_t n = w_scale.numel(), kp = (k + kBlock - 1) / kBlock * kBlock;
  const int64_t bytes_per_row = meta_in ? kp / 4 : kp / 2;
  TORCH_CHECK(w.scalar_type() == torch::kByte && w.dim() == 2 && w.size(0) == n && w.size(1) == bytes_per_row,
              "int4_gemm: packed weights must be uint8 [", n, ", ", bytes_per_row, "]");
  torch::Tensor meta;
  if (meta_in) {
    meta = meta_in->contiguous();
    TORCH_CHECK(meta.scalar_type() == torch::kByte && meta.dim() == 2 && meta.size(0) == n && meta.size(1) == kp / 8,
                "int4_gemm_24: metadata must be uint8 [", n, ", ", kp / 8, "]");
  }
  auto y = torch::empty({xq.size(0), n}, torch::kFloat);
  const std::vector<uint8_t> x = offset_activations(xq, kp);
  const Problem p{x.data(), w.data_ptr<uint8_t>(), meta_in ? meta.data_ptr<uint8_t>() : nullptr,
                  rowsum.data_ptr<int32_t>(), x_scale.data_ptr<float>(), w_scale.data_ptr<float>(),
                  y.data_ptr<float>(), xq.size(0), n, kp};
  if (p.m == 0 || p.n == 0) return y;
  const Path chosen = choose(path);
  if (meta_in) {
    if (chosen == Path::Vnni) run_tiles<SparseTile>(p);
    else sparse_scalar(p);  // AVX2 has no byte permute across 128 columns; the scalar path is exact
  } else if (chosen == Path::Vnni) {
    run_tiles<DenseTile>(p);
  } else if (chosen == Path::Avx2) {
    dense_avx2(p);
  } else {
    dense_scalar(p);
  }
  return y;
}

torch::Tensor int4_gemm_cpu(const torch::Tensor& xq, const torch::Tensor& x_scale, const torch::Tensor& w,
                            const torch::Tensor& w_scale, const torch::Tensor& rowsum, int64_t k, std::string path) {
  return gemm(xq, x_scale, w, nullptr, w_scale, rowsum, k, path);
}

torch::Tensor int4_gemm_24_cpu(const torch::Tensor& xq, const torch::Tensor& x_scale, const torch::Tensor& values,
                               const torch::Tensor& meta, const torch::Tensor& w_scale, const torch::Tensor& rowsum,
                               int64_t k, std::string path) {
  return gemm(xq, x_scale, values, &meta, w_scale, rowsum, k, path);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(iclrkit, m) {
  m.def("int4_gemm(Tensor xq, Tensor x_scale, Tensor w, Tensor w_scale, Tensor rowsum, int k, str path) -> Tensor");
  m.def("int4_gemm_24(Tensor xq, Tensor x_scale, Tensor values, Tensor meta, Tensor w_scale, Tensor rowsum, int k, "
        "str path) -> Tensor");
  // CUDA kernels only (csrc/int4/int4_cuda_ops.cpp); on other devices the pure-torch references that
  // toolkit/ops/registry.py registers as CompositeExplicitAutograd kernels run.
  m.def("int4_gemm_s4(Tensor x, Tensor x_scale, Tensor w, Tensor w_scale, int kp) -> Tensor");
  m.def("w4a16_gemm(Tensor x, Tensor w, Tensor scales, int n, int k) -> Tensor");
}

TORCH_LIBRARY_IMPL(iclrkit, CPU, m) {
  m.impl("int4_gemm", &int4_gemm_cpu);
  m.impl("int4_gemm_24", &int4_gemm_24_cpu);
}
