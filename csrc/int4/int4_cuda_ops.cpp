// CUDA registration of the INT4 ops (kernels in int4_gemm_cuda.cu and w4a16_cuda.cu): the same op names and
// arguments as the CPU kernels / references, so `torch.ops.iclrkit.int4_gemm(...)` runs on whichever device its
// tensors live on. Built only when setup.py compiles CUDA sources (it defines ICLRKIT_WITH_CUDA).
#ifdef ICLRKIT_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

extern "C" cudaError_t iclrkit_int4_gemm_w4a8(const int8_t* x, const uint8_t* w, const float* x_scale,
                                              const float* w_scale, float* y, int64_t m, int64_t n, int64_t kp,
                                              cudaStream_t stream);
extern "C" cudaError_t iclrkit_int4_gemm_24_w4a8(const int8_t* x, const uint8_t* values, const uint8_t* meta,
                                                 const float* x_scale, const float* w_scale, float* y, int64_t m,
                                                 int64_t n, int64_t kp, cudaStream_t stream);
extern "C" cudaError_t iclrkit_int4_gemm_s4(const uint8_t* x, const uint8_t* w, const float* x_scale,
                                            const float* w_scale, float* y, int64_t m, int64_t n, int64_t kp,
                                            cudaStream_t stream);
extern "C" cudaError_t iclrkit_w4a16_gemm(const void* x, const int32_t* w, const float* scale, void* y, int64_t m,
                                          int64_t n, int64_t kp, int bf16, cudaStream_t stream);

namespace {

constexpr int64_t kBlock = 128;

void check_device(const at::Tensor& ref, const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == ref.device(), op, ": ", name, " must be on ", ref.device(), ", got ",
              t.device());
}

void check_status(cudaError_t status, const char* op) {
  TORCH_CHECK(status == cudaSuccess, op, " (CUDA): ", cudaGetErrorString(status));
}

// int8 codes [M, K] -> [M, Kp], zero columns appended (a zero activation adds nothing).
at::Tensor pad_columns(const at::Tensor& x, int64_t kp) {
  const auto c = x.contiguous();
  return c.size(1) == kp ? c : at::constant_pad_nd(c, {0, kp - c.size(1)}, 0);
}

at::Tensor w4a8(const at::Tensor& xq, const at::Tensor& x_scale, const at::Tensor& w, const at::Tensor* meta,
                const at::Tensor& w_scale, int64_t k, const char* op) {
  for (const at::Tensor* t : {&x_scale, &w, &w_scale}) check_device(xq, *t, op, "every argument");
  if (meta) check_device(xq, *meta, op, "meta");
  TORCH_CHECK(xq.dim() == 2 && xq.scalar_type() == at::kChar && xq.size(1) == k, op, ": x must be int8 [M, ", k, "]");
  TORCH_CHECK(x_scale.scalar_type() == at::kFloat && x_scale.numel() == xq.size(0), op,
              ": x_scale must be float32 [M]");
  TORCH_CHECK(w_scale.scalar_type() == at::kFloat, op, ": w_scale must be float32 [N]");
  const int64_t n = w_scale.numel(), kp = (k + kBlock - 1) / kBlock * kBlock;
  const int64_t bytes = meta ? kp / 4 : kp / 2;
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.size(0) == n && w.size(1) == bytes, op,
              ": packed weights must be uint8 [", n, ", ", bytes, "]");
  if (meta)
    TORCH_CHECK(meta->scalar_type() == at::kByte && meta->dim() == 2 && meta->size(0) == n && meta->size(1) == kp / 8,
                op, ": metadata must be uint8 [", n, ", ", kp / 8, "]");
  const c10::cuda::CUDAGuard guard(xq.device());
  const auto x = pad_columns(xq, kp), xs = x_scale.contiguous(), wc = w.contiguous(), ws = w_scale.contiguous();
  auto y = at::empty({xq.size(0), n}, xq.options().dtype(at::kFloat));
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  if (meta) {
    const auto mc = meta->contiguous();
    check_status(iclrkit_int4_gemm_24_w4a8(x.data_ptr<int8_t>(), wc.data_ptr<uint8_t>(), mc.data_ptr<uint8_t>(),
                                           xs.data_ptr<float>(), ws.data_ptr<float>(), y.data_ptr<float>(),
                                           xq.size(0), n, kp, stream),
                 op);
  } else {
    check_status(iclrkit_int4_gemm_w4a8(x.data_ptr<int8_t>(), wc.data_ptr<uint8_t>(), xs.data_ptr<float>(),
                                        ws.data_ptr<float>(), y.data_ptr<float>(), xq.size(0), n, kp, stream),
                 op);
  }
  return y;
}

