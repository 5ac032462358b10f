// CUDA registration of the ternary / binary convolution ops (binary Tensor Core kernel in ternary_conv_cuda.cu).
// Built only when setup.py compiles CUDA sources (it defines ICLRKIT_WITH_CUDA); a CPU-only torch never sees it.
//
// `ternary_prepack` lays the planes out for the BMMA tiles once, at load, on the device:
//   w_pos / w_neg  int32 [kh, kw, KC, O_pad, 4]   one 128-bit column per output channel (KC = 128-channel chunks,
//                                                 O_pad = O rounded up to 32; padding zeros)
//   tap_c          int32 [kh, kw, O_pad]          popc(pos) - popc(neg) per tap and output channel
//   threshold      int64 [O]                      flip  bool [O]   (the epilogue compares the sums on the device)
// `ternary_conv2d_prepacked` / `ternary_conv2d_sign_prepacked` read that layout as it is: per call only the
// activations are viewed as 32-bit words (and padded to whole 128-bit chunks when the word count is odd). The
// one-shot `ternary_conv2d` / `ternary_conv2d_sign` on raw planes are prepack + prepacked kernel in one call. Results
// are the CPU kernel's int32 sums / packed bits, bit for bit.
#ifdef ICLRKIT_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <tuple>
#include <vector>

extern "C" cudaError_t iclrkit_ternary_conv2d_bmma(const uint32_t* x, const uint32_t* pos, const uint32_t* neg,
                                                   const int32_t* tap_c, int32_t* out, int N, int H, int W, int KC,
                                                   int O, int O_pad, int kh, int kw, int stride, int pad, int binary,
                                                   cudaStream_t stream);

