// Times qeval's executor on one ONNX model: median wall time of Session::run over repetitions,
// and peak activation memory. The ONNX Runtime peer (tools/ort/bench.js) is timed the same way.
// Usage: bench_executor MODEL.onnx INPUT_DIR [repetitions=20] [threads=0 (all)] [--float-qdq]
// --float-qdq: Q/DQ graphs run as written (no fusion into int8 kernels), to compare the two.
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "datasets/npy.h"
#include "eval/infer.h"
#include "eval/onnx_import.h"
#include "eval/session.h"
#include "kernels/error.h"

int main(int argc, char** argv) {
  using namespace qeval;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.onnx INPUT_DIR [repetitions=20] [threads=0]\n", argv[0]);
    return 2;
  }
  bool float_qdq = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--float-qdq") float_qdq = true;
    else args.push_back(argv[i]);
  }
  argc = int(args.size());
  argv = args.data();
  const int reps = argc > 3 ? std::atoi(argv[3]) : 20;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 0;
  std::unique_ptr<tbb::global_control> limit;
  if (threads > 0)
    limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
  try {
    eval::Graph graph = eval::load_onnx(argv[1]);
    std::map<std::string, Tensor> inputs;
    for (const auto& in : graph.inputs)
      inputs.emplace(in.name, datasets::read_npy(std::filesystem::path(argv[2]) / (eval::tensor_file_name(in.name) + ".npy")));
    eval::SessionOptions options;
    options.integer_qdq = !float_qdq;
    eval::Session session(graph, options);
    session.run(inputs);  // plan + warm-up
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      session.run(inputs);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::size_t weight_bytes = 0;
    for (const auto& [name, t] : graph.initializers) weight_bytes += t.nbytes();
    std::printf("{\"model\": \"%s\", \"median_ms\": %.3f, \"min_ms\": %.3f, \"repetitions\": %d, "
                "\"threads\": %d, \"weight_bytes\": %zu, \"peak_activation_bytes\": %zu, "
                "\"live_activation_bytes\": %zu}\n",
                argv[1], ms[ms.size() / 2], ms.front(), reps, threads, weight_bytes,
                session.last_peak_activation_bytes(), session.last_live_activation_bytes());
  } catch (const InputError& e) {
    std::fprintf(stderr, "bench_executor: %s\n", e.what());
    return 2;
  }
  return 0;
}
