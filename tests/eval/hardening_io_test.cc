// Bad files, names and messages (issue 21): image pairing that never drops a file, entries that are
// not regular files named for what they are, file names and prompts that are not UTF-8, tensor
// names that sanitise alike, the pixel limit of the decoders, and plain-word CLI messages.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "base/file_names.h"
#include "base/input_file.h"
#include "base/json_config.h"
#include "base/utf8.h"
#include "datasets/image_io.h"
#include "datasets/image_limits.h"
#include "datasets/image_set.h"
#include "datasets/npy.h"
#include "eval/pipelines/prompt_set.h"
#include "eval/run/gate.h"
#include "input_error.h"
#include "kernels/error.h"
#include "onnx_builder.h"
#include "reports/json_text.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;

using testing::contains;
using testing::input_error;

void write_png(const fs::path& p, unsigned seed) {
  testing::write_bytes(p, datasets::encode_png(testing::pattern(24, 16, 3, seed)));
}

// ---- 1. pairing: every file is compared or reported --------------------------------------------

TEST(ImagePairing, ASecondTestFileWithTheSameStemIsReportedNotDropped) {
  testing::ScratchDir dir("pair-stem");
  write_png(dir / "ref/x.png", 1);
  write_png(dir / "test/x.png", 1);
  write_png(dir / "test/x.jpg", 1);  // sorts before x.png: it used to take the pair, then lose it
  const auto pairs = datasets::pair_image_sets(dir / "ref", dir / "test");
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].name, "x.jpg");
  EXPECT_FALSE(pairs[0].ref);
  ASSERT_TRUE(pairs[0].test);
  EXPECT_EQ(pairs[0].test->filename(), "x.jpg");
  EXPECT_EQ(pairs[1].name, "x.png");
  ASSERT_TRUE(pairs[1].ref && pairs[1].test);
  EXPECT_EQ(pairs[1].test->filename(), "x.png");  // the exact name wins over the stem

  // The mirror case (two references, one test) keeps reporting the unpaired reference.
  write_png(dir / "ref/y.png", 2);
  write_png(dir / "ref/y.jpg", 2);
  write_png(dir / "test/y.png", 2);
  const auto mirror = datasets::pair_image_sets(dir / "ref", dir / "test");
  ASSERT_EQ(mirror.size(), 4u);
  EXPECT_EQ(mirror[2].name, "y.jpg");
  EXPECT_TRUE(mirror[2].ref && !mirror[2].test);

  // A stem match still pairs when there is no exact name.
  write_png(dir / "ref/z.png", 3);
  write_png(dir / "test/z.jpeg", 3);
  const auto stem = datasets::pair_image_sets(dir / "ref", dir / "test");
  ASSERT_EQ(stem.size(), 5u);
  EXPECT_EQ(stem[4].name, "z.png");
  ASSERT_TRUE(stem[4].test);
  EXPECT_EQ(stem[4].test->filename(), "z.jpeg");

  // A symlinked file keeps its own name (fs::relative named it after its target).
  write_png(dir / "elsewhere/target.png", 3);
  fs::create_symlink("../elsewhere/target.png", dir / "test/z.png");
  const auto linked = datasets::pair_image_sets(dir / "ref", dir / "test");
  ASSERT_EQ(linked.size(), 6u);
  EXPECT_EQ(linked[4].name, "z.jpeg");  // the exact name took the pair from the stem
  EXPECT_EQ(linked[5].name, "z.png");
  ASSERT_TRUE(linked[5].test);
  EXPECT_EQ(linked[5].test->filename(), "z.png");

  const auto r = testing::run_qeval("compare-images --ref " + (dir / "ref").string() + " --test " +
                                    (dir / "test").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "error: x.jpg: no reference image with this name")) << r.out;
  EXPECT_TRUE(contains(r.out, "error: z.jpeg: no reference image with this name")) << r.out;
}

// ---- 2. entries that are not regular files -----------------------------------------------------

