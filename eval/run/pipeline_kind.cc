// The registry of pipeline kinds: the built-in list and kinds registered at run time.
#include "eval/run/pipeline_kind.h"

#include <deque>
#include <mutex>
#include <stdexcept>

#include "eval/pipelines/pipeline_config.h"

namespace qeval::eval {

// The built-in kinds, each defined in its driver file. Adding a kind: its driver file, a
// declaration here and its line in the list below. Order matters where claims overlap: the first
// kind that claims a config's "pipeline" runs it.
PipelineKind single_model_pipeline_kind();  // single_model_driver.cc
PipelineKind txt2img_pipeline_kind();       // txt2img_driver.cc
PipelineKind segmentation_pipeline_kind();  // segmentation_driver.cc

namespace {

struct Registry {
  std::mutex mutex;
  std::deque<PipelineKind> kinds;  // a deque: registering does not move the kinds handed out
};

Registry& registry() {
  static Registry r;
  static const bool built_in = [] {
    r.kinds.push_back(single_model_pipeline_kind());
    r.kinds.push_back(txt2img_pipeline_kind());
    r.kinds.push_back(segmentation_pipeline_kind());
    return true;
  }();
  (void)built_in;
  return r;
}

}  // namespace

bool register_pipeline_kind(PipelineKind kind) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const auto& k : r.kinds)
    if (k.name == kind.name) throw std::logic_error("pipeline kind '" + kind.name + "' is registered twice");
  if (!kind.claims || !kind.load) throw std::logic_error("pipeline kind '" + kind.name + "' has no claims or load");
  r.kinds.push_back(std::move(kind));
  return true;
}

std::vector<const PipelineKind*> pipeline_kinds() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<const PipelineKind*> out;
  for (const auto& k : r.kinds) out.push_back(&k);
  return out;
}

const PipelineKind& pipeline_kind(std::string_view name) {
  for (const PipelineKind* k : pipeline_kinds())
    if (k->name == name) return *k;
  throw std::logic_error("no pipeline kind is named '" + std::string(name) + "'");
}

const PipelineKind* pipeline_kind_of(const std::filesystem::path& pipeline) {
  for (const PipelineKind* k : pipeline_kinds())
    if (k->claims(pipeline)) return k;
  return nullptr;
}

bool pipeline_json_has_task(const std::filesystem::path& pipeline, std::string_view task) {
  namespace fs = std::filesystem;
  // error_code forms: a path the system cannot look up is no pipeline.json (the reader names it).
  std::error_code ec;
  const bool json = fs::is_directory(pipeline, ec)
                        ? (fs::exists(pipeline / "pipeline.json", ec) || fs::exists(pipeline / "model_index.json", ec)) && !ec
                        : pipeline.extension() == ".json";
  return json && pipeline_task_name(read_pipeline_task(pipeline)) == task;
}

std::string pipeline_kinds_with(bool PipelineKind::*flag) {
  std::string out;
  for (const PipelineKind* k : pipeline_kinds())
    if (k->*flag) out += (out.empty() ? "" : " or ") + k->what;
  return out;
}

}  // namespace qeval::eval
