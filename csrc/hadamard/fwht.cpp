// Fast Walsh–Hadamard transform over the last dimension (a power of two), OpenMP-parallel over rows.
// The butterfly order matches toolkit.ops.hadamard.fwht_reference so float results agree bit for bit.
#include <torch/extension.h>

#include <cmath>

namespace {

template <typename T>
void fwht_rows(T* data, int64_t rows, int64_t n, T scale, bool apply_scale) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* x = data + r * n;
    for (int64_t h = 1; h < n; h <<= 1) {
      for (int64_t i = 0; i < n; i += 2 * h) {
        for (int64_t j = i; j < i + h; ++j) {
          const T a = x[j];
          const T b = x[j + h];
          x[j] = a + b;
          x[j + h] = a - b;
        }
      }
    }
    if (apply_scale) {
      for (int64_t j = 0; j < n; ++j) x[j] *= scale;
    }
  }
}

torch::Tensor fwht_cpu(const torch::Tensor& x, bool normalize) {
  TORCH_CHECK(x.dim() >= 1, "fwht: input must have at least one dimension");
  const int64_t n = x.size(-1);
  TORCH_CHECK(n > 0 && (n & (n - 1)) == 0, "fwht: last dimension must be a power of two, got ", n);
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kDouble,
              "fwht: float32 or float64 input expected");
  auto out = x.contiguous().clone();
  const int64_t rows = n == 0 ? 0 : out.numel() / n;
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "fwht_cpu", [&] {
    const scalar_t scale = static_cast<scalar_t>(1.0 / std::sqrt(static_cast<double>(n)));
    fwht_rows<scalar_t>(out.data_ptr<scalar_t>(), rows, n, scale, normalize);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(iclrkit, m) { m.def("fwht(Tensor x, bool normalize) -> Tensor"); }

TORCH_LIBRARY_IMPL(iclrkit, CPU, m) { m.impl("fwht", &fwht_cpu); }