namespace {

using Prepacked = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

int64_t padded_channels(int64_t O) { return (O + 31) / 32 * 32; }  // whole 32-channel warp tiles

// int64 words [..., KW] -> int32 words [..., KC*4] with KW padded to an even count (128-bit chunks).
at::Tensor to_u32_chunks(const at::Tensor& words) {
  auto w = words.contiguous();
  if (w.size(-1) % 2) w = at::constant_pad_nd(w, {0, 1}, 0);
  std::vector<int64_t> shape(w.sizes().begin(), w.sizes().end());
  shape.back() *= 2;
  return w.view(at::kInt).view(shape).contiguous();
}

// [O, kh, kw, KW] int64 -> [kh, kw, KC, O_pad, 4] int32.
at::Tensor weight_tiles(const at::Tensor& planes, int64_t O_pad) {
  const int64_t O = planes.size(0);
  auto u32 = to_u32_chunks(planes);
  const int64_t KC = u32.size(-1) / 4;
  auto tiles = u32.view({O, planes.size(1), planes.size(2), KC, 4}).permute({1, 2, 3, 0, 4});
  return at::constant_pad_nd(tiles, {0, 0, 0, O_pad - O}, 0).contiguous();
}

// popc(pos) - popc(neg) per tap and output channel, counted on the device: int32 [kh, kw, O_pad].
at::Tensor tap_constants(const at::Tensor& pos, const at::Tensor& neg, int64_t O_pad) {
  const auto shifts = at::arange(64, pos.options());
  auto popc = [&](const at::Tensor& planes) {
    return at::bitwise_and(at::bitwise_right_shift(planes.unsqueeze(-1), shifts), 1).sum({-2, -1});  // [O, kh, kw]
  };
  auto counts = (popc(pos) - popc(neg)).permute({1, 2, 0});  // [kh, kw, O]
  return at::constant_pad_nd(counts, {0, O_pad - pos.size(0)}, 0).to(at::kInt).contiguous();
}

void check_planes(const at::Tensor& pos, const at::Tensor& neg, const char* op) {
  TORCH_CHECK(pos.is_cuda() && neg.device() == pos.device(), op, " (CUDA): w_pos and w_neg must be on the same GPU");
  TORCH_CHECK(pos.dim() == 4 && pos.sizes() == neg.sizes() && pos.scalar_type() == at::kLong &&
                  neg.scalar_type() == at::kLong,
              op, " (CUDA): w_pos / w_neg must be int64 [O, kh, kw, words]");
}

Prepacked prepack(const at::Tensor& pos, const at::Tensor& neg, const at::Tensor& threshold, const at::Tensor& flip) {
  const int64_t O = pos.size(0), O_pad = padded_channels(O);
  TORCH_CHECK(threshold.numel() == O && flip.numel() == O, "ternary_prepack (CUDA): one threshold and flip per "
              "output channel expected (", O, "), got ", threshold.numel(), " and ", flip.numel());
  return {weight_tiles(pos, O_pad), weight_tiles(neg, O_pad), tap_constants(pos, neg, O_pad),
          threshold.reshape(-1).to(pos.device(), at::kLong).contiguous(),
          flip.reshape(-1).to(pos.device(), at::kBool).contiguous()};
}

Prepacked ternary_prepack_cuda(const at::Tensor& pos, const at::Tensor& neg, const at::Tensor& threshold,
                               const at::Tensor& flip) {
  check_planes(pos, neg, "ternary_prepack");
  const c10::cuda::CUDAGuard guard(pos.device());
  return prepack(pos, neg, threshold, flip);
}

at::Tensor ternary_conv2d_prepacked_cuda(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& neg,
                                         const at::Tensor& tap_c, int64_t O, int64_t stride, int64_t padding,
                                         bool binary, int64_t /*impl*/) {
  const char* op = "ternary_conv2d_prepacked (CUDA)";
  TORCH_CHECK(x.is_cuda() && pos.device() == x.device() && neg.device() == x.device() &&
                  tap_c.device() == x.device(),
              op, ": x and the prepacked weights must be on the same GPU");
  const c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == at::kLong, op, ": x must be int64 [N, H, W, words]");
  TORCH_CHECK(pos.dim() == 5 && pos.size(4) == 4 && pos.scalar_type() == at::kInt && pos.is_contiguous() &&
                  neg.sizes() == pos.sizes() && neg.scalar_type() == at::kInt && neg.is_contiguous(),
              op, ": w_pos / w_neg must be the contiguous int32 [kh, kw, KC, O_pad, 4] layout of ternary_prepack "
              "on this GPU");
  const int64_t kh = pos.size(0), kw = pos.size(1), KC = pos.size(2), O_pad = pos.size(3);
  TORCH_CHECK(O >= 1 && O_pad == padded_channels(O), op, ": ", O, " output channels need O_pad ",
              padded_channels(O), ", the weights have ", O_pad, " (not the ternary_prepack layout)");
  TORCH_CHECK(tap_c.scalar_type() == at::kInt && tap_c.is_contiguous() && tap_c.dim() == 3 && tap_c.size(0) == kh &&
                  tap_c.size(1) == kw && tap_c.size(2) == O_pad,
              op, ": tap_c must be the contiguous int32 [kh, kw, O_pad] of ternary_prepack");
  TORCH_CHECK((x.size(3) + 1) / 2 == KC, op, ": activation words ", x.size(3), " do not fill the weights' ", KC,
              " 128-bit chunks");
  TORCH_CHECK(stride >= 1 && padding >= 0, op, ": stride >= 1 and padding >= 0 required");
  const int64_t H = x.size(1), W = x.size(2);
  const int64_t Ho = (H + 2 * padding - kh) / stride + 1, Wo = (W + 2 * padding - kw) / stride + 1;
  TORCH_CHECK(Ho > 0 && Wo > 0, op, ": kernel larger than the padded input");
  auto xa = to_u32_chunks(x);
  auto out = at::empty({x.size(0), Ho, Wo, O}, x.options().dtype(at::kInt));
  const auto status = iclrkit_ternary_conv2d_bmma(
      reinterpret_cast<const uint32_t*>(xa.data_ptr<int32_t>()),
      reinterpret_cast<const uint32_t*>(pos.data_ptr<int32_t>()),
      reinterpret_cast<const uint32_t*>(neg.data_ptr<int32_t>()), tap_c.data_ptr<int32_t>(), out.data_ptr<int32_t>(),
      x.size(0), H, W, KC, O, O_pad, kh, kw, stride, padding, binary, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(status == cudaSuccess, op, ": ", cudaGetErrorString(status));
  return out;
}

at::Tensor ternary_conv2d_sign_prepacked_cuda(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& neg,
                                              const at::Tensor& tap_c, const at::Tensor& threshold,
                                              const at::Tensor& flip, int64_t O, int64_t stride, int64_t padding,
                                              bool binary, int64_t impl) {
  TORCH_CHECK(threshold.device() == x.device() && flip.device() == x.device() && threshold.numel() == O &&
                  flip.numel() == O && threshold.scalar_type() == at::kLong && flip.scalar_type() == at::kBool,
              "ternary_conv2d_sign_prepacked (CUDA): threshold int64 [O] and flip bool [O] of ternary_prepack "
              "expected on x's GPU");
  auto s = ternary_conv2d_prepacked_cuda(x, pos, neg, tap_c, O, stride, padding, binary, impl).to(at::kLong);
  const int64_t words = (O + 63) / 64;
  auto bits = at::where(flip, s <= threshold, s >= threshold).to(at::kLong);
  bits = at::constant_pad_nd(bits, {0, words * 64 - O}, 0);
  std::vector<int64_t> shape(bits.sizes().begin(), bits.sizes().end() - 1);
  shape.push_back(words);
  shape.push_back(64);
  auto shifts = at::arange(64, s.options());
  return at::bitwise_left_shift(bits.view(shape), shifts).sum(-1);  // distinct powers of two: the sum is the OR
}

// One-shot ops on raw planes: they re-lay the weights on every call (tests, single calls); layers prepack at load.
at::Tensor ternary_conv2d_cuda(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& neg, int64_t stride,
                               int64_t padding, bool binary, int64_t impl) {
  check_planes(pos, neg, "ternary_conv2d");
  const c10::cuda::CUDAGuard guard(pos.device());
  const int64_t O = pos.size(0), O_pad = padded_channels(O);
  return ternary_conv2d_prepacked_cuda(x, weight_tiles(pos, O_pad), weight_tiles(neg, O_pad),
                                       tap_constants(pos, neg, O_pad), O, stride, padding, binary, impl);
}

at::Tensor ternary_conv2d_sign_cuda(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& neg,
                                    const at::Tensor& threshold, const at::Tensor& flip, int64_t stride,
                                    int64_t padding, bool binary, int64_t impl) {
  check_planes(pos, neg, "ternary_conv2d_sign");
  const c10::cuda::CUDAGuard guard(pos.device());
  const auto [P, Q, tap_c, thr, flp] = prepack(pos, neg, threshold, flip);
  return ternary_conv2d_sign_prepacked_cuda(x, P, Q, tap_c, thr, flp, pos.size(0), stride, padding, binary, impl);
}

}  // namespace

TORCH_LIBRARY_IMPL(iclrkit, CUDA, m) {
  m.impl("ternary_prepack", &ternary_prepack_cuda);
  m.impl("ternary_conv2d_prepacked", &ternary_conv2d_prepacked_cuda);
  m.impl("ternary_conv2d_sign_prepacked", &ternary_conv2d_sign_prepacked_cuda);
  m.impl("ternary_conv2d", &ternary_conv2d_cuda);
  m.impl("ternary_conv2d_sign", &ternary_conv2d_sign_cuda);
}
#endif  // ICLRKIT_WITH_CUDA