TEST(NonRegularFiles, EachIsNamedForWhatItIsAndAFifoNeverBlocks) {
  testing::ScratchDir dir("non-regular");
  for (const char* name : {"dir.png", "dangling.png", "loop.png", "fifo.png", "ok.png"})
    write_png(dir / "ref" / name, 4);
  write_png(dir / "test/ok.png", 4);
  fs::create_directories(dir / "test/dir.png");
  fs::create_symlink("/nonexistent/qeval/target.png", dir / "test/dangling.png");
  fs::create_symlink("loop.png", dir / "test/loop.png");
  ASSERT_EQ(::mkfifo((dir / "test/fifo.png").c_str(), 0600), 0);
  // Only on the reference side, with no test counterpart: listed all the same.
  ASSERT_EQ(::mkfifo((dir / "ref/only.png").c_str(), 0600), 0);

  const auto start = std::chrono::steady_clock::now();
  const auto r = testing::run_qeval("compare-images --ref " + (dir / "ref").string() + " --test " +
                                    (dir / "test").string() + " --out " + (dir / "out").string());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(r.code, 1) << r.out;
  const std::string test = (dir / "test").string();
  for (const std::string& want :
       {test + "/dir.png: is a directory, not a regular file",
        test + "/dangling.png: is a dangling symlink to '/nonexistent/qeval/target.png'",
        test + "/loop.png: is a symlink loop", test + "/fifo.png: is a FIFO (named pipe), not a regular file",
        std::string("only.png: no test image with this name")})
    EXPECT_TRUE(contains(r.out, want)) << want << "\n" << r.out;
  EXPECT_FALSE(contains(r.out, "dir.png: no test image")) << r.out;
  EXPECT_TRUE(contains(r.out, "6 pairs, 1 compared")) << r.out;

  // Wherever an image path is read (qeval segment --image, masks, point prompts): load_image.
  EXPECT_TRUE(contains(input_error([&] { datasets::load_image(dir / "test/fifo.png"); }), "is a FIFO")) << "load_image";
  EXPECT_EQ(base::describe_non_regular(dir / "test/loop.png").rfind("is a symlink loop", 0), 0u);
  EXPECT_EQ(base::describe_non_regular(dir / "test/ok.png"), "");
  EXPECT_EQ(base::describe_non_regular(dir / "nothing.png"), "no such file");
  EXPECT_TRUE(contains(input_error([&] { datasets::read_npy(dir / "test/fifo.png"); }), "is a FIFO"));

  // Configs, gates, prompt sets: a FIFO or a folder given as the file fails at once, saying so.
  // Should a reader block in open(), a writer comes after 5 s and closes, so the test fails
  // instead of hanging.
  const fs::path fifo = dir / "test/fifo.png";
  std::atomic<bool> done{false};
  std::thread unblock([&] {
    for (int i = 0; !done; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (i < 100) continue;
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // succeeds only with a reader waiting
      if (fd >= 0) ::close(fd);
    }
  });
  for (const std::string& command :
       {std::string("run --config "), "compare-images --ref " + (dir / "ref").string() + " --test " +
                                          (dir / "test").string() + " --out " + (dir / "o2").string() + " --gate "}) {
    const auto cli = testing::run_qeval(command + fifo.string());
    EXPECT_EQ(cli.code, 2) << command << cli.out;
    EXPECT_TRUE(contains(cli.out, fifo.string() + ": is a FIFO (named pipe), not a regular file")) << cli.out;
  }
  done = true;
  unblock.join();
  EXPECT_TRUE(contains(input_error([&] { read_text_prompts(dir / "test/dir.png"); }), "is a directory"));
  EXPECT_TRUE(contains(input_error([&] { base::JsonConfig::load(dir / "test/dir.png"); }), "is a directory"));
}

// ---- 3. text that is not UTF-8 -----------------------------------------------------------------

