// Text-prompt sets for the diffusion pipelines (prompts/README.md): plain text, one prompt a line,
// or JSON Lines with {"prompt", "seed", "negative_prompt", "id"} per line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qeval::eval {

struct TextPrompt {
  std::string id;  // "p001" (1-based line) unless the JSONL line gives one
  int line = 0;    // 1-based line in the file
  std::string prompt;
  std::optional<std::uint64_t> seed;           // JSONL only: this prompt's own seed
  std::optional<std::string> negative_prompt;  // JSONL only
};

struct TextPromptSet {
  std::filesystem::path source;
  std::vector<TextPrompt> prompts;
};

// Reads a set. A file is JSONL when its first non-blank line starts with '{' (then every line
// must be an object). Blank lines and, in text files, lines starting with '#' are skipped.
// InputError naming the file and line: unknown keys, a missing or empty prompt, a seed that is not
// a non-negative integer, a duplicate id, an empty set.
TextPromptSet read_text_prompts(const std::filesystem::path& path);
TextPromptSet parse_text_prompts(const std::string& text, const std::filesystem::path& source);

}  // namespace qeval::eval