// `rowsum` and `path` belong to the CPU kernels (the +128 activation offset, the SIMD path); the s8 MMA multiplies
// signed codes directly and has one path.
at::Tensor int4_gemm_cuda(const at::Tensor& xq, const at::Tensor& x_scale, const at::Tensor& w,
                          const at::Tensor& w_scale, const at::Tensor& /*rowsum*/, int64_t k, std::string /*path*/) {
  return w4a8(xq, x_scale, w, nullptr, w_scale, k, "int4_gemm");
}

at::Tensor int4_gemm_24_cuda(const at::Tensor& xq, const at::Tensor& x_scale, const at::Tensor& values,
                             const at::Tensor& meta, const at::Tensor& w_scale, const at::Tensor& /*rowsum*/,
                             int64_t k, std::string /*path*/) {
  return w4a8(xq, x_scale, values, &meta, w_scale, k, "int4_gemm_24");
}

at::Tensor int4_gemm_s4_cuda(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& w,
                             const at::Tensor& w_scale, int64_t kp) {
  for (const at::Tensor* t : {&x_scale, &w, &w_scale}) check_device(x, *t, "int4_gemm_s4", "every argument");
  TORCH_CHECK(x.scalar_type() == at::kByte && w.scalar_type() == at::kByte && x.dim() == 2 && w.dim() == 2,
              "int4_gemm_s4: x and w must be uint8 nibble matrices");
  TORCH_CHECK(kp % 64 == 0 && x.size(1) * 2 == kp && w.size(1) * 2 == kp, "int4_gemm_s4: x and w need Kp/2 bytes "
              "per row, Kp a multiple of 64");
  TORCH_CHECK(x_scale.numel() == x.size(0) && w_scale.numel() == w.size(0) && x_scale.scalar_type() == at::kFloat &&
                  w_scale.scalar_type() == at::kFloat,
              "int4_gemm_s4: float32 scales [M] and [N] expected");
  const c10::cuda::CUDAGuard guard(x.device());
  const auto xc = x.contiguous(), wc = w.contiguous(), xs = x_scale.contiguous(), ws = w_scale.contiguous();
  auto y = at::empty({x.size(0), w.size(0)}, x.options().dtype(at::kFloat));
  check_status(iclrkit_int4_gemm_s4(xc.data_ptr<uint8_t>(), wc.data_ptr<uint8_t>(), xs.data_ptr<float>(),
                                    ws.data_ptr<float>(), y.data_ptr<float>(), x.size(0), w.size(0), kp,
                                    c10::cuda::getCurrentCUDAStream().stream()),
               "int4_gemm_s4");
  return y;
}

at::Tensor w4a16_gemm_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t n,
                           int64_t k) {
  check_device(x, w, "w4a16_gemm", "w");
  check_device(x, scales, "w4a16_gemm", "scales");
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16,
              "w4a16_gemm (CUDA): activations must be float16 or bfloat16 (W4A16), got ", x.scalar_type(),
              "; load the model with --dtype float16 or bfloat16");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k, "w4a16_gemm: x must be [M, ", k, "]");
  const int64_t kp = (k + 63) / 64 * 64, tiles = (n + 15) / 16;
  TORCH_CHECK(w.scalar_type() == at::kInt && w.dim() == 4 && w.size(0) == tiles && w.size(1) == kp / 64 &&
                  w.size(2) == 32 && w.size(3) == 4,
              "w4a16_gemm: weights must be the int32 [", tiles, ", ", kp / 64, ", 32, 4] layout of w4a16_layout");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == n, "w4a16_gemm: scales must be float32 [", n,
              "]");
  const c10::cuda::CUDAGuard guard(x.device());
  auto xc = x.contiguous();
  if (kp != k) xc = at::constant_pad_nd(xc, {0, kp - k}, 0);
  const auto wc = w.contiguous(), sc = scales.contiguous();
  auto y = at::empty({x.size(0), n}, x.options());
  check_status(iclrkit_w4a16_gemm(xc.data_ptr(), wc.data_ptr<int32_t>(), sc.data_ptr<float>(), y.data_ptr(),
                                  x.size(0), n, kp, x.scalar_type() == at::kBFloat16 ? 1 : 0,
                                  c10::cuda::getCurrentCUDAStream().stream()),
               "w4a16_gemm");
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(iclrkit, CUDA, m) {
  m.impl("int4_gemm", &int4_gemm_cuda);
  m.impl("int4_gemm_24", &int4_gemm_24_cuda);
  m.impl("int4_gemm_s4", &int4_gemm_s4_cuda);
  m.impl("w4a16_gemm", &w4a16_gemm_cuda);
}
#endif  // ICLRKIT_WITH_CUDA
