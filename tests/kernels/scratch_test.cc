// Lent scratch objects: one per thread and kind, shared by every caller in turn; a nested lend
// (a waiting thread running another task) gets another object, never the one in use.
#include <gtest/gtest.h>

#include <thread>

#include "kernels/conv.h"
#include "kernels/scratch.h"

namespace qeval::kernels {
namespace {

TEST(Lent, OneObjectPerThreadServesEveryCallerAndNestedLendsGetAnother) {
  std::thread([] {  // a fresh thread: no spares yet
    EXPECT_EQ(thread_lent_bytes(), 0u);
    const ConvScratch* first = nullptr;
    {
      const Lent<ConvScratch> a;
      first = a.get();
      a->get(1000);
      {
        const Lent<ConvScratch> nested;  // `a` is in use: another one
        EXPECT_NE(nested.get(), first);
        nested->get(10);
      }
      EXPECT_EQ(thread_lent_bytes(), 10 * sizeof(float));  // the nested one, given back
    }
    EXPECT_EQ(thread_lent_bytes(), 1010 * sizeof(float));
    // The next caller gets the last one given back, with its storage (no allocation).
    const Lent<ConvScratch> again;
    EXPECT_EQ(again.get(), first);
    EXPECT_EQ(again->size, 1000u);
    EXPECT_EQ(thread_lent_bytes(), 10 * sizeof(float));
  })
      .join();
}

TEST(Lent, ConvCallsWithoutScratchShareThisThreadsLentOne) {
  std::thread([] {
    // Padded 3x3 convs of one geometry: the padded input is lent, one buffer for all calls.
    ConvParams p;
    p.batch = 1;
    p.in_channels = p.out_channels = 4;
    p.in_spatial = {64, 64};
    p.kernel = {3, 3};
    p.strides = {1, 1};
    p.dilations = {1, 1};
    p.pads_begin = p.pads_end = {1, 1};
    p.out_spatial = {64, 64};
    p.groups = 1;
    std::vector<float> x(4 * 64 * 64, 0.5f), w(4 * 4 * 9, 0.25f), y(x.size()), z(x.size());
    conv(p, x.data(), w.data(), nullptr, y.data());
    const std::size_t padded = 4 * 66 * 66 * sizeof(float);
    EXPECT_EQ(thread_lent_bytes(), padded);
    for (int i = 0; i < 5; ++i) conv(p, y.data(), w.data(), nullptr, z.data());
    EXPECT_EQ(thread_lent_bytes(), padded);
    // The lent buffer's earlier contents change nothing: the same bits as with a scratch of its own.
    ConvScratch own;
    std::vector<float> z2(z.size());
    conv(p, y.data(), w.data(), nullptr, z2.data(), nullptr, &own);
    EXPECT_EQ(z, z2);
    EXPECT_EQ(thread_lent_bytes(), padded);
  }).join();
}

}  // namespace
}  // namespace qeval::kernels
