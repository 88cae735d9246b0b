// CLIP BPE tokenizer: ids identical to tools/train_tokenizer.py's (CLIPTokenizer's rules) on the
// golden texts, the word-splitting rule, decode, and clear errors on malformed files.
#include <gtest/gtest.h>

#include "eval/pipelines/tokenizer.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

using testing::data_dir;

std::filesystem::path tokenizer_dir() { return data_dir() / "tokenizer"; }

TEST(ClipTokenizer, LoadsTheGrammarTokenizer) {
  const ClipTokenizer t = ClipTokenizer::from_folder(tokenizer_dir());
  EXPECT_EQ(t.vocab_size(), 622u);
  EXPECT_EQ(t.merge_count(), 108u);
  EXPECT_EQ(t.bos_id(), 620);
  EXPECT_EQ(t.eos_id(), 621);
  EXPECT_EQ(t.pad_id(), 621);
  EXPECT_EQ(t.max_length(), 77);
}

TEST(ClipTokenizer, MatchesPythonIds) {
  const auto golden = testing::read_json(tokenizer_dir() / "cases.json");
  const ClipTokenizer t77 = ClipTokenizer::from_folder(tokenizer_dir());
  const ClipTokenizer t16 = ClipTokenizer::from_folder(tokenizer_dir(), {.max_length = 16});
  int checked = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string text = c.at("text");
    SCOPED_TRACE(text);
    const ClipTokenizer& t = c.contains("max_length") ? t16 : t77;
    if (c.contains("tokens")) {
      EXPECT_EQ(t.tokenize(text), c.at("tokens").get<std::vector<std::int64_t>>());
    }
    EXPECT_EQ(t.encode(text), c.at("ids").get<std::vector<std::int64_t>>());
    ++checked;
  }
  EXPECT_EQ(checked, 13);
}

TEST(ClipTokenizer, GrammarWordsAreSingleTokens) {
  const ClipTokenizer t = ClipTokenizer::from_folder(tokenizer_dir());
  const auto ids = t.encode("a small red circle at the top left on a striped yellow background");
  ASSERT_EQ(ids.size(), 77u);
  EXPECT_EQ(ids[0], t.bos_id());
  EXPECT_EQ(ids[14], t.eos_id());  // 13 words, each one token
  for (std::size_t i = 15; i < ids.size(); ++i) EXPECT_EQ(ids[i], t.pad_id());
  EXPECT_EQ(t.decode(std::span(ids).subspan(1, 13)),
            "a small red circle at the top left on a striped yellow background ");
}

TEST(ClipTokenizer, PreTokenizeFollowsClipsRegex) {
  using V = std::vector<std::string>;
  EXPECT_EQ(ClipTokenizer::pre_tokenize("  Hello,   World!! "), (V{"hello", ",", "world", "!!"}));
  EXPECT_EQ(ClipTokenizer::pre_tokenize("it's 2024"), (V{"it", "'s", "2", "0", "2", "4"}));
  EXPECT_EQ(ClipTokenizer::pre_tokenize("rock'n'roll"), (V{"rock", "'", "n", "'", "roll"}));
  EXPECT_EQ(ClipTokenizer::pre_tokenize("snake_case"), (V{"snake", "_", "case"}));
  EXPECT_EQ(ClipTokenizer::pre_tokenize("<|startoftext|>hi<|endoftext|>"),
            (V{"<|startoftext|>", "hi", "<|endoftext|>"}));
  EXPECT_EQ(ClipTokenizer::pre_tokenize("CAFÉ au lait"), (V{"café", "au", "lait"}));
  EXPECT_TRUE(ClipTokenizer::pre_tokenize(" \t\n").empty());
}

TEST(ClipTokenizer, TruncatesKeepingEos) {
  const ClipTokenizer t = ClipTokenizer::from_folder(tokenizer_dir(), {.max_length = 8});
  const auto ids = t.encode("a b c d e f g h i j k");
  ASSERT_EQ(ids.size(), 8u);
  EXPECT_EQ(ids.front(), t.bos_id());
  EXPECT_EQ(ids.back(), t.eos_id());
  EXPECT_EQ(t.encode(""), (std::vector<std::int64_t>{620, 621, 621, 621, 621, 621, 621, 621}));
}

TEST(ClipTokenizer, PadTokenIsConfigurable) {
  const ClipTokenizer t = ClipTokenizer::from_folder(tokenizer_dir(), {.max_length = 4, .pad_token = "!"});
  EXPECT_EQ(t.pad_id(), 0);
  EXPECT_EQ(t.encode("red"), (std::vector<std::int64_t>{620, t.tokenize("red")[0], 621, 0}));
  EXPECT_THROW(ClipTokenizer::from_folder(tokenizer_dir(), {.max_length = 4, .pad_token = "<pad>"}), InputError);
}

TEST(ClipTokenizer, MalformedFilesAreInputErrors) {
  testing::ScratchDir dir("tokenizer");
  const auto vocab = testing::read_bytes(tokenizer_dir() / "vocab.json");
  testing::write_bytes(dir / "vocab.json", vocab);
  const auto expect_error = [&](const std::string& merges, const std::string& needle) {
    testing::write_bytes(dir / "merges.txt", std::vector<std::uint8_t>(merges.begin(), merges.end()));
    try {
      ClipTokenizer::from_folder(dir.path());
      ADD_FAILURE() << "no error for merges: " << merges;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("#version: 0.2\na n</w>\nthree parts here\n", "merges.txt:3");
  expect_error("#version: 0.2\nx q\n", "not in vocab.json");
  EXPECT_THROW(ClipTokenizer::from_folder(dir / "missing"), InputError);
  testing::write_bytes(dir / "vocab.json", {'{', '}'});
  EXPECT_THROW(ClipTokenizer::from_folder(dir.path()), InputError);
}

}  // namespace
}  // namespace qeval::eval
