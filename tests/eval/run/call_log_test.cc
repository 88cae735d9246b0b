// A unit's CallLog pooled into LayerCells gives the cells that adding each event's statistics there
// directly gives, to the bit: moments, histograms, clipping, non-finite counts, accumulated and
// local error, an event with only clipping, a layer touched with nothing added, bins of many sizes,
// several units.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "eval/run/observe.h"

namespace qeval::eval {
namespace {

std::vector<float> ramp(std::size_t n, float scale, float shift) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * std::sin(float(i) * 0.37f + shift);
  return v;
}

TEST(CallLog, PoolsIntoTheCellsTheEventsWouldHaveFilled) {
  Graph g;
  g.nodes.resize(3);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    g.nodes[i].name = std::string("n").append(std::to_string(i));
    g.nodes[i].op_type = "Relu";
    g.nodes[i].outputs = {std::string("y").append(std::to_string(i))};
  }
  auto space = std::make_shared<LayerSpace>(std::vector<LayerSpace::Model>{{"m", &g, true, 0}}, 4);
  LayerCells direct(space), pooled(space);
  CallLog log;
  for (int unit = 0; unit < 2; ++unit) {
    log.clear();
    for (int step = 3; step >= 0; --step) {
      for (std::size_t layer = 0; layer < 3; ++layer) {
        const auto ref = ramp(20000 + layer * 777, 3.0f, float(step));
        auto test = ramp(ref.size(), 3.01f, float(step) + 0.001f * float(unit));
        if (layer == 1 && step == 2) test[5] = std::numeric_limits<float>::quiet_NaN();
        if (layer == 2 && step == 1) test[9] = std::numeric_limits<float>::infinity();
        const float clip = layer == 0 ? 2.5f : std::numeric_limits<float>::infinity();
        // One event: the variant's statistics and error in one pass, local error, per-channel
        // clipping counted apart; into a cell of its own (the log) and straight into `direct`.
        LayerCell event;
        for (LayerCell* c : {&event, &direct.at(layer, step)}) {
          metrics::ActivationStats ra;
          const double energy = *ra.add(ref.data(), std::int64_t(ref.size()));
          metrics::add_with_error(c->act, c->acc, test.data(), ref.data(), energy, std::int64_t(ref.size()), clip);
          if (layer == 2) c->act.add_clipped(test.data(), std::int64_t(test.size()), 1.0f);
          if (step % 2 == 0)
            c->local_mut().add(metrics::tensor_error(ref.data(), test.data(), std::int64_t(ref.size())),
                               std::int64_t(ref.size()));
        }
        log.add(layer, step, event);
      }
    }
    // A clipping-only event, and a layer touched with nothing added (a local compare that found no
    // matching output).
    LayerCell clipped_only;
    const auto v = ramp(300, 5.0f, 0.5f);
    clipped_only.act.add_clipped(v.data(), 300, 4.0f);
    direct.at(0, 0).act.add_clipped(v.data(), 300, 4.0f);
    log.add(0, 0, clipped_only);
    direct.at(2, 3);
    log.add(2, 3, LayerCell{});
    // Bins of every size the log stores them in (1 to 3 bytes): 1/8 of 400000 values in a bin of
    // zeros, a few hundred in the ramp's bins, a handful at its tails.
    LayerCell wide;
    std::vector<float> z(400000, 0.0f);
    const auto r = ramp(20000, 1.0f, 0.0f);
    std::copy(r.begin(), r.end(), z.begin() + 1000);
    wide.act.add(z.data(), std::int64_t(z.size()));
    direct.at(1, 3).act.add(z.data(), std::int64_t(z.size()));
    ASSERT_GE(wide.act.abs_hist.count(0), 1u << 14);
    log.add(1, 3, wide);
    EXPECT_EQ(log.size(), 15u);
    log.merge_into(pooled);
  }
  EXPECT_TRUE(pooled == direct);
  // The comparison can fail: one more event in one place only.
  const auto v = ramp(64, 1.0f, 0.0f);
  pooled.at(1, 1).act.add(v.data(), 64);
  EXPECT_FALSE(pooled == direct);
  // Spot checks of what was pooled.
  const LayerCell& c = *direct.find(1, 2);
  EXPECT_EQ(c.act.nan, 2u);
  EXPECT_EQ(c.act.calls, 2u);
  EXPECT_EQ(c.local().calls, 2u);
  EXPECT_GT(direct.find(0, 0)->act.clipped, 0u);
}

}  // namespace
}  // namespace qeval::eval