TEST(Utf8, ValidationAndTheEscapedDisplayForm) {
  EXPECT_FALSE(base::first_invalid_utf8("plain, caf\xC3\xA9, \xE2\x82\xAC, \xF0\x9F\x98\x80"));
  EXPECT_EQ(base::first_invalid_utf8("ab\xFF"), 2u);
  EXPECT_EQ(base::first_invalid_utf8("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(base::first_invalid_utf8("x\xED\xA0\x80"), 1u);     // a surrogate
  EXPECT_EQ(base::first_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // past U+10FFFF
  EXPECT_EQ(base::first_invalid_utf8("\xE2\x82"), 0u);          // cut short
  EXPECT_EQ(base::escape_invalid_utf8("bad\xFF\xC3\xA9.png"), "bad\\xFF\xC3\xA9.png");
  EXPECT_EQ(reports::dump_json_utf8_safe(nlohmann::json{{"n\xFE", "a\xFF"}}), "{\"n\\\\xFE\":\"a\\\\xFF\"}");
}

TEST(Utf8, AFileNameThatIsNotUtf8IsComparedAndEscapedInTheReports) {
  testing::ScratchDir dir("utf8-name");
  const std::string bad = "bad\xFF.png";
  write_png(dir / "ref" / bad, 5);
  write_png(dir / "test" / bad, 5);
  const auto r = testing::run_qeval("compare-images --ref " + (dir / "ref").string() + " --test " +
                                    (dir / "test").string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;  // was exit 3: nlohmann::json refused the name
  const auto report = testing::read_json(dir / "out/report.json");
  ASSERT_EQ(report.at("pairs").size(), 1u);
  EXPECT_EQ(report.at("pairs")[0].at("name"), "bad\\xFF.png");
  EXPECT_TRUE(contains(testing::read_text(dir / "out/report.html"), "bad\\xFF.png"));
  EXPECT_FALSE(contains(testing::read_text(dir / "out/junit.xml"), "\xFF"));
}

TEST(Utf8, APromptFileThatIsNotUtf8FailsAtLoadWithFileAndLine) {
  testing::ScratchDir dir("utf8-prompts");
  const fs::path plain = testing::write_text(dir, "p.txt",
                                             "a red cube\na gr\xE9"
                                             "en sphere\n");
  const std::string e = input_error([&] { read_text_prompts(plain); });
  EXPECT_TRUE(contains(e, plain.string() + ":2: not UTF-8 text (byte 0xE9 at column 5)")) << e;
  const fs::path jsonl = testing::write_text(dir, "p.jsonl", "{\"prompt\": \"ok\"}\n{\"prompt\": \"\xFF\"}\n");
  EXPECT_TRUE(contains(input_error([&] { read_text_prompts(jsonl); }), jsonl.string() + ":2: not UTF-8"));
  EXPECT_EQ(read_text_prompts(testing::write_text(dir, "ok.txt", "caf\xC3\xA9\n")).prompts.at(0).prompt, "caf\xC3\xA9");

  // qeval run stops at load, before any model call (it used to run to the end, then exit 3).
  const fs::path config = testing::write_text(
      dir, "run.json",
      R"({"pipeline": ")" + (testing::source_dir() / "models" / "tiny-sd").string() + R"(", "prompts": "p.txt",
          "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}]})");
  const auto start = std::chrono::steady_clock::now();
  const auto r = testing::run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "p.txt:2: not UTF-8 text")) << r.out;
}

// ---- 4. tensor names that sanitise alike -------------------------------------------------------

TEST(FileNames, OneRuleAndUniqueStemsPerFolder) {
  EXPECT_EQ(base::file_name_for("a/b:0 c"), "a_b_0_c");
  EXPECT_EQ(base::file_name_for(""), "_");
  EXPECT_EQ(base::file_name_for(".."), "_.");
  EXPECT_EQ(base::file_name_for(".hidden"), "_hidden");
  EXPECT_EQ(base::file_name_for(std::string(300, 'x')).size(), 200u);
  base::FileNamer names;
  EXPECT_EQ(names.stem("a/b"), "a_b");
  EXPECT_EQ(names.stem("a:b"), "a_b__2");
  EXPECT_EQ(names.stem("a_b__2"), "a_b__2__2");  // a real name never takes a given stem
  EXPECT_EQ(names.stem("A:B"), "A_B__3");        // case-insensitive file systems: a_b is taken
  EXPECT_EQ(names.stem("a/b"), "a_b");           // the same name, the same file
}

TEST(FileNames, InferWritesEveryOutputToItsOwnFileAndTheMapping) {
  testing::ScratchDir dir("infer-names");
  testing::OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {3})
      .output("a/b", onnx::TensorProto::FLOAT)
      .output("a:b", onnx::TensorProto::FLOAT);
  b.node("Relu", {"x"}, {"a/b"}, "relu");
  b.node("Neg", {"x"}, {"a:b"}, "neg");
  testing::write_bytes(dir / "m.onnx", b.bytes());
  fs::create_directories(dir / "in");
  datasets::write_npy(dir / "in/x.npy", testing::floats({3}, {1, -2, 3}));
  const auto r = testing::run_qeval("infer --model " + (dir / "m.onnx").string() + " --inputs " +
                                    (dir / "in").string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "output a/b [3] -> " + (dir / "out").string() + "/a_b.npy")) << r.out;
  EXPECT_TRUE(contains(r.out, "output a:b [3] -> " + (dir / "out").string() + "/a_b__2.npy")) << r.out;
  EXPECT_EQ(datasets::read_npy(dir / "out/a_b.npy").data<float>()[1], 0.0f);     // relu
  EXPECT_EQ(datasets::read_npy(dir / "out/a_b__2.npy").data<float>()[1], 2.0f);  // neg
  const auto index = testing::read_json(dir / "out/outputs.json").at("outputs");
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[0].at("tensor"), "a/b");
  EXPECT_EQ(index[0].at("file"), "a_b.npy");
  EXPECT_EQ(index[1].at("tensor"), "a:b");
  EXPECT_EQ(index[1].at("file"), "a_b__2.npy");
  EXPECT_EQ(index[1].at("shape"), nlohmann::json::array({3}));

  // --dump-all follows the same rule (the graph outputs are node outputs too).
  const auto d =
      testing::run_qeval("infer --model " + (dir / "m.onnx").string() + " --inputs " + (dir / "in").string() +
                         " --out " + (dir / "out").string() + " --dump-all " + (dir / "dump").string());
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_TRUE(fs::exists(dir / "dump/a_b.npy") && fs::exists(dir / "dump/a_b__2.npy"));
}

