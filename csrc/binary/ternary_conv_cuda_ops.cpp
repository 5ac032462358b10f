// CUDA registration of torch.ops.iclrkit.ternary_conv2d / ternary_conv2d_sign (binary Tensor Core kernel in
// ternary_conv_cuda.cu). Built only when setup.py compiles CUDA sources (it defines ICLRKIT_WITH_CUDA); a CPU-only
// torch never sees this code. Takes the CPU op's layout (int64 words along channels), re-lays it out for the
// 128-bit BMMA tiles on the device (as the CPU kernel re-lays its weights per call; no host round trip) and returns
// the same int32 sums / packed bits as the CPU kernel.
#ifdef ICLRKIT_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime.h>

#include <cstdint>

extern "C" cudaError_t iclrkit_ternary_conv2d_bmma(const uint32_t* x, const uint32_t* pos, const uint32_t* neg,
                                                   const int32_t* tap_c, int32_t* out, int N, int H, int W, int KC,
                                                   int O, int O_pad, int kh, int kw, int stride, int pad, int binary,
                                                   cudaStream_t stream);

namespace {

// int64 words [..., KW] -> int32 words [..., KC*4] with KW padded to an even count (128-bit chunks).
at::Tensor to_u32_chunks(const at::Tensor& words) {
  auto w = words.contiguous();
  if (w.size(-1) % 2) w = at::constant_pad_nd(w, {0, 1}, 0);
  std::vector<int64_t> shape(w.sizes().begin(), w.sizes().end());
  shape.back() *= 2;
  return w.view(at::kInt).view(shape).contiguous();
}

// [O, kh, kw, KW] int64 -> [kh*kw, KC, O_pad, 4] int32 (one 128-bit column per output channel).
at::Tensor weight_tiles(const at::Tensor& planes, int64_t O_pad) {
  const int64_t O = planes.size(0), taps = planes.size(1) * planes.size(2);
  auto u32 = to_u32_chunks(planes);
  const int64_t KC = u32.size(-1) / 4;
  auto tiles = u32.view({O, taps, KC, 4}).permute({1, 2, 0, 3});
  return at::constant_pad_nd(tiles, {0, 0, 0, O_pad - O}, 0).contiguous();
}

at::Tensor ternary_conv2d_cuda(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& neg,
                                  int64_t stride, int64_t padding, bool binary, int64_t /*impl*/) {
  TORCH_CHECK(x.is_cuda() && pos.device() == x.device() && neg.device() == x.device(),
              "ternary_conv2d (CUDA): x, w_pos and w_neg must be on the same GPU");
  const c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(x.dim() == 4 && pos.dim() == 4 && pos.sizes() == neg.sizes() && x.size(3) == pos.size(3),
              "ternary_conv2d (CUDA): x [N, H, W, words], w_pos/w_neg [O, kh, kw, words] expected");
  TORCH_CHECK(x.scalar_type() == at::kLong && pos.scalar_type() == at::kLong &&
                  neg.scalar_type() == at::kLong,
              "ternary_conv2d (CUDA): int64 bit words expected");
  const int64_t O = pos.size(0), kh = pos.size(1), kw = pos.size(2);
  const int64_t O_pad = (O + 31) / 32 * 32;
  auto xa = to_u32_chunks(x);
  auto P = weight_tiles(pos, O_pad), Q = weight_tiles(neg, O_pad);
  // popc(pos) - popc(neg) per tap and output channel, counted on the device from the bits of every word
  const auto shifts = at::arange(64, pos.options());
  auto popc = [&](const at::Tensor& planes) {
    return at::bitwise_and(at::bitwise_right_shift(planes.unsqueeze(-1), shifts), 1).sum({-2, -1});  // [O, kh, kw]
  };
  auto counts = (popc(pos) - popc(neg)).reshape({O, kh * kw}).t();  // [taps, O]
  auto tap_c = at::constant_pad_nd(counts, {0, O_pad - O}, 0).to(at::kInt).contiguous();
  const int64_t H = x.size(1), W = x.size(2);
  const int64_t Ho = (H + 2 * padding - kh) / stride + 1, Wo = (W + 2 * padding - kw) / stride + 1;
  TORCH_CHECK(Ho > 0 && Wo > 0, "ternary_conv2d (CUDA): kernel larger than the padded input");
  auto out = at::empty({x.size(0), Ho, Wo, O}, x.options().dtype(at::kInt));
  const auto status = iclrkit_ternary_conv2d_bmma(
      reinterpret_cast<const uint32_t*>(xa.data_ptr<int32_t>()), reinterpret_cast<const uint32_t*>(P.data_ptr<int32_t>()),
      reinterpret_cast<const uint32_t*>(Q.data_ptr<int32_t>()), tap_c.data_ptr<int32_t>(), out.data_ptr<int32_t>(),
      x.size(0), H, W, xa.size(-1) / 4, O, O_pad, kh, kw, stride, padding, binary,
      c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(status == cudaSuccess, "ternary_conv2d (CUDA): ", cudaGetErrorString(status));
  return out;
}

at::Tensor ternary_conv2d_sign_cuda(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& neg,
                                       const at::Tensor& threshold, const at::Tensor& flip, int64_t stride,
                                       int64_t padding, bool binary, int64_t impl) {
  auto s = ternary_conv2d_cuda(x, pos, neg, stride, padding, binary, impl).to(at::kLong);
  const int64_t O = s.size(-1), words = (O + 63) / 64;
  auto t = threshold.to(s.device(), at::kLong);
  auto f = flip.to(s.device(), at::kBool);
  auto bits = at::where(f, s <= t, s >= t).to(at::kLong);
  bits = at::constant_pad_nd(bits, {0, words * 64 - O}, 0);
  std::vector<int64_t> shape(bits.sizes().begin(), bits.sizes().end() - 1);
  shape.push_back(words);
  shape.push_back(64);
  auto shifts = at::arange(64, s.options());
  return at::bitwise_left_shift(bits.view(shape), shifts).sum(-1);  // distinct powers of two: the sum is the OR
}

}  // namespace

TORCH_LIBRARY_IMPL(iclrkit, CUDA, m) {
  m.impl("ternary_conv2d", &ternary_conv2d_cuda);
  m.impl("ternary_conv2d_sign", &ternary_conv2d_sign_cuda);
}
#endif  // ICLRKIT_WITH_CUDA
