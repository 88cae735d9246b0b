// Text-prompt sets: plain text or JSON Lines.
#include "eval/pipelines/prompt_set.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <sstream>

#include "base/file_names.h"
#include "base/input_file.h"
#include "base/json_config.h"
#include "base/utf8.h"
#include "kernels/error.h"

namespace qeval::eval {

namespace {

constexpr const char* kPromptsDoc = "prompts/README.md";

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

TextPromptSet parse_text_prompts(const std::string& text, const std::filesystem::path& source) {
  TextPromptSet set;
  set.source = source;
  std::vector<std::string> lines;
  {
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  bool jsonl = false;
  for (const auto& l : lines)
    if (!blank(l)) {
      jsonl = trim(l).front() == '{';
      break;
    }
  // Checked before anything else reads the set: a prompt that is not UTF-8 used to run to the end
  // of the evaluation and then fail writing report.json (exit 3, no report).
  for (std::size_t i = 0; i < lines.size(); ++i)
    if (const auto at = base::first_invalid_utf8(lines[i]))
      throw InputError(
          fmt::format("{}:{}: not UTF-8 text (byte 0x{:02X} at column {}); prompt files must be "
                      "UTF-8 (see {})",
                      source.string(), i + 1, static_cast<unsigned char>(lines[i][*at]), *at + 1, kPromptsDoc));
  std::set<std::string> ids;
  std::map<std::string, std::pair<std::string, int>> folders;  // lower-cased folder name -> id, line
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const int line = int(i) + 1;
    const std::string where = fmt::format("{}:{}", source.string(), line);
    if (blank(lines[i])) continue;
    TextPrompt p;
    p.line = line;
    p.id = fmt::format("p{:03d}", line);
    if (jsonl) {
      const base::JsonConfig c = base::JsonConfig::parse(lines[i], where, kPromptsDoc);
      c.allow_keys({"prompt", "seed", "negative_prompt", "id"});
      p.prompt = c.get_string("prompt");
      if (c.has("seed")) {
        const auto& v = c.value().at("seed");
        if (!v.is_number_unsigned()) c.fail("'seed' must be a non-negative integer, got " + v.dump());
        p.seed = v.get<std::uint64_t>();
      }
      if (c.has("negative_prompt")) p.negative_prompt = c.get_string("negative_prompt");
      if (c.has("id")) p.id = c.get_string("id");
    } else {
      if (trim(lines[i]).front() == '#') continue;
      p.prompt = trim(lines[i]);
    }
    if (blank(p.prompt)) throw InputError(where + ": empty prompt (see " + kPromptsDoc + ")");
    if (!ids.insert(p.id).second) throw InputError(where + ": duplicate id '" + p.id + "'");
    // qeval run writes each prompt's images to images/<file_name_for(id)>/: two ids may not share
    // one (compared ignoring case, as on case-insensitive file systems).
    if (auto [it, fresh] = folders.emplace(base::file_name_key(p.id), std::pair{p.id, line}); !fresh)
      throw InputError(
          fmt::format("{}: id '{}' and id '{}' (line {}) both give the image folder name '{}' "
                      "(characters outside [A-Za-z0-9_.-] become '_', case is ignored; {}): "
                      "rename one",
                      where, p.id, it->second.first, it->second.second, base::file_name_for(p.id), kPromptsDoc));
    set.prompts.push_back(std::move(p));
  }
  if (set.prompts.empty()) throw InputError(source.string() + ": no prompts in the file (see " + kPromptsDoc + ")");
  return set;
}

TextPromptSet read_text_prompts(const std::filesystem::path& path) {
  return parse_text_prompts(base::read_regular_file_text(path), path);
}

}  // namespace qeval::eval