// ---- 5. pixel limit ----------------------------------------------------------------------------

std::uint32_t crc32(const std::uint8_t* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void put_be32(std::uint8_t* p, std::uint32_t v) {
  p[0] = std::uint8_t(v >> 24), p[1] = std::uint8_t(v >> 16), p[2] = std::uint8_t(v >> 8), p[3] = std::uint8_t(v);
}

// A small valid PNG whose IHDR claims width x height (its CRC fixed), the rest of the file as is.
std::vector<std::uint8_t> png_claiming(std::uint32_t width, std::uint32_t height) {
  auto bytes = datasets::encode_png(testing::pattern(4, 4, 3, 6));
  put_be32(&bytes[16], width);
  put_be32(&bytes[20], height);
  put_be32(&bytes[29], crc32(&bytes[12], 17));  // "IHDR" + 13 data bytes
  return bytes;
}

TEST(PixelLimit, DecodersCheckTheHeaderBeforeAllocating) {
  const auto huge = png_claiming(20000, 20000);
  const std::string e = input_error([&] { datasets::decode_image(huge, "big.png"); });
  EXPECT_TRUE(contains(e,
                       "big.png: PNG too large: the image is 20000x20000 = 400000000 pixels, more than the limit "
                       "of 67108864 (QEVAL_MAX_PIXELS raises it)"))
      << e;
  // An explicit limit, and the limit at its edge.
  const auto small = datasets::encode_png(testing::pattern(10, 10, 3, 7));
  EXPECT_TRUE(contains(input_error([&] { datasets::decode_image(small, "s.png", 99); }), "10x10 = 100 pixels"));
  EXPECT_EQ(datasets::decode_image(small, "s.png", 100).width(), 10);

  // JPEG: the SOF0 frame header of a real file patched to claim 30000 x 30000.
  auto jpeg = testing::read_bytes(testing::data_dir() / "images" / "photo.jpg");
  std::size_t sof = 2;
  while (sof + 9 < jpeg.size() && !(jpeg[sof] == 0xFF && (jpeg[sof + 1] == 0xC0 || jpeg[sof + 1] == 0xC2)))
    sof += 2 + (std::size_t(jpeg[sof + 2]) << 8 | jpeg[sof + 3]);
  ASSERT_LT(sof + 9, jpeg.size());
  jpeg[sof + 5] = 30000 >> 8, jpeg[sof + 6] = 30000 & 255, jpeg[sof + 7] = 30000 >> 8, jpeg[sof + 8] = 30000 & 255;
  EXPECT_TRUE(contains(input_error([&] { datasets::decode_image(jpeg, "big.jpg"); }),
                       "big.jpg: JPEG too large: the image is 30000x30000"))
      << "jpeg";
}

TEST(PixelLimit, TheEnvironmentVariableOverridesItAndIsChecked) {
  testing::ScratchDir dir("pixel-limit");
  write_png(dir / "ref/a.png", 8);  // 24 x 16 = 384 pixels
  write_png(dir / "test/a.png", 8);
  const std::string args = "compare-images --ref " + (dir / "ref").string() + " --test " + (dir / "test").string() +
                           " --out " + (dir / "out").string();
  // The child inherits this process's environment.
  ::setenv("QEVAL_MAX_PIXELS", "383", 1);
  const auto r = testing::run_qeval(args);
  ::setenv("QEVAL_MAX_PIXELS", "abc", 1);
  const auto bad = testing::run_qeval(args);
  ::unsetenv("QEVAL_MAX_PIXELS");
  const auto fits = testing::run_qeval(args);
  EXPECT_EQ(fits.code, 0) << fits.out;
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "a.png: PNG too large: the image is 24x16 = 384 pixels, more than the limit of 383"))
      << r.out;
  EXPECT_TRUE(contains(bad.out, "QEVAL_MAX_PIXELS='abc': expected a positive whole number")) << bad.out;
  // A tiny file claiming 20000 x 20000 is refused from its header (it cost 1.2 GB before).
  testing::write_bytes(dir / "ref/b.png", png_claiming(20000, 20000));
  testing::write_bytes(dir / "test/b.png", png_claiming(20000, 20000));
  const auto huge = testing::run_qeval(args);
  EXPECT_EQ(huge.code, 1) << huge.out;
  EXPECT_TRUE(contains(huge.out, "b.png: PNG too large: the image is 20000x20000")) << huge.out;
}

