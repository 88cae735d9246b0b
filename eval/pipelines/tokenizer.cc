// CLIP BPE tokenizer: byte symbols, CLIP's word-splitting rule, rank-ordered merges, BOS/EOS/padding.
#include "eval/pipelines/tokenizer.h"

#include <array>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/input_file.h"
#include "kernels/error.h"

namespace qeval::eval {
namespace {

constexpr std::string_view kBos = "<|startoftext|>", kEos = "<|endoftext|>", kEndOfWord = "</w>";

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// CLIP's (GPT-2's) bytes_to_unicode: printable bytes map to themselves, the others to 256 + n.
struct ByteSymbols {
  std::array<std::string, 256> encode;                     // byte -> UTF-8 of its symbol
  std::unordered_map<std::uint32_t, std::uint8_t> decode;  // symbol code point -> byte
  ByteSymbols() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const std::uint32_t cp = printable ? static_cast<std::uint32_t>(b) : static_cast<std::uint32_t>(256 + n++);
      append_utf8(encode[b], cp);
      decode[cp] = static_cast<std::uint8_t>(b);
    }
  }
};

const ByteSymbols& byte_symbols() {
  static const ByteSymbols table;
  return table;
}

// Python's str.isspace() over ASCII (CLIP cleans with \s+).
bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1C && c <= 0x1F); }

// Length of the UTF-8 sequence starting with lead byte c (1 for stray continuation bytes).
std::size_t utf8_length(unsigned char c) {
  if (c >= 0xF0) return 4;
  if (c >= 0xE0) return 3;
  if (c >= 0xC0) return 2;
  return 1;
}

std::string clean_and_lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool pending_space = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (is_space(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    if (c >= 'A' && c <= 'Z') {
      out += static_cast<char>(c - 'A' + 'a');
    } else if (c == 0xC3 && i + 1 < text.size()) {  // Latin-1 capitals U+00C0..U+00DE but U+00D7
      const auto d = static_cast<unsigned char>(text[i + 1]);
      out += static_cast<char>(c);
      out += static_cast<char>(d >= 0x80 && d <= 0x9E && d != 0x97 ? d + 0x20 : d);
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

enum class CharClass { kSpace, kLetter, kDigit, kOther };

CharClass classify(unsigned char c) {
  if (is_space(c)) return CharClass::kSpace;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return CharClass::kLetter;
  if (c >= '0' && c <= '9') return CharClass::kDigit;
  return CharClass::kOther;
}

std::string read_text_file(const std::filesystem::path& path, const char* what) {
  try {
    return base::read_regular_file_text(path);  // a FIFO or folder there is named, not waited on
  } catch (const InputError& e) {
    throw InputError("tokenizer " + std::string(what) + ": " + e.what());
  }
}

}  // namespace

ClipTokenizer ClipTokenizer::from_files(const std::filesystem::path& vocab_json,
                                        const std::filesystem::path& merges_txt, const ClipTokenizerOptions& options) {
  if (options.max_length < 2)
    throw InputError("tokenizer max_length must be >= 2, got " + std::to_string(options.max_length));
  ClipTokenizer t;
  t.max_length_ = options.max_length;

  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_text_file(vocab_json, "vocabulary"));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(vocab_json.string() + ": not valid JSON: " + e.what());
  }
  if (!vocab.is_object() || vocab.empty())
    throw InputError(vocab_json.string() + ": expected a JSON object token -> id");
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > (1 << 24))
      throw InputError(vocab_json.string() + ": id of token \"" + token + "\" is not an integer in [0, 2^24]");
    const auto i = id.get<std::int64_t>();
    t.vocab_[token] = i;
    if (static_cast<std::size_t>(i) >= t.id_to_token_.size()) t.id_to_token_.resize(i + 1);
    t.id_to_token_[i] = token;
  }
  const auto require = [&](const std::string& token) {
    const auto it = t.vocab_.find(token);
    if (it == t.vocab_.end()) throw InputError(vocab_json.string() + ": token \"" + token + "\" is missing");
    return it->second;
  };
  for (const std::string& s : byte_symbols().encode) {
    require(s);
    require(s + std::string(kEndOfWord));
  }
  t.bos_id_ = require(std::string(kBos));
  t.eos_id_ = require(std::string(kEos));
  t.pad_id_ = require(options.pad_token);

  const std::string merges = read_text_file(merges_txt, "merges");
  std::istringstream lines(merges);
  int line_no = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const std::size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos)
      throw InputError(merges_txt.string() + ":" + std::to_string(line_no) + ": expected \"left right\", got \"" +
                       line + "\"");
    const std::string merged = line.substr(0, sp) + line.substr(sp + 1);
    if (!t.vocab_.count(merged))
      throw InputError(merges_txt.string() + ":" + std::to_string(line_no) + ": merged token \"" + merged +
                       "\" is not in " + vocab_json.filename().string());
    t.ranks_.emplace(line, static_cast<int>(t.ranks_.size()));  // the first of duplicate merges wins
  }
  return t;
}

ClipTokenizer ClipTokenizer::from_folder(const std::filesystem::path& folder, const ClipTokenizerOptions& options) {
  return from_files(folder / "vocab.json", folder / "merges.txt", options);
}

