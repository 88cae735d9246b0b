// The shipped tiny-sd pipeline, loaded once per test binary (graphs are shared, sessions are not).
#pragma once

#include "eval/pipelines/txt2img.h"
#include "test_util.h"

namespace qeval::testing {

inline std::filesystem::path tiny_sd_dir() { return source_dir() / "models" / "tiny-sd"; }

inline const eval::Txt2ImgModels& tiny_sd() {
  static const eval::Txt2ImgModels models = eval::Txt2ImgModels::load(tiny_sd_dir());
  return models;
}

}  // namespace qeval::testing
