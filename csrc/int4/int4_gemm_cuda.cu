// Tensor Core INT4 GEMMs (sm_80 / sm_90), registered for CUDA tensors when setup.py builds CUDA sources.
//
//   int4_gemm_cuda     W4A4 dense:  mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32
//                      x  [M, Kp/2] uint8, w [N, Kp/2] uint8: signed two's-complement nibbles, low nibble = lower
//                      column, Kp = K rounded up to 64 (zero padded).
//   int4_gemm_24_cuda  W4A8 2:4:    mma.sp.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (element-wise 2:4 on A)
//                      A = weights (sparse), B = activations^T, so the tile computes y^T. Weights arrive as the
//                      kept INT4 codes [N, Kp/4] (signed nibbles, kept j of a row at nibble j) + 2-bit column
//                      indices [N, Kp/8] (kept j at byte j/4, bits 2*(j%4), as the CPU layout) and are widened to
//                      s8 in registers; x is int8 [M, Kp], Kp a multiple of 32.
// Both return y[m, n] = float(acc) * x_scale[m] * w_scale[n], the CPU kernels' rounding order. The 4-bit sparse
// mma (m16n8k128 .s4) is not used: it constrains sparsity to pairs of elements, which OBR's 2:4 masks are not.
// One warp per 16x8 output tile, fragments loaded straight from global memory: a correctness-first kernel; the
// speed-up check is examples/int4/gpu_check.sh.
#ifdef ICLRKIT_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>
#endif

#include <cuda_runtime.h>

#include <cstdint>