std::vector<std::string> ClipTokenizer::pre_tokenize(std::string_view raw) {
  const std::string text = clean_and_lower(raw);
  std::vector<std::string> pieces;
  const std::size_t n = text.size();
  std::size_t i = 0;
  // Alternatives in the regex's order; each match starts where the previous one ended.
  while (i < n) {
    const std::string_view rest = std::string_view(text).substr(i);
    if (rest.starts_with(kBos) || rest.starts_with(kEos)) {
      const std::size_t len = rest.starts_with(kBos) ? kBos.size() : kEos.size();
      pieces.emplace_back(rest.substr(0, len));
      i += len;
      continue;
    }
    if (rest[0] == '\'') {
      std::size_t len = 0;
      for (std::string_view c : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"})
        if (rest.starts_with(c)) {
          len = c.size();
          break;
        }
      if (len > 0) {
        pieces.emplace_back(rest.substr(0, len));
        i += len;
        continue;
      }
    }
    const CharClass cls = classify(static_cast<unsigned char>(text[i]));
    if (cls == CharClass::kSpace) {
      ++i;
      continue;
    }
    if (cls == CharClass::kDigit) {
      pieces.emplace_back(1, text[i++]);
      continue;
    }
    std::size_t j = i;
    while (j < n && classify(static_cast<unsigned char>(text[j])) == cls)
      j += cls == CharClass::kLetter ? utf8_length(static_cast<unsigned char>(text[j])) : 1;
    j = std::min(j, n);
    pieces.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return pieces;
}

std::vector<std::string> ClipTokenizer::bpe(const std::string& piece) const {
  if (piece == kBos || piece == kEos) return {piece};
  const ByteSymbols& bytes = byte_symbols();
  std::vector<std::string> word;
  word.reserve(piece.size());
  for (unsigned char c : piece) word.push_back(bytes.encode[c]);
  word.back() += kEndOfWord;
  std::string key;
  while (word.size() > 1) {
    int best_rank = std::numeric_limits<int>::max();
    std::size_t best = 0;
    for (std::size_t k = 0; k + 1 < word.size(); ++k) {
      key.assign(word[k]).append(" ").append(word[k + 1]);
      const auto it = ranks_.find(key);
      if (it != ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = k;
      }
    }
    if (best_rank == std::numeric_limits<int>::max()) break;
    const std::string first = word[best], second = word[best + 1];
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (std::size_t k = 0; k < word.size();) {
      if (k + 1 < word.size() && word[k] == first && word[k + 1] == second) {
        merged.push_back(first + second);
        k += 2;
      } else {
        merged.push_back(word[k++]);
      }
    }
    word = std::move(merged);
  }
  return word;
}

std::vector<std::int64_t> ClipTokenizer::tokenize(std::string_view text) const {
  std::vector<std::int64_t> ids;
  for (const std::string& piece : pre_tokenize(text))
    for (const std::string& token : bpe(piece)) {
      const auto it = vocab_.find(token);
      // Cannot happen for a vocabulary that passed from_files' checks; kept as a clear error.
      if (it == vocab_.end()) throw InputError("token \"" + token + "\" is not in the tokenizer's vocabulary");
      ids.push_back(it->second);
    }
  return ids;
}

std::vector<std::int64_t> ClipTokenizer::encode(std::string_view text) const {
  std::vector<std::int64_t> tokens = tokenize(text);
  std::vector<std::int64_t> ids;
  ids.reserve(max_length_);
  ids.push_back(bos_id_);
  const std::size_t keep = std::min(tokens.size(), static_cast<std::size_t>(max_length_ - 2));
  ids.insert(ids.end(), tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(keep));
  ids.push_back(eos_id_);
  ids.resize(max_length_, pad_id_);
  return ids;
}

std::string ClipTokenizer::decode(std::span<const std::int64_t> ids) const {
  std::string joined;
  for (std::int64_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size() || id_to_token_[id].empty())
      throw InputError("token id " + std::to_string(id) + " is not in the tokenizer's vocabulary");
    joined += id_to_token_[id];
  }
  const ByteSymbols& bytes = byte_symbols();
  std::string raw;
  for (std::size_t i = 0; i < joined.size();) {
    const auto c = static_cast<unsigned char>(joined[i]);
    std::uint32_t cp = c;
    std::size_t len = 1;
    if (c >= 0xE0 && i + 2 < joined.size()) {
      cp = ((c & 0x0Fu) << 12) | ((joined[i + 1] & 0x3Fu) << 6) | (joined[i + 2] & 0x3Fu);
      len = 3;
    } else if (c >= 0xC0 && i + 1 < joined.size()) {
      cp = ((c & 0x1Fu) << 6) | (joined[i + 1] & 0x3Fu);
      len = 2;
    }
    const auto it = bytes.decode.find(cp);
    if (it != bytes.decode.end()) raw += static_cast<char>(it->second);
    i += len;
  }
  std::string out;
  for (std::size_t i = 0; i < raw.size();) {
    if (std::string_view(raw).substr(i).starts_with(kEndOfWord)) {
      out += ' ';
      i += kEndOfWord.size();
    } else {
      out += raw[i++];
    }
  }
  return out;
}

}  // namespace qeval::eval
