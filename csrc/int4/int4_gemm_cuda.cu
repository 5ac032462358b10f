// INT4-weight Tensor Core GEMMs (sm_80 / sm_90). No PyTorch headers: plain nvcc compiles this file quickly, and
// csrc/int4/int4_cuda_ops.cpp registers the ops for CUDA tensors under the same names as the CPU kernels.
//
//   iclrkit_int4_gemm_w4a8    torch.ops.iclrkit.int4_gemm (CUDA): mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32
//   iclrkit_int4_gemm_24_w4a8 torch.ops.iclrkit.int4_gemm_24 (CUDA): mma.sp.sync.aligned.m16n8k32 .s8 (2:4 on A)
//   iclrkit_int4_gemm_s4      torch.ops.iclrkit.int4_gemm_s4 (CUDA only): mma.sync.aligned.m16n8k64 .s4.s4 (W4A4)
//
// The W4A8 kernels read the CPU kernels' weight layout unchanged (csrc/int4/int4_gemm.cpp: 128-column blocks,
// offset-binary nibbles; 2:4 values + 2-bit column metadata), so one layout, prepared once at load, serves both
// devices and the pure-torch reference. Weight nibbles are widened to s8 in registers (subtract the +8 offset per
// byte); activations are the int8 codes [M, Kp] (zero-padded to Kp). A = weights (16 output channels), B = x^T
// (8 tokens): each tile computes y^T, which wastes little at decode shapes (m <= 8). The warps of a block split K
// and add their int32 partial sums in shared memory (exact, so the result is bit-identical to the CPU kernel):
//   y[m, n] = float(acc[m, n]) * x_scale[m] * w_scale[n]
// The 4-bit sparse mma (m16n8k128 .s4) is not used: it constrains sparsity to pairs of elements, which OBR's 2:4
// masks are not.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kWarps = 4;  // warps per block; they split the K loop

__device__ __forceinline__ uint32_t load_u32(const uint8_t* base, int64_t row, int64_t rows, int64_t stride,
                                             int64_t byte) {
  if (row >= rows) return 0u;
  return *reinterpret_cast<const uint32_t*>(base + row * stride + byte);  // byte % 4 == 0, rows 4-byte aligned
}

// Four offset-binary nibbles (the low or high nibble of four consecutive bytes) -> four s8 lanes (code - 8).
__device__ __forceinline__ uint32_t widen_offset_nibbles(uint32_t bytes, bool high) {
  const uint32_t nib = (high ? bytes >> 4 : bytes) & 0x0F0F0F0Fu;
  return __vsub4(nib, 0x08080808u);
}

// Adds the int32 partial tiles of the block's warps in shared memory; returns true on warp 0, whose c[] then holds
// the sum (integer addition: exact in any order).
__device__ __forceinline__ bool reduce_warps(int32_t c[4]) {
  __shared__ int32_t partial[kWarps][32][4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp > 0)
    for (int i = 0; i < 4; ++i) partial[warp][lane][i] = c[i];
  __syncthreads();
  if (warp != 0) return false;
  for (int w = 1; w < kWarps; ++w)
    for (int i = 0; i < 4; ++i) c[i] += partial[w][lane][i];
  return true;
}

__device__ __forceinline__ void store(float* y, const float* x_scale, const float* w_scale, int64_t m, int64_t n,
                                      int64_t token, int64_t channel, int32_t acc) {
  if (token < m && channel < n) y[token * n + channel] = static_cast<float>(acc) * x_scale[token] * w_scale[channel];
}