namespace {

__device__ __forceinline__ uint32_t load_u32(const uint8_t* base, int64_t row, int64_t rows, int64_t stride,
                                             int64_t byte) {
  if (row >= rows) return 0u;
  const uint8_t* p = base + row * stride + byte;
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

__device__ __forceinline__ void store_tile(float* y, const float* x_scale, const float* w_scale, int64_t m,
                                           int64_t n, int64_t row, int64_t col, int32_t acc) {
  if (row < m && col < n) y[row * n + col] = static_cast<float>(acc) * x_scale[row] * w_scale[col];
}

// y[M, N]: A = x tile (16 tokens), B = w^T tile (8 channels). Fragment maps (PTX ISA, m16n8k64 .s4):
// a0/a2: row g, a1/a3: row g+8; a0/a1 columns 8t..8t+7, a2/a3 columns 32+8t..; b0: columns 8t.., b1: 32+8t..;
// c0,c1: row g, columns 2t, 2t+1; c2,c3: row g+8.
__global__ void int4_mma_dense_kernel(const uint8_t* __restrict__ x, const uint8_t* __restrict__ w,
                                      const float* __restrict__ x_scale, const float* __restrict__ w_scale,
                                      float* __restrict__ y, int64_t m, int64_t n, int64_t kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * 16, col0 = static_cast<int64_t>(blockIdx.x) * 8;
  const int64_t stride = kp / 2;
  int32_t c[4] = {0, 0, 0, 0};
  for (int64_t k0 = 0; k0 < kp; k0 += 64) {
    const int64_t lo = (k0 + 8 * t) / 2, hi = (k0 + 32 + 8 * t) / 2;
    const uint32_t a0 = load_u32(x, row0 + g, m, stride, lo), a1 = load_u32(x, row0 + g + 8, m, stride, lo);
    const uint32_t a2 = load_u32(x, row0 + g, m, stride, hi), a3 = load_u32(x, row0 + g + 8, m, stride, hi);
    const uint32_t b0 = load_u32(w, col0 + g, n, stride, lo), b1 = load_u32(w, col0 + g, n, stride, hi);
    asm volatile(
        "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  store_tile(y, x_scale, w_scale, m, n, row0 + g, col0 + 2 * t, c[0]);
  store_tile(y, x_scale, w_scale, m, n, row0 + g, col0 + 2 * t + 1, c[1]);
  store_tile(y, x_scale, w_scale, m, n, row0 + g + 8, col0 + 2 * t, c[2]);
  store_tile(y, x_scale, w_scale, m, n, row0 + g + 8, col0 + 2 * t + 1, c[3]);
#endif
}

// Four signed nibbles (kept values j..j+3 of one row) widened to four s8 lanes of one register.
__device__ __forceinline__ uint32_t widen4(const uint8_t* values, int64_t row, int64_t rows, int64_t stride,
                                          int64_t first) {
  if (row >= rows) return 0u;
  const uint8_t* p = values + row * stride + first / 2;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint8_t byte = p[i / 2];
    const int32_t code = static_cast<int8_t>(static_cast<uint8_t>((i & 1 ? byte >> 4 : byte & 0x0F) << 4)) >> 4;
    out |= (static_cast<uint32_t>(code) & 0xFFu) << (8 * i);
  }
  return out;
}

// 16 bits of 2-bit indices (kept values first..first+7, i.e. groups first/2..first/2+3) of one row.
__device__ __forceinline__ uint32_t meta16(const uint8_t* meta, int64_t row, int64_t rows, int64_t stride,
                                          int64_t first) {
  if (row >= rows) return 0x4444u;  // index pattern (0, 1) in every group: a valid 2:4 selector for a zero row
  const uint8_t* p = meta + row * stride + first / 4;
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
}

// y^T tile: A = w (16 channels x 32 columns, 2:4 -> 16 kept s8 per row), B = x^T (32 columns x 8 tokens).
// Compressed A as the dense m16n8k16 .s8 map: a0 row g kept 4t..4t+3, a1 row g+8. B: b0 columns 4t..4t+3,
// b1 columns 16+4t.. of token g. Metadata (selector 0): lanes with t < 2 give row g's groups 4t..4t+3 in the low
// half and row g+8's in the high half.
__global__ void int4_mma_sparse24_kernel(const int8_t* __restrict__ x, const uint8_t* __restrict__ values,
                                         const uint8_t* __restrict__ meta, const float* __restrict__ x_scale,
                                         const float* __restrict__ w_scale, float* __restrict__ y, int64_t m,
                                         int64_t n, int64_t kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const int64_t ch0 = static_cast<int64_t>(blockIdx.y) * 16, tok0 = static_cast<int64_t>(blockIdx.x) * 8;
  const int64_t vstride = kp / 4, mstride = kp / 8;
  int32_t c[4] = {0, 0, 0, 0};
  for (int64_t k0 = 0; k0 < kp; k0 += 32) {
    const int64_t kept0 = k0 / 2;
    const uint32_t a0 = widen4(values, ch0 + g, n, vstride, kept0 + 4 * t);
    const uint32_t a1 = widen4(values, ch0 + g + 8, n, vstride, kept0 + 4 * t);
    const uint32_t b0 = load_u32(reinterpret_cast<const uint8_t*>(x), tok0 + g, m, kp, k0 + 4 * t);
    const uint32_t b1 = load_u32(reinterpret_cast<const uint8_t*>(x), tok0 + g, m, kp, k0 + 16 + 4 * t);
    const int tt = t & 1;
    const uint32_t e = meta16(meta, ch0 + g, n, mstride, kept0 + 8 * tt) |
                       (meta16(meta, ch0 + g + 8, n, mstride, kept0 + 8 * tt) << 16);
    asm volatile(
        "mma.sp.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6,%7}, {%0,%1,%2,%3}, %8, "
        "0x0;\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(b1), "r"(e));
  }
  // c0,c1: channel g, tokens 2t, 2t+1; c2,c3: channel g+8.
  store_tile(y, x_scale, w_scale, m, n, tok0 + 2 * t, ch0 + g, c[0]);
  store_tile(y, x_scale, w_scale, m, n, tok0 + 2 * t + 1, ch0 + g, c[1]);
  store_tile(y, x_scale, w_scale, m, n, tok0 + 2 * t, ch0 + g + 8, c[2]);
  store_tile(y, x_scale, w_scale, m, n, tok0 + 2 * t + 1, ch0 + g + 8, c[3]);
#endif
}

}  // namespace

#ifdef ICLRKIT_WITH_CUDA
namespace {

void check_cuda(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous(), "int4 CUDA: ", name, " must be a contiguous CUDA tensor");
}

torch::Tensor int4_gemm_cuda(const torch::Tensor& x, const torch::Tensor& x_scale, const torch::Tensor& w,
                             const torch::Tensor& w_scale, int64_t kp) {
  for (auto* t : {&x, &x_scale, &w, &w_scale}) check_cuda(*t, "argument");
  TORCH_CHECK(kp % 64 == 0 && x.size(1) * 2 == kp && w.size(1) * 2 == kp, "int4_gemm_cuda: Kp/2 nibble bytes");
  const int64_t m = x.size(0), n = w.size(0);
  auto y = torch::empty({m, n}, x.options().dtype(torch::kFloat));
  const dim3 grid((n + 7) / 8, (m + 15) / 16);
  int4_mma_dense_kernel<<<grid, 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<uint8_t>(), w.data_ptr<uint8_t>(), x_scale.data_ptr<float>(), w_scale.data_ptr<float>(),
      y.data_ptr<float>(), m, n, kp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

torch::Tensor int4_gemm_24_cuda(const torch::Tensor& x, const torch::Tensor& x_scale, const torch::Tensor& values,
                                const torch::Tensor& meta, const torch::Tensor& w_scale, int64_t kp) {
  for (auto* t : {&x, &x_scale, &values, &meta, &w_scale}) check_cuda(*t, "argument");
  TORCH_CHECK(kp % 32 == 0 && x.size(1) == kp && values.size(1) * 4 == kp && meta.size(1) * 8 == kp,
              "int4_gemm_24_cuda: shapes do not match Kp");
  const int64_t m = x.size(0), n = values.size(0);
  auto y = torch::empty({m, n}, x.options().dtype(torch::kFloat));
  const dim3 grid((m + 7) / 8, (n + 15) / 16);
  int4_mma_sparse24_kernel<<<grid, 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<int8_t>(), values.data_ptr<uint8_t>(), meta.data_ptr<uint8_t>(), x_scale.data_ptr<float>(),
      w_scale.data_ptr<float>(), y.data_ptr<float>(), m, n, kp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(iclrkit, m) {
  m.def("int4_gemm_cuda(Tensor x, Tensor x_scale, Tensor w, Tensor w_scale, int kp) -> Tensor");
  m.def("int4_gemm_24_cuda(Tensor x, Tensor x_scale, Tensor values, Tensor meta, Tensor w_scale, int kp) -> Tensor");
}

TORCH_LIBRARY_IMPL(iclrkit, CUDA, m) {
  m.impl("int4_gemm_cuda", &int4_gemm_cuda);
  m.impl("int4_gemm_24_cuda", &int4_gemm_24_cuda);
}
#endif
