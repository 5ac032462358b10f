// Ternary / binary convolution on binary Tensor Cores (sm_80+, sm_90 included) in AND+popcount form.
//
// Hopper has no XOR binary MMA (the official MBU-Net harness relies on it); AND is native on sm_80 and sm_90, and
// the subtractive two-plane encoding needs nothing else:
//     s = sum over in-bounds taps of 2 (popc(a & pos) - popc(a & neg)) - (popc(pos) - popc(neg))
// (binary weights: popc(a & neg) = popc(a) - popc(a & pos), one BMMA per tile instead of two).
// Implicit GEMM: each warp owns 8 output pixels x 32 output channels; per tap and 128-channel chunk it stages the
// 8 x 128-bit activation rows in shared memory (zeros for out-of-bounds taps) and runs m8n8k128 b1 bmma_sync with
// bmmaBitOpAND against 4 (ternary: 2 x 4) weight tiles. Warps are indexed with threadIdx.x / 32 and blockDim
// (pitfall 2 of the official code: %warpid is not a stable index).
//
// Layouts (uint32 words, bit order identical to the CPU kernel's little-endian 64-bit words):
//   x      [N, H, W, KC*4]            KC = 128-channel chunks per pixel
//   pos/neg[kh*kw, KC, O_pad, 4]      one 128-bit column per output channel (col_major B tiles), O_pad % 32 == 0
//   tap_c  [kh*kw, O_pad] int32       popc(pos) - popc(neg) per tap and output channel
//   out    [N, Ho, Wo, O] int32       exact integer sums
// The weight operands (pos/neg, tap_c) are built once at load by `ternary_prepack` (ternary_conv_cuda_ops.cpp) and
// read here as they are. No PyTorch headers here, so plain nvcc compiles it; ternary_conv_cuda_ops.cpp registers the
// ops.
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

