// Times qeval's executor on one ONNX model: median wall time of Session::run over repetitions,
// CPU time per run (all threads: the figure that survives other load on a shared machine), and
// peak activation memory. The ONNX Runtime peer (tools/ort/bench.js) is timed the same way.
// Usage: bench_executor MODEL.onnx INPUT_DIR [repetitions=20] [threads=0 (all)] [--by-op] [--float-qdq]
// --by-op also prints, on stderr, the time per op type (an observer timestamps every node, so this
// measures the unfused execution that observers see).
// --float-qdq: Q/DQ graphs run as written (no fusion into int8 kernels), to compare the two.
#include <malloc.h>
#include <sys/resource.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "eval/run/infer.h"
#include "kernels/error.h"

namespace {

// User + system CPU time of the process (all threads), in milliseconds.
double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3);
}

// Time between consecutive node events, summed per op type.
class OpTimer final : public qeval::eval::Observer {
 public:
  void start() { last_ = std::chrono::steady_clock::now(); }
  void on_node(const qeval::eval::NodeEvent& e) override {
    const auto now = std::chrono::steady_clock::now();
    if (!e.folded) {
      auto& [ms, count] = by_op_[e.node.op_type];
      ms += std::chrono::duration<double, std::milli>(now - last_).count();
      ++count;
    }
    last_ = now;
  }
  void print(int reps) const {
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (const auto& [op, v] : by_op_) rows.emplace_back(v.first / reps, op), total += v.first / reps;
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "%-24s %10s %6s %6s\n", "op", "ms/run", "share", "nodes");
    for (const auto& [ms, op] : rows)
      std::fprintf(stderr, "%-24s %10.3f %5.1f%% %6d\n", op.c_str(), ms, 100 * ms / total, by_op_.at(op).second / reps);
  }

 private:
  std::chrono::steady_clock::time_point last_;
  std::map<std::string, std::pair<double, int>> by_op_;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace qeval;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.onnx INPUT_DIR [repetitions=20] [threads=0]\n", argv[0]);
    return 2;
  }
  // The allocator setting of the qeval binary (eval/cli/main.cc), so the timings are what its
  // pipelines get.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  bool float_qdq = false, by_op = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--float-qdq") float_qdq = true;
    else if (std::string(argv[i]) == "--by-op") by_op = true;
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
      inputs.emplace(in.name,
                     datasets::read_npy(std::filesystem::path(argv[2]) / (base::file_name_for(in.name) + ".npy")));
    eval::SessionOptions options;
    options.integer_qdq = !float_qdq;
    eval::Session session(graph, options);
    session.run(inputs);  // plan + warm-up
    std::vector<double> ms;
    const double cpu0 = process_cpu_ms();
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      session.run(inputs);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    const double cpu_ms = (process_cpu_ms() - cpu0) / reps;
    std::sort(ms.begin(), ms.end());
    if (by_op) {
      OpTimer timer;
      for (int r = 0; r < reps; ++r) {
        timer.start();
        session.run(inputs, &timer);
      }
      timer.print(reps);
    }
    std::size_t weight_bytes = 0;
    for (const auto& [name, t] : graph.initializers) weight_bytes += t.nbytes();
    std::printf(
        "{\"model\": \"%s\", \"median_ms\": %.3f, \"min_ms\": %.3f, \"cpu_ms\": %.3f, \"repetitions\": %d, "
        "\"threads\": %d, \"weight_bytes\": %zu, \"peak_activation_bytes\": %zu, "
        "\"live_activation_bytes\": %zu}\n",
        argv[1], ms[ms.size() / 2], ms.front(), cpu_ms, reps, threads, weight_bytes,
        session.last_peak_activation_bytes(), session.last_live_activation_bytes());
  } catch (const InputError& e) {
    std::fprintf(stderr, "bench_executor: %s\n", e.what());
    return 2;
  }
  return 0;
}
