#include "eval/cli/device.h"

#include <charconv>

#include "kernels/error.h"
#ifdef QEVAL_HAVE_CUDA
#include "eval/exec/cuda/cuda_backend.h"
#endif

namespace qeval::cli {

std::shared_ptr<eval::Backend> backend_for_device(const std::string& device) {
  if (device == "cpu") return eval::cpu_backend();
  int index = 0;
  bool ok = device == "cuda";
  if (!ok && device.starts_with("cuda:")) {
    const char* first = device.data() + 5;
    const char* last = device.data() + device.size();
    const auto [end, ec] = std::from_chars(first, last, index);
    ok = ec == std::errc() && end == last && first != last && index >= 0;
  }
  if (!ok) throw InputError("--device " + device + ": expected cpu, cuda or cuda:N (N a device index, 0 first)");
#ifdef QEVAL_HAVE_CUDA
  return eval::make_cuda_backend(index);
#else
  throw InputError("--device " + device +
                   ": this qeval was built without the CUDA backend (configure with -DQEVAL_CUDA=ON on a machine "
                   "with nvcc and cuBLAS; QEVAL_CUDA=AUTO enables it when they are found)");
#endif
}

}  // namespace qeval::cli