namespace {

constexpr int kWarps = 4;       // warps per block
constexpr int kTilesN = 4;      // 8-channel B tiles per warp -> 32 output channels
constexpr unsigned kFull = 0xffffffffu;

struct Dims {
  int N, H, W, KC, O, O_pad, kh, kw, stride, pad, Ho, Wo, binary;
};

__device__ inline int tap_constant(const Dims& d, const int32_t* tap_c, int64_t pixel, int o) {
  const int64_t plane = static_cast<int64_t>(d.Ho) * d.Wo;
  const int oy = static_cast<int>((pixel % plane) / d.Wo), ox = static_cast<int>(pixel % d.Wo);
  int c = 0;
  for (int ky = 0; ky < d.kh; ++ky) {
    const int iy = oy * d.stride - d.pad + ky;
    if (iy < 0 || iy >= d.H) continue;
    for (int kx = 0; kx < d.kw; ++kx) {
      const int ix = ox * d.stride - d.pad + kx;
      if (ix >= 0 && ix < d.W) c += tap_c[(ky * d.kw + kx) * d.O_pad + o];
    }
  }
  return c;
}

__global__ void __launch_bounds__(kWarps * 32)
    ternary_conv_bmma_and(const uint32_t* __restrict__ x, const uint32_t* __restrict__ pos,
                          const uint32_t* __restrict__ neg, const int32_t* __restrict__ tap_c,
                          int32_t* __restrict__ out, Dims d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  using b1 = wmma::experimental::precision::b1;
  __shared__ __align__(128) uint32_t a_tile[kWarps][32];
  __shared__ __align__(128) int32_t c_tile[kWarps][2][64];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps_per_block = blockDim.x / 32;
  const int64_t pixels = static_cast<int64_t>(d.N) * d.Ho * d.Wo;
  const int col_tiles = d.O_pad / (8 * kTilesN);
  const int64_t tiles = (pixels + 7) / 8 * col_tiles;
  const int row = lane / 4, word = lane % 4;  // this lane stages word `word` of A row `row`
  for (int64_t tile = static_cast<int64_t>(blockIdx.x) * warps_per_block + warp; tile < tiles;
       tile += static_cast<int64_t>(gridDim.x) * warps_per_block) {
    const int64_t p0 = tile / col_tiles * 8;
    const int o0 = static_cast<int>(tile % col_tiles) * 8 * kTilesN;
    const int64_t p = p0 + row;
    const bool p_ok = p < pixels;
    const int64_t plane = static_cast<int64_t>(d.Ho) * d.Wo;
    const int n = p_ok ? static_cast<int>(p / plane) : 0;
    const int oy = p_ok ? static_cast<int>((p % plane) / d.Wo) : 0;
    const int ox = p_ok ? static_cast<int>(p % d.Wo) : 0;
    wmma::fragment<wmma::accumulator, 8, 8, 128, int> acc_p[kTilesN], acc_n[kTilesN];
    for (int t = 0; t < kTilesN; ++t) {
      wmma::fill_fragment(acc_p[t], 0);
      wmma::fill_fragment(acc_n[t], 0);
    }
    int pa = 0;
    for (int ky = 0; ky < d.kh; ++ky) {
      for (int kx = 0; kx < d.kw; ++kx) {
        const int iy = oy * d.stride - d.pad + ky, ix = ox * d.stride - d.pad + kx;
        const bool in = p_ok && iy >= 0 && iy < d.H && ix >= 0 && ix < d.W;
        const int tap = ky * d.kw + kx;
        for (int kc = 0; kc < d.KC; ++kc) {
          const uint32_t v = in ? x[((static_cast<int64_t>(n) * d.H + iy) * d.W + ix) * d.KC * 4 + kc * 4 + word] : 0u;
          pa += __popc(v);
          a_tile[warp][lane] = v;
          __syncwarp();
          wmma::fragment<wmma::matrix_a, 8, 8, 128, b1, wmma::row_major> a;
          wmma::load_matrix_sync(a, a_tile[warp], 128);
          for (int t = 0; t < kTilesN; ++t) {
            const int64_t off = ((static_cast<int64_t>(tap) * d.KC + kc) * d.O_pad + o0 + 8 * t) * 4;
            wmma::fragment<wmma::matrix_b, 8, 8, 128, b1, wmma::col_major> b;
            wmma::load_matrix_sync(b, pos + off, 128);
            wmma::bmma_sync(acc_p[t], a, b, acc_p[t], wmma::experimental::bmmaBitOpAND);
            if (!d.binary) {
              wmma::load_matrix_sync(b, neg + off, 128);
              wmma::bmma_sync(acc_n[t], a, b, acc_n[t], wmma::experimental::bmmaBitOpAND);
            }
          }
          __syncwarp();
        }
      }
    }
    pa += __shfl_xor_sync(kFull, pa, 1);
    pa += __shfl_xor_sync(kFull, pa, 2);  // every lane of row r now holds popc(a) of row r
    for (int t = 0; t < kTilesN; ++t) {
      wmma::store_matrix_sync(c_tile[warp][0], acc_p[t], 8, wmma::mem_row_major);
      wmma::store_matrix_sync(c_tile[warp][1], acc_n[t], 8, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 64; e += 32) {
        const int r = e / 8, col = e % 8;
        const int row_pa = __shfl_sync(kFull, pa, r * 4);
        const int64_t pixel = p0 + r;
        const int o = o0 + 8 * t + col;
        if (pixel < pixels && o < d.O) {
          const int dp = c_tile[warp][0][e], dn = c_tile[warp][1][e];
          const int s = (d.binary ? 2 * (2 * dp - row_pa) : 2 * (dp - dn)) - tap_constant(d, tap_c, pixel, o);
          out[pixel * d.O + o] = s;
        }
      }
      __syncwarp();
    }
  }
#endif
}

}  // namespace

// Launches the kernel on `stream`; returns the launch status. O_pad must be a multiple of 32 and the weight and
// activation pointers 32-byte aligned (cudaMalloc and PyTorch allocations are).
extern "C" cudaError_t iclrkit_ternary_conv2d_bmma(const uint32_t* x, const uint32_t* pos, const uint32_t* neg,
                                                   const int32_t* tap_c, int32_t* out, int N, int H, int W, int KC,
                                                   int O, int O_pad, int kh, int kw, int stride, int pad, int binary,
                                                   cudaStream_t stream) {
  if (O_pad % (8 * kTilesN) != 0 || stride < 1 || pad < 0) return cudaErrorInvalidValue;
  Dims d{N, H, W, KC, O, O_pad, kh, kw, stride, pad, (H + 2 * pad - kh) / stride + 1,
         (W + 2 * pad - kw) / stride + 1, binary};
  if (d.Ho <= 0 || d.Wo <= 0) return cudaErrorInvalidValue;
  const int64_t tiles = (static_cast<int64_t>(N) * d.Ho * d.Wo + 7) / 8 * (O_pad / (8 * kTilesN));
  int device = 0, sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t wanted = (tiles + kWarps - 1) / kWarps;
  const int blocks = static_cast<int>(wanted < static_cast<int64_t>(sms) * 16 ? wanted : static_cast<int64_t>(sms) * 16);
  ternary_conv_bmma_and<<<blocks > 0 ? blocks : 1, kWarps * 32, 0, stream>>>(x, pos, neg, tap_c, out, d);
  return cudaGetLastError();
}
