#include "base/json_config.h"

#include <gtest/gtest.h>

#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JsonConfig, ReadsTypedValuesWithDefaults) {
  auto c = base::JsonConfig::parse(R"({"a": "x", "n": 2.5, "i": 3, "b": true, "s": ["p", "q"],
                                 "o": {"k": 1}, "arr": [{"k": 2}]})",
                                   "cfg.json");
  EXPECT_EQ(c.get_string("a"), "x");
  EXPECT_EQ(c.get_string("missing", "d"), "d");
  EXPECT_DOUBLE_EQ(c.get_number("n"), 2.5);
  EXPECT_EQ(c.get_int("i"), 3);
  EXPECT_TRUE(c.get_bool("b", false));
  EXPECT_EQ(c.get_strings("s"), (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(c.object("o").get_int("k"), 1);
  EXPECT_EQ(c.array_of_objects("arr").at(0).get_int("k"), 2);
  EXPECT_FALSE(c.optional_object("none").has_value());
}

TEST(JsonConfig, ErrorsNameFileKeyPathAndValidChoices) {
  auto c = base::JsonConfig::parse(R"({"cal": {"method": "maxx", "n": "3"}, "typo": 1})", "r.json", "docs/recipes.md");
  EXPECT_EQ(error_of([&] {
              c.allow_keys({"cal", "format"});
            }),
            "r.json: unknown key 'typo' (valid keys: cal, format) (see docs/recipes.md)");
  EXPECT_EQ(error_of([&] {
              c.object("cal").get_choice("method", {"max", "entropy"});
            }),
            "r.json: cal.method: 'maxx' is not one of: max, entropy (see docs/recipes.md)");
  EXPECT_EQ(error_of([&] { c.object("cal").get_int("n"); }), "r.json: cal.n: must be an integer (see docs/recipes.md)");
  EXPECT_EQ(error_of([&] { c.get_string("format"); }), "r.json: missing required key 'format' (see docs/recipes.md)");
  EXPECT_NE(error_of([] { base::JsonConfig::parse("{", "bad.json"); }).find("bad.json: not valid JSON"),
            std::string::npos);
  EXPECT_EQ(error_of([] { base::JsonConfig::parse("[1]", "arr.json"); }), "arr.json: the file must hold a JSON object");
}

TEST(JsonConfig, PathsAreRelativeToTheFile) {
  testing::ScratchDir dir("json-config");
  const std::string text = R"({"model": "unet.onnx", "abs": "/x/y.onnx"})";
  testing::write_bytes(dir / "p.json", {text.begin(), text.end()});
  auto c = base::JsonConfig::load(dir.path() / "p.json");
  EXPECT_EQ(c.get_path("model"), dir.path() / "unet.onnx");
  EXPECT_EQ(c.get_path("abs"), std::filesystem::path("/x/y.onnx"));
  EXPECT_NE(error_of([&] { base::JsonConfig::load(dir.path() / "none.json"); }).find("none.json: no such file"),
            std::string::npos);
}

}  // namespace
}  // namespace qeval::eval
