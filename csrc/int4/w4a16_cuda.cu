// W4A16 weight-only GEMM for decode shapes: y[M, N] = (x[M, K] @ codes[N, K]^T) * scale[N], x and y float16 or
// bfloat16, INT4 codes dequantised in registers, FP16/BF16 Tensor Core MMA (mma.sync m16n8k16, fp32 accumulate).
// Registered as torch.ops.iclrkit.w4a16_gemm (CUDA) by csrc/int4/int4_cuda_ops.cpp; no PyTorch headers here.
//
// Why: H100/H200 list no INT4 Tensor Core rate, and decode (m = 1..16) is bound by reading the weights; 4-bit
// weights read 4x fewer bytes than FP16.
//
// Weight layout (toolkit.ops.w4a16.w4a16_layout, prepared once at load; Marlin-style: every lane loads exactly its
// own MMA fragments): int32 [N/16, K/64, 32, 4]. Word (i, j, lane, r) holds the A fragment of lane `lane` for the
// 16x16 tile of output channels 16i.. and columns 16(4j+r)..: with g = lane/4, t = lane%4, register q (0..3) of the
// m16n8k16 A fragment covers row g + 8(q&1), columns 2t + 8(q>>1) and +1; its two codes (+8, unsigned) sit at
// nibbles q and q+4 of the word, so `(word >> 4q) & 0x000F000F` puts them at bits 0 and 16, where OR-ing the
// exponent of 1024 (fp16) / 128 (bf16) makes two exact 16-bit floats (1024 + c + 8) and one subtraction gives c.
// A warp reads 512 contiguous bytes per 16-byte load (four k-tiles), so the weight stream is fully coalesced.
// A = weights (16 channels), B = x^T (8 tokens): decode wastes no Tensor Core rows on padding tokens. The warps of a
// block split K; their fp32 partial tiles are added in a fixed order (deterministic). Output channels beyond N and
// columns beyond K are zero codes in the layout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kWarps = 8;   // warps per block, splitting K
constexpr int kUnroll = 4;  // weight loads in flight per lane

template <typename T>
struct Traits;

template <>
struct Traits<__half> {
  static constexpr uint32_t kExponent = 0x64006400u;  // 1024.0 in both halves
  static constexpr uint16_t kBias = 0x6408;           // 1032.0 = 1024 + 8 (the code offset)
  __device__ static uint32_t dequant(uint32_t bits) {
    __half2 v = *reinterpret_cast<__half2*>(&bits);
    const __half2 bias = __halves2half2(__ushort_as_half(kBias), __ushort_as_half(kBias));
    v = __hsub2(v, bias);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
  }
  __device__ static __half from_float(float v) { return __float2half_rn(v); }
};

template <>
struct Traits<__nv_bfloat16> {
  static constexpr uint32_t kExponent = 0x43004300u;  // 128.0 in both halves (7 mantissa bits: 128..143 exact)
  static constexpr uint16_t kBias = 0x4308;           // 136.0 = 128 + 8
  __device__ static uint32_t dequant(uint32_t bits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&bits);
    const __nv_bfloat162 bias = __halves2bfloat162(__ushort_as_bfloat16(kBias), __ushort_as_bfloat16(kBias));
    v = __hsub2(v, bias);
    return *reinterpret_cast<uint32_t*>(&v);
#else
    return bits;
#endif
  }
  __device__ static void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
  }
  __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

// Two consecutive 16-bit activations x[token, col], x[token, col + 1] as one register (0 past the last token).
__device__ __forceinline__ uint32_t load_pair(const uint16_t* x, int64_t token, int64_t m, int64_t kp, int64_t col) {
  if (token >= m) return 0u;
  return *reinterpret_cast<const uint32_t*>(x + token * kp + col);
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    w4a16_kernel(const uint16_t* __restrict__ x, const uint4* __restrict__ w, const float* __restrict__ scale,
                 T* __restrict__ y, int64_t m, int64_t n, int64_t kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  __shared__ float partial[kWarps][32][4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int64_t tile = blockIdx.x, tok0 = static_cast<int64_t>(blockIdx.y) * 8;
  const int64_t chunks = kp / 64;  // 64 columns = four 16-column k-tiles per 16-byte load
  const uint4* wt = w + tile * chunks * 32;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  // kUnroll independent 16-byte weight loads in flight per lane before any of them is used (decode is bound by
  // the weight stream; one load at a time would leave it latency bound)
  for (int64_t j0 = warp; j0 < chunks; j0 += static_cast<int64_t>(kWarps) * kUnroll) {
    uint4 q[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = j0 + static_cast<int64_t>(u) * kWarps;
      q[u] = j < chunks ? wt[j * 32 + lane] : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = j0 + static_cast<int64_t>(u) * kWarps;
      if (j >= chunks) break;
      const uint32_t words[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        uint32_t a[4];
#pragma unroll
        for (int reg = 0; reg < 4; ++reg)
          a[reg] = Traits<T>::dequant(((words[r] >> (4 * reg)) & 0x000F000Fu) | Traits<T>::kExponent);
        const int64_t col = (4 * j + r) * 16;
        const uint32_t b0 = load_pair(x, tok0 + g, m, kp, col + 2 * t);
        const uint32_t b1 = load_pair(x, tok0 + g, m, kp, col + 8 + 2 * t);
        Traits<T>::mma(c, a, b0, b1);
      }
    }
  }
  for (int i = 0; i < 4; ++i) partial[warp][lane][i] = c[i];
  __syncthreads();
  if (warp != 0) return;
  for (int i = 0; i < 4; ++i) {
    float s = 0.f;
    for (int v = 0; v < kWarps; ++v) s += partial[v][lane][i];
    c[i] = s;
  }
  // c0, c1: channel g, tokens 2t, 2t+1; c2, c3: channel g + 8
  for (int i = 0; i < 4; ++i) {
    const int64_t channel = tile * 16 + g + 8 * (i >> 1), token = tok0 + 2 * t + (i & 1);
    if (token < m && channel < n) y[token * n + channel] = Traits<T>::from_float(c[i] * scale[channel]);
  }
#endif
}

}  // namespace

// x [M, Kp] (16-bit, Kp a multiple of 64, zero-padded), w the layout above for N channels, scale float32 [N],
// y [M, N] of x's type. bf16 != 0 selects bfloat16. Returns the launch status.
extern "C" cudaError_t iclrkit_w4a16_gemm(const void* x, const int32_t* w, const float* scale, void* y, int64_t m,
                                          int64_t n, int64_t kp, int bf16, cudaStream_t stream) {
  if (kp % 64 != 0) return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((n + 15) / 16), static_cast<unsigned>((m + 7) / 8));
  const auto* xs = static_cast<const uint16_t*>(x);
  const auto* ws = reinterpret_cast<const uint4*>(w);
  if (bf16)
    w4a16_kernel<__nv_bfloat16><<<grid, kWarps * 32, 0, stream>>>(xs, ws, scale, static_cast<__nv_bfloat16*>(y),
                                                                   m, n, kp);
  else
    w4a16_kernel<__half><<<grid, kWarps * 32, 0, stream>>>(xs, ws, scale, static_cast<__half*>(y), m, n, kp);
  return cudaGetLastError();
}
