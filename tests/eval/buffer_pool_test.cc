// The executor's buffer pool: buffers reused across runs; a bounded pool (the evaluator's
// single-model workers') keeps host memory within the most its executions ever had lent at once
// (buffers that fit no request are freed, oldest first, before the pool grows past that).
#include <gtest/gtest.h>

#include <string>

#include "eval/exec/plan.h"
#include "eval/exec/pool.h"
#include "eval/exec/session.h"
#include "onnx_builder.h"

namespace qeval::eval {
namespace {

using testing::OnnxBuilder;

constexpr std::size_t kMiB = 1024 * 1024;

TEST(BufferPool, BuffersThatFitNoRequestAreFreedBeforeThePoolGrowsPastItsPeak) {
  BufferPool pool(true);
  Tensor a = pool.take(DType::kFloat32, {256, 1024}), b = pool.take(DType::kFloat32, {256, 1024});
  EXPECT_EQ(pool.allocated_bytes(), 2 * kMiB);
  EXPECT_EQ(pool.peak_lent_bytes(), 2 * kMiB);
  pool.give(std::move(a));
  pool.give(std::move(b));
  EXPECT_EQ(pool.free_bytes(), 2 * kMiB);
  // 3 MiB: neither free buffer fits; keeping them would hold 5 MiB where 3 were ever live.
  Tensor c = pool.take(DType::kFloat32, {768, 1024});
  EXPECT_EQ(pool.allocated_bytes(), 3 * kMiB);
  EXPECT_EQ(pool.free_bytes(), 0u);
  pool.give(std::move(c));
  // 2 MiB takes the free 3 MiB (at most twice the request); 2.5 MiB more is a new peak (5.5 MiB
  // lent at once): a new buffer, nothing to free.
  Tensor d = pool.take(DType::kFloat32, {512, 1024});
  EXPECT_EQ(pool.allocated_bytes(), 3 * kMiB);
  Tensor e = pool.take(DType::kFloat32, {2560, 256});
  EXPECT_EQ(pool.allocated_bytes(), 3 * kMiB + 5 * kMiB / 2);
  EXPECT_EQ(pool.peak_lent_bytes(), 3 * kMiB + 5 * kMiB / 2);
  EXPECT_LE(pool.allocated_bytes(), pool.peak_lent_bytes());
}

// Buffers the pool did not make, given to it (an execution's inputs converted to their storage
// type, host copies of device values), come under its bound too: a pool that has lent 1 MiB at
// most and is given 20 such buffers of 1 MiB keeps no more than its bound once it must grow.
TEST(BufferPool, BuffersGivenThatThePoolDidNotMakeComeUnderItsBound) {
  BufferPool pool(true);
  pool.give(pool.take(DType::kFloat32, {256, 1024}));
  EXPECT_EQ(pool.peak_lent_bytes(), kMiB);
  for (int k = 0; k < 20; ++k) pool.give(Tensor(DType::kFloat32, {256, 1024}));
  EXPECT_EQ(pool.free_bytes(), 21 * kMiB);
  EXPECT_EQ(pool.allocated_bytes(), 21 * kMiB);
  // 3 MiB fits none: the pool frees the oldest until the new buffer keeps it within 3 MiB.
  Tensor big = pool.take(DType::kFloat32, {768, 1024});
  EXPECT_EQ(pool.free_bytes(), 0u);
  EXPECT_EQ(pool.allocated_bytes(), 3 * kMiB);
}

// Local error's pool after each local run (eval/run/observe.h LocalSessions::trim): its free host
// buffers go once they pass the cap, and stay below it.
TEST(BufferPool, TrimmingFreesTheFreeHostBuffersOncePastTheCap) {
  BufferPool pool(true);
  Tensor lent = pool.take(DType::kFloat32, {256, 1024});
  for (int k = 0; k < 3; ++k) pool.give(pool.take(DType::kFloat32, {256 * (k + 2), 1024}));
  const std::size_t free = pool.free_bytes();
  trim_free_host_buffers(pool, free);
  EXPECT_EQ(pool.free_bytes(), free) << "at the cap: kept";
  trim_free_host_buffers(pool, free - 1);
  EXPECT_EQ(pool.free_bytes(), 0u);
  EXPECT_EQ(pool.allocated_bytes(), kMiB) << "the lent buffer is still the pool's";
}

TEST(BufferPool, OldestFreeBuffersGoFirst) {
  BufferPool pool(true);
  Tensor a = pool.take(DType::kFloat32, {1024, 1024}), b = pool.take(DType::kFloat32, {256, 1024});
  const void* newer = b.raw();
  pool.give(std::move(a));  // given first: the oldest
  pool.give(std::move(b));
  // 1.5 MiB fits neither (4 MiB is more than twice it); adding it to the 5 MiB held would pass the
  // 5 MiB peak: the oldest free buffer (4 MiB) goes, the newer one stays.
  Tensor c = pool.take(DType::kFloat32, {1536, 256});
  EXPECT_EQ(pool.allocated_bytes(), kMiB + 3 * kMiB / 2);
  EXPECT_EQ(pool.free_bytes(), kMiB);
  Tensor d = pool.take(DType::kFloat32, {256, 1024});
  EXPECT_EQ(d.raw(), newer);
}

// Runs of one plan after the first find every buffer in the pool but the output each hands over
// (no fresh pages per run), and the pool holds no more than the most the runs had lent at once.
TEST(BufferPool, RepeatedRunsReuseEveryBufferWithinThePeak) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1, 4, 64, 64}).output("y", onnx::TensorProto::FLOAT);
  // Convs that widen then narrow the channels (buffers of several sizes), a skip connection.
  const int channels[] = {4, 16, 8, 32, 4};
  std::string prev = "x";
  for (int i = 1; i < 5; ++i) {
    const std::string w = std::string("w").append(std::to_string(i)), y = std::string("c").append(std::to_string(i));
    b.initializer(w, std::vector<float>(std::size_t(channels[i] * channels[i - 1]), 0.01f),
                  {channels[i], channels[i - 1], 1, 1});
    b.node("Conv", {prev, w}, {y}, std::string("conv").append(std::to_string(i)));
    prev = y;
  }
  b.node("Add", {prev, "x"}, {"y"}, "skip");
  const Graph g = b.graph();
  SessionOptions options;
  options.pool = make_bounded_pool();
  Session s(g, options);
  const std::map<std::string, Tensor> inputs = {{"x", Tensor(DType::kFloat32, {1, 4, 64, 64})}};
  const std::size_t output = 4 * 64 * 64 * sizeof(float);
  s.run(inputs);
  const std::size_t first = options.pool->allocated_bytes(), peak = options.pool->peak_lent_bytes();
  for (std::size_t run = 1; run <= 3; ++run) {
    s.run(inputs);
    EXPECT_EQ(options.pool->allocated_bytes(), first + run * output) << run;
    EXPECT_EQ(options.pool->peak_lent_bytes(), peak) << run;  // handed-over outputs do not count
  }
  EXPECT_LE(options.pool->allocated_bytes() - 3 * output, peak);
}

TEST(BufferPool, AnUnboundedPoolKeepsEveryBuffer) {
  BufferPool pool;  // Session::make_pool's
  Tensor a = pool.take(DType::kFloat32, {256, 1024}), b = pool.take(DType::kFloat32, {256, 1024});
  pool.give(std::move(a));
  pool.give(std::move(b));
  Tensor c = pool.take(DType::kFloat32, {768, 1024});
  EXPECT_EQ(pool.allocated_bytes(), 5 * kMiB);
  EXPECT_EQ(pool.free_bytes(), 2 * kMiB);
}

}  // namespace
}  // namespace qeval::eval