// ---- 6. messages -------------------------------------------------------------------------------

TEST(CliMessages, NumbersAndVerbsInPlainWords) {
  const auto count = testing::run_qeval("run --count 0");
  EXPECT_EQ(count.code, 2);
  EXPECT_TRUE(contains(count.out, "--count: 0 is too small (expected a whole number >= 1)")) << count.out;
  EXPECT_FALSE(contains(count.out, "179769313")) << count.out;
  const auto threads = testing::run_qeval("--threads abc compare-images --ref a --test b --out c");
  EXPECT_EQ(threads.code, 2);
  EXPECT_TRUE(contains(threads.out, "'abc' is not a whole number")) << threads.out;
  EXPECT_FALSE(contains(threads.out, "179769313")) << threads.out;
  const auto peak = testing::run_qeval("compare-images --ref a --test b --out c --peak -1");
  EXPECT_TRUE(contains(peak.out, "--peak: -1 is too small (expected a number > 0)")) << peak.out;

  const auto verb = testing::run_qeval("frobnicate --x 1");
  EXPECT_EQ(verb.code, 2);
  EXPECT_TRUE(contains(verb.out, "unknown command 'frobnicate' (commands: ")) << verb.out;
  EXPECT_TRUE(contains(verb.out, "compare-images") && contains(verb.out, "infer")) << verb.out;
  const auto none = testing::run_qeval("");
  EXPECT_EQ(none.code, 2);
  EXPECT_TRUE(contains(none.out, "a command is required (commands: ")) << none.out;
}

TEST(CliMessages, AGateWhoseMinExceedsItsMaxIsRejected) {
  const std::string one =
      input_error([] { parse_gate(R"({"checks": [{"metric": "ssim", "min": 0.9, "max": 0.5}]})", "g.json"); });
  EXPECT_TRUE(
      contains(one, "g.json: checks[0]: metric 'ssim' (mean) must be >= 0.9 and <= 0.5: min is greater than max"))
      << one;
  const std::string two = input_error([] {
    parse_gate(R"({"checks": [{"metric": "psnr_db", "stat": "p5", "min": 40},
                               {"metric": "ssim", "max": 1},
                               {"metric": "psnr_db", "stat": "p5", "max": 30}]})",
               "g.json");
  });
  EXPECT_TRUE(contains(two, "g.json: checks[0] and checks[2]: metric 'psnr_db' (p5) must be >= 40 and <= 30")) << two;
  const std::string pair =
      input_error([] { parse_gate(R"({"per_pair": {"ssim": {"min": 0.9, "max": 0.8}}})", "g.json"); });
  EXPECT_TRUE(contains(pair, "g.json: per_pair.ssim: metric 'ssim' must be >= 0.9 and <= 0.8")) << pair;
  // Different statistics or variants bound different quantities; min == max is a valid bound.
  EXPECT_NO_THROW(parse_gate(R"({"checks": [{"metric": "ssim", "stat": "min", "min": 0.9},
                                            {"metric": "ssim", "stat": "max", "max": 0.5},
                                            {"metric": "psnr_db", "min": 30, "max": 30}]})",
                             "g.json"));
  EXPECT_TRUE(contains(
      input_error([] {
        parse_gate(R"({"layers": [{"column": "acc_sqnr_db", "min": 20}, {"column": "acc_sqnr_db", "max": 10}]})",
                   "g.json");
      }),
      "layers[0] and layers[1]: layer column 'acc_sqnr_db' (min) must be >= 20 and <= 10"));

  testing::ScratchDir dir("gate-min-max");
  const fs::path gate =
      testing::write_text(dir, "gate.json", R"({"checks": [{"metric": "ssim", "min": 0.9, "max": 0.5}]})");
  write_png(dir / "ref/a.png", 9);
  write_png(dir / "test/a.png", 9);
  const auto r =
      testing::run_qeval("compare-images --ref " + (dir / "ref").string() + " --test " + (dir / "test").string() +
                         " --out " + (dir / "out").string() + " --gate " + gate.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, gate.string() + ": checks[0]: metric 'ssim'")) << r.out;
}

}  // namespace
}  // namespace qeval::eval
