// CLIP's byte-level BPE tokenizer (vocab.json + merges.txt), encoding as transformers' CLIPTokenizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qeval::eval {

struct ClipTokenizerOptions {
  int max_length = 77;                      // ids per prompt, BOS and EOS included
  std::string pad_token = "<|endoftext|>";  // SD 1.x pads with EOS; SD 2.x tokenizers use "!"
};

// Text -> ids the way CLIP's tokenizer does it:
//  1. runs of whitespace become one space, the ends are stripped, the text is lowercased;
//  2. CLIP's regex splits it into pieces: <|startoftext|>, <|endoftext|>, 's 't 're 've 'm 'll 'd,
//     runs of letters, single digits, runs of other non-space characters;
//  3. each piece's UTF-8 bytes map to CLIP's byte symbols, "</w>" marks the piece's end, and merges
//     apply lowest rank first; the special tokens stay whole;
//  4. encode() = BOS + tokens + EOS, cut to max_length with EOS kept last, padded with pad_token.
// Not done (the shipped models' prompts need neither): ftfy/HTML clean-up. Unicode is handled by
// a simple rule: lowercasing covers ASCII and Latin-1 capitals, and every non-ASCII code point
// counts as a letter (CLIP asks Unicode categories; they agree on letters, not on non-ASCII
// symbols or punctuation).
class ClipTokenizer {
 public:
  // Throws InputError naming the file (and line) when a file is missing or malformed, a merge's
  // result or a special token is missing from the vocabulary, or a byte symbol is absent.
  static ClipTokenizer from_files(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt,
                                  const ClipTokenizerOptions& options = {});
  // vocab.json and merges.txt in `folder` (a diffusers pipeline's tokenizer/ folder).
  static ClipTokenizer from_folder(const std::filesystem::path& folder, const ClipTokenizerOptions& options = {});

  // Steps 1-2: the pieces BPE runs on.
  static std::vector<std::string> pre_tokenize(std::string_view text);
  // Steps 1-3: token ids without BOS, EOS, truncation or padding.
  std::vector<std::int64_t> tokenize(std::string_view text) const;
  // Step 4: exactly max_length ids.
  std::vector<std::int64_t> encode(std::string_view text) const;
  // Ids back to text: tokens joined, byte symbols to bytes, "</w>" to a space (as CLIP's decode).
  std::string decode(std::span<const std::int64_t> ids) const;

  std::int64_t bos_id() const { return bos_id_; }
  std::int64_t eos_id() const { return eos_id_; }
  std::int64_t pad_id() const { return pad_id_; }
  int max_length() const { return max_length_; }
  std::size_t vocab_size() const { return id_to_token_.size(); }
  std::size_t merge_count() const { return ranks_.size(); }

 private:
  std::vector<std::string> bpe(const std::string& piece) const;

  std::unordered_map<std::string, std::int64_t> vocab_;
  std::vector<std::string> id_to_token_;        // id -> token ("" for ids the file skips)
  std::unordered_map<std::string, int> ranks_;  // "left right" -> rank
  std::int64_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0;
  int max_length_ = 77;
};

}  // namespace qeval::eval