// Dense W4A8. w [N, Kp/2] CPU layout: in 128-column block b (64 bytes) byte j holds code(128b+j)+8 (low nibble) and
// code(128b+64+j)+8 (high). x int8 [M, Kp]. Fragments (PTX ISA, m16n8k32 .s8): a0 row g cols 4t..4t+3, a1 row g+8,
// a2 row g cols 16+4t.., a3 row g+8; b0 k 4t..4t+3 of column g, b1 k 16+4t..; c0,c1 row g cols 2t,2t+1; c2,c3 g+8.
__global__ void __launch_bounds__(kWarps * 32)
    int4_w4a8_dense_kernel(const int8_t* __restrict__ x, const uint8_t* __restrict__ w,
                           const float* __restrict__ x_scale, const float* __restrict__ w_scale,
                           float* __restrict__ y, int64_t m, int64_t n, int64_t kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int64_t ch0 = static_cast<int64_t>(blockIdx.x) * 16, tok0 = static_cast<int64_t>(blockIdx.y) * 8;
  const int64_t wstride = kp / 2;
  const uint8_t* xb = reinterpret_cast<const uint8_t*>(x);
  int32_t c[4] = {0, 0, 0, 0};
  for (int64_t k0 = static_cast<int64_t>(warp) * 32; k0 < kp; k0 += 32 * kWarps) {
    const int64_t block = k0 / 128, within = k0 % 128;
    const bool high = within >= 64;
    const int64_t byte = block * 64 + (within & 63);
    const uint32_t a0 = widen_offset_nibbles(load_u32(w, ch0 + g, n, wstride, byte + 4 * t), high);
    const uint32_t a1 = widen_offset_nibbles(load_u32(w, ch0 + g + 8, n, wstride, byte + 4 * t), high);
    const uint32_t a2 = widen_offset_nibbles(load_u32(w, ch0 + g, n, wstride, byte + 16 + 4 * t), high);
    const uint32_t a3 = widen_offset_nibbles(load_u32(w, ch0 + g + 8, n, wstride, byte + 16 + 4 * t), high);
    const uint32_t b0 = load_u32(xb, tok0 + g, m, kp, k0 + 4 * t);
    const uint32_t b1 = load_u32(xb, tok0 + g, m, kp, k0 + 16 + 4 * t);
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  if (!reduce_warps(c)) return;
  store(y, x_scale, w_scale, m, n, tok0 + 2 * t, ch0 + g, c[0]);
  store(y, x_scale, w_scale, m, n, tok0 + 2 * t + 1, ch0 + g, c[1]);
  store(y, x_scale, w_scale, m, n, tok0 + 2 * t, ch0 + g + 8, c[2]);
  store(y, x_scale, w_scale, m, n, tok0 + 2 * t + 1, ch0 + g + 8, c[3]);
#endif
}

// 16 bits of 2-bit indices (kept values first..first+7, i.e. groups first/2..first/2+3) of one row.
__device__ __forceinline__ uint32_t meta16(const uint8_t* meta, int64_t row, int64_t rows, int64_t stride,
                                          int64_t first) {
  if (row >= rows) return 0x4444u;  // index pattern (0, 1) in every group: a valid 2:4 selector for a zero row
  const uint8_t* p = meta + row * stride + first / 4;
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
}

// 2:4 W4A8. values [N, Kp/4] CPU layout: per 128-column block (64 kept values, 32 bytes) byte j holds kept j (low)
// and kept 32+j (high), offset +8; meta [N, Kp/8]: kept i's column index within its group of 4 at byte i/4, bits
// 2*(i%4). Compressed A as the dense m16n8k16 .s8 map: a0 row g kept 4t..4t+3, a1 row g+8. B: b0 columns 4t..4t+3,
// b1 columns 16+4t.. of token g. Metadata (selector 0): lanes with t < 2 give row g's groups in the low half and
// row g+8's in the high half.
__global__ void __launch_bounds__(kWarps * 32)
    int4_w4a8_sparse24_kernel(const int8_t* __restrict__ x, const uint8_t* __restrict__ values,
                              const uint8_t* __restrict__ meta, const float* __restrict__ x_scale,
                              const float* __restrict__ w_scale, float* __restrict__ y, int64_t m, int64_t n,
                              int64_t kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int64_t ch0 = static_cast<int64_t>(blockIdx.x) * 16, tok0 = static_cast<int64_t>(blockIdx.y) * 8;
  const int64_t vstride = kp / 4, mstride = kp / 8;
  const uint8_t* xb = reinterpret_cast<const uint8_t*>(x);
  int32_t c[4] = {0, 0, 0, 0};
  for (int64_t k0 = static_cast<int64_t>(warp) * 32; k0 < kp; k0 += 32 * kWarps) {
    const int64_t kept0 = k0 / 2, first = kept0 + 4 * t;  // 4 consecutive kept values, one half of one block
    const int64_t block = first / 64, j = first % 64;
    const bool high = j >= 32;
    const int64_t byte = block * 32 + (j & 31);
    const uint32_t a0 = widen_offset_nibbles(load_u32(values, ch0 + g, n, vstride, byte), high);
    const uint32_t a1 = widen_offset_nibbles(load_u32(values, ch0 + g + 8, n, vstride, byte), high);
    const uint32_t b0 = load_u32(xb, tok0 + g, m, kp, k0 + 4 * t);
    const uint32_t b1 = load_u32(xb, tok0 + g, m, kp, k0 + 16 + 4 * t);
    const int tt = t & 1;
    const uint32_t e = meta16(meta, ch0 + g, n, mstride, kept0 + 8 * tt) |
                       (meta16(meta, ch0 + g + 8, n, mstride, kept0 + 8 * tt) << 16);
    asm volatile(
        "mma.sp.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6,%7}, {%0,%1,%2,%3}, %8, "
        "0x0;\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(b1), "r"(e));
  }
  if (!reduce_warps(c)) return;
  store(y, x_scale, w_scale, m, n, tok0 + 2 * t, ch0 + g, c[0]);
  store(y, x_scale, w_scale, m, n, tok0 + 2 * t + 1, ch0 + g, c[1]);
  store(y, x_scale, w_scale, m, n, tok0 + 2 * t, ch0 + g + 8, c[2]);
  store(y, x_scale, w_scale, m, n, tok0 + 2 * t + 1, ch0 + g + 8, c[3]);
#endif
}

// Dense W4A4 on the s4 MMA: x [M, Kp/2], w [N, Kp/2] signed two's-complement nibbles (low nibble = lower column),
// Kp a multiple of 64. A = x tile (16 tokens), B = w^T tile (8 channels). Fragment maps (m16n8k64 .s4):
// a0/a2: row g, a1/a3: row g+8; a0/a1 columns 8t..8t+7, a2/a3 columns 32+8t..; b0: columns 8t.., b1: 32+8t..;
// c0,c1: row g, columns 2t, 2t+1; c2,c3: row g+8. sm_90 has no native INT4 MMA rate; cuobjdump shows what it got.
__global__ void __launch_bounds__(kWarps * 32)
    int4_s4_dense_kernel(const uint8_t* __restrict__ x, const uint8_t* __restrict__ w,
                         const float* __restrict__ x_scale, const float* __restrict__ w_scale,
                         float* __restrict__ y, int64_t m, int64_t n, int64_t kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * 16, col0 = static_cast<int64_t>(blockIdx.x) * 8;
  const int64_t stride = kp / 2;
  int32_t c[4] = {0, 0, 0, 0};
  for (int64_t k0 = static_cast<int64_t>(warp) * 64; k0 < kp; k0 += 64 * kWarps) {
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
  if (!reduce_warps(c)) return;
  store(y, x_scale, w_scale, m, n, row0 + g, col0 + 2 * t, c[0]);
  store(y, x_scale, w_scale, m, n, row0 + g, col0 + 2 * t + 1, c[1]);
  store(y, x_scale, w_scale, m, n, row0 + g + 8, col0 + 2 * t, c[2]);
  store(y, x_scale, w_scale, m, n, row0 + g + 8, col0 + 2 * t + 1, c[3]);
#endif
}

}  // namespace

// Launchers (called by csrc/int4/int4_cuda_ops.cpp); they return the launch status. Kp is a multiple of 128 for the
// W4A8 kernels (the CPU layout's block) and of 64 for the s4 kernel.
extern "C" cudaError_t iclrkit_int4_gemm_w4a8(const int8_t* x, const uint8_t* w, const float* x_scale,
                                              const float* w_scale, float* y, int64_t m, int64_t n, int64_t kp,
                                              cudaStream_t stream) {
  if (kp % 128 != 0) return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((n + 15) / 16), static_cast<unsigned>((m + 7) / 8));
  int4_w4a8_dense_kernel<<<grid, kWarps * 32, 0, stream>>>(x, w, x_scale, w_scale, y, m, n, kp);
  return cudaGetLastError();
}

extern "C" cudaError_t iclrkit_int4_gemm_24_w4a8(const int8_t* x, const uint8_t* values, const uint8_t* meta,
                                                 const float* x_scale, const float* w_scale, float* y, int64_t m,
                                                 int64_t n, int64_t kp, cudaStream_t stream) {
  if (kp % 128 != 0) return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((n + 15) / 16), static_cast<unsigned>((m + 7) / 8));
  int4_w4a8_sparse24_kernel<<<grid, kWarps * 32, 0, stream>>>(x, values, meta, x_scale, w_scale, y, m, n, kp);
  return cudaGetLastError();
}

extern "C" cudaError_t iclrkit_int4_gemm_s4(const uint8_t* x, const uint8_t* w, const float* x_scale,
                                            const float* w_scale, float* y, int64_t m, int64_t n, int64_t kp,
                                            cudaStream_t stream) {
  if (kp % 64 != 0) return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((n + 7) / 8), static_cast<unsigned>((m + 15) / 16));
  int4_s4_dense_kernel<<<grid, kWarps * 32, 0, stream>>>(x, w, x_scale, w_scale, y, m, n, kp);
  return cudaGetLastError();
}
