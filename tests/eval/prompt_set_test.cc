#include "eval/pipelines/prompt_set.h"

#include <gtest/gtest.h>

#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_text_prompts(text, "p.txt");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(TextPrompts, PlainTextSkipsBlankAndCommentLines) {
  const auto s = parse_text_prompts("a red circle\n\n# comment\n  a blue square  \n", "p.txt");
  ASSERT_EQ(s.prompts.size(), 2u);
  EXPECT_EQ(s.prompts[0].prompt, "a red circle");
  EXPECT_EQ(s.prompts[0].id, "p001");
  EXPECT_EQ(s.prompts[1].prompt, "a blue square");
  EXPECT_EQ(s.prompts[1].id, "p004");  // ids follow the line, so they stay stable when lines are skipped
  EXPECT_FALSE(s.prompts[1].seed);
}

TEST(TextPrompts, JsonLinesCarrySeedsNegativePromptsAndIds) {
  const auto s = parse_text_prompts(
      "{\"prompt\": \"a cat\", \"seed\": 42, \"negative_prompt\": \"blurry\"}\n{\"prompt\": \"a dog\", \"id\": "
      "\"dog\"}\n",
      "p.jsonl");
  ASSERT_EQ(s.prompts.size(), 2u);
  EXPECT_EQ(*s.prompts[0].seed, 42u);
  EXPECT_EQ(*s.prompts[0].negative_prompt, "blurry");
  EXPECT_EQ(s.prompts[1].id, "dog");
}

TEST(TextPrompts, ErrorsNameFileAndLine) {
  EXPECT_NE(error_of("{\"prompt\": \"a\", \"sed\": 1}").find("p.txt:1"), std::string::npos);
  EXPECT_NE(error_of("{\"prompt\": \"a\", \"sed\": 1}").find("unknown key 'sed'"), std::string::npos);
  EXPECT_NE(error_of("{\"prompt\": \"a\"}\n{\"prompt\": \"b\", \"seed\": -3}").find("p.txt:2"), std::string::npos);
  EXPECT_NE(error_of("{\"prompt\": \"\"}").find("empty prompt"), std::string::npos);
  EXPECT_NE(error_of("{\"prompt\": \"a\", \"id\": \"x\"}\n{\"prompt\": \"b\", \"id\": \"x\"}").find("duplicate id"),
            std::string::npos);
  EXPECT_NE(error_of("\n\n").find("no prompts"), std::string::npos);
  EXPECT_THROW(read_text_prompts("/nonexistent/prompts.txt"), InputError);
}

// qeval run names each prompt's image folder after its id: ids that give one folder name are an
// error naming both lines (a/b and a:b both become a_b; A_b too, on a case-insensitive disk).
TEST(TextPrompts, IdsThatShareAnImageFolderNameAreRejected) {
  for (const char* second : {"a:b", "A_b"}) {
    const std::string text =
        std::string("{\"prompt\": \"x\", \"id\": \"a/b\"}\n{\"prompt\": \"y\", \"id\": \"") + second + "\"}";
    const std::string e = error_of(text);
    EXPECT_NE(e.find("p.txt:2"), std::string::npos) << e;
    EXPECT_NE(e.find("'a/b' (line 1)"), std::string::npos) << e;
    EXPECT_NE(e.find("both give the image folder name"), std::string::npos) << e;
  }
  // Distinct folder names still load.
  EXPECT_EQ(parse_text_prompts("{\"prompt\": \"x\", \"id\": \"a/b\"}\n{\"prompt\": \"y\", \"id\": \"a/c\"}", "p.txt")
                .prompts.size(),
            2u);
}

TEST(TextPrompts, ShippedSetsRead) {
  EXPECT_EQ(read_text_prompts(testing::source_dir() / "prompts/tiny_eval.txt").prompts.size(), 64u);
  EXPECT_EQ(read_text_prompts(testing::source_dir() / "prompts/tiny_calib.txt").prompts.size(), 192u);
}

}  // namespace
}  // namespace qeval::eval
