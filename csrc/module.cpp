// The toolkit._C Python module; kernels register themselves as torch.ops.iclrkit.* in their own files.
#include <torch/extension.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "iclrkit compiled kernels (torch.ops.iclrkit)";
#ifdef ICLRKIT_WITH_CUDA
  m.attr("cuda_built") = true;
#else
  m.attr("cuda_built") = false;
#endif
}
