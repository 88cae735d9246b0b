// The untrained tiny-sdxl fixture (tests/data/tiny_sdxl_random: an Optimum SDXL export folder with
// PyTorch reference outputs) and the shipped, trained tiny-sdxl (models/tiny-sdxl; its references in
// tests/data/tiny_sdxl/reference), each loaded once per test binary (graphs are shared, sessions
// are not).
#pragma once

#include "eval/pipelines/txt2img.h"
#include "test_util.h"

namespace qeval::testing {

inline std::filesystem::path tiny_sdxl_random_dir() { return data_dir() / "tiny_sdxl_random"; }

inline const eval::Txt2ImgModels& tiny_sdxl_random() {
  static const eval::Txt2ImgModels models = eval::Txt2ImgModels::load(tiny_sdxl_random_dir());
  return models;
}

inline std::filesystem::path tiny_sdxl_dir() { return source_dir() / "models" / "tiny-sdxl"; }

inline const eval::Txt2ImgModels& tiny_sdxl() {
  static const eval::Txt2ImgModels models = eval::Txt2ImgModels::load(tiny_sdxl_dir());
  return models;
}

}  // namespace qeval::testing
