// Tests of the models' activation arena (model/activation_arena.h): carved at the first reserve for
// the shape asked, carved anew only for a batch larger in some dimension (then at the larger of the
// two shapes in each), the batch in use kept by use(), a new carve after invalidate(), and the
// Carver's check that the layout takes exactly the floats the size function counts.
#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/activation_arena.h"

using nlp::ActivationArena;
using nlp::Carver;

namespace {

// The shapes the layout was called with, and the tensors it carved (x [B*T], y [2*B*T]).
struct Layouts {
  std::vector<std::pair<int, int>> shapes;
  float* x = nullptr;
  float* y = nullptr;
};

ActivationArena arena_for(nlp::Backend& be, Layouts& got, size_t extra_in_layout = 0) {
  return ActivationArena(
      be, [](int B, int T) { return 3 * size_t(B) * T; },
      [&got, extra_in_layout](Carver& take, int B, int T) {
        got.shapes.emplace_back(B, T);
        got.x = take(size_t(B) * T);
        got.y = take(2 * size_t(B) * T + extra_in_layout);
      });
}

}  // namespace

TEST(ActivationArena, GrowsOnlyForALargerBatchAtTheLargerShape) {
  auto be = nlp::make_cpu_backend(1);
  Layouts got;
  ActivationArena arena = arena_for(*be, got);
  arena.reserve(4, 16);
  ASSERT_EQ(got.shapes.size(), 1u);
  EXPECT_EQ(got.shapes[0], std::make_pair(4, 16));
  EXPECT_EQ(got.y, got.x + 4 * 16);  // the layout's tensors follow each other in one allocation
  // every float the size function counts can be written
  std::memset(got.x, 0, 3 * 4 * 16 * sizeof(float));

  arena.reserve(4, 16);  // the same shape, and smaller ones: no new carve
  arena.reserve(2, 8);
  arena.use(3, 16);
  EXPECT_EQ(got.shapes.size(), 1u);
  EXPECT_EQ(arena.B(), 3);
  EXPECT_EQ(arena.T(), 16);

  arena.use(2, 32);  // longer rows, fewer of them: carved for 4 x 32, the larger of each
  ASSERT_EQ(got.shapes.size(), 2u);
  EXPECT_EQ(got.shapes[1], std::make_pair(4, 32));
  EXPECT_EQ(arena.B(), 2);
  EXPECT_EQ(arena.T(), 32);
  arena.reserve(8, 1);  // more rows: 8 x 32
  ASSERT_EQ(got.shapes.size(), 3u);
  EXPECT_EQ(got.shapes[2], std::make_pair(8, 32));
  EXPECT_EQ(arena.B(), 2);  // reserve leaves the batch in use as it was
}

TEST(ActivationArena, InvalidateCarvesAnewAtTheNextUse) {
  auto be = nlp::make_cpu_backend(1);
  Layouts got;
  ActivationArena arena = arena_for(*be, got);
  arena.use(4, 16);
  arena.invalidate();  // e.g. train.recompute changed the layout
  EXPECT_EQ(arena.B(), 0);
  arena.use(2, 8);  // smaller than before, carved all the same, at this shape
  ASSERT_EQ(got.shapes.size(), 2u);
  EXPECT_EQ(got.shapes[1], std::make_pair(2, 8));
  EXPECT_EQ(arena.B(), 2);
  EXPECT_EQ(arena.T(), 8);
}

TEST(ActivationArena, ALayoutThatDisagreesWithTheSizeFails) {
  auto be = nlp::make_cpu_backend(1);
  Layouts more;
  ActivationArena over = arena_for(*be, more, 1);  // takes one float more than counted
  EXPECT_THROW(over.reserve(2, 4), nlp::Error);
  ActivationArena under(
      *be, [](int B, int T) { return 3 * size_t(B) * T; },
      [](Carver& take, int B, int T) { take(size_t(B) * T); });  // leaves floats counted untaken
  EXPECT_THROW(under.reserve(2, 4), nlp::Error);
}
