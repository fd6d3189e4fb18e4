// Pipeline schedules (src/parallel/schedule.h) run through the single-process simulator: deadlock freedom, every
// forward/backward exactly once per stage in dependency order, the activation bound and the bubble formulas.
//
// How the bubble is measured: unit costs per chunk, forward F = 1, backward B = 2 (zb1: input pass B = 1, weight
// pass W = 1; the same 3 per micro-batch), communication free. makespan = time the last action of any rank
// finishes (all start at 0); busy_r = compute time of rank r; idle_r = makespan - busy_r; the bubble fraction of
// rank r is idle_r / makespan. Every rank does the same work, so the fraction is the same on every rank.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "parallel/schedule.h"

using namespace mt;

namespace {
const int kPs[] = {2, 4, 8};

double bubble_fraction(const SimResult& r, int rank) { return r.ranks[rank].idle / r.makespan; }

void require_valid(const SimResult& r, const std::string& what) {
  INFO(what << ": " << r.error);
  REQUIRE_FALSE(r.deadlock);
  REQUIRE(r.complete);
  REQUIRE(r.error.empty());
}
}  // namespace

TEST_CASE("gpipe: valid, m activations alive, bubble (p-1)/(m+p-1)", "[schedule]") {
  const auto fn = schedule_fn(PipelineSchedule::GPipe);
  for (int p : kPs)
    for (int m = 1; m <= 16; ++m) {
      const SimResult r = simulate(fn, p, m, 1);
      require_valid(r, fmt::format("gpipe p={} m={}", p, m));
      // Formula: makespan = 3 (m + p - 1) (m forwards + (p-1) pipeline fill, 2m backwards + 2(p-1) drain);
      // each rank is busy 3m, so idle = 3 (p - 1) and the bubble fraction is exactly (p-1)/(m+p-1).
      CHECK(r.makespan == 3.0 * (m + p - 1));
      for (int rank = 0; rank < p; ++rank) {
        INFO("p=" << p << " m=" << m << " rank=" << rank);
        CHECK(r.ranks[rank].peak_alive == m);  // GPipe keeps all m micro-batches' activations
        CHECK(r.ranks[rank].idle == 3.0 * (p - 1));
        CHECK(bubble_fraction(r, rank) == Approx(double(p - 1) / (m + p - 1)).epsilon(1e-12));
      }
    }
}

TEST_CASE("1f1b: valid, at most p - rank activations alive, bubble (p-1)/(m+p-1)", "[schedule]") {
  const auto fn = schedule_fn(PipelineSchedule::OneFOneB);
  for (int p : kPs)
    for (int m = 1; m <= 16; ++m) {
      const SimResult r = simulate(fn, p, m, 1);
      require_valid(r, fmt::format("1f1b p={} m={}", p, m));
      // Formula: same makespan 3 (m + p - 1) as GPipe, so the same bubble (p-1)/(m+p-1); only memory differs.
      CHECK(r.makespan == 3.0 * (m + p - 1));
      for (int rank = 0; rank < p; ++rank) {
        INFO("p=" << p << " m=" << m << " rank=" << rank);
        // Bound: stage `rank` holds at most p - rank micro-batches' activations (and never more than m).
        CHECK(r.ranks[rank].peak_alive == std::min(p - rank, m));
        CHECK(r.ranks[rank].peak_held == r.ranks[rank].peak_alive);  // one-pass backward: held = alive
        CHECK(r.ranks[rank].idle == 3.0 * (p - 1));
        CHECK(bubble_fraction(r, rank) == Approx(double(p - 1) / (m + p - 1)).epsilon(1e-12));
      }
    }
}

TEST_CASE("one micro-batch: gpipe's action list is 1f1b's on every rank (the planner lists it once)", "[schedule]") {
  auto names = [](const std::vector<Action>& list) {
    std::vector<std::string> out;
    for (const Action& a : list) out.push_back(to_string(a));
    return out;
  };
  for (int p : {1, 2, 3, 4, 8})
    for (int rank = 0; rank < p; ++rank) {
      const std::vector<std::string> g = names(gpipe(p, 1, rank));
      INFO("p=" << p << " rank=" << rank);
      CHECK(g == names(one_f_one_b(p, 1, rank)));
      CHECK(g.size() >= 2);
    }
  // With two micro-batches they differ wherever a rank has no warm-up forward to run first (the last stage).
  CHECK(gpipe(2, 2, 1).size() == one_f_one_b(2, 2, 1).size());
  CHECK(names(gpipe(2, 2, 1)) != names(one_f_one_b(2, 2, 1)));
}

TEST_CASE("interleaved 1f1b (v=2): valid, Megatron's activation bound, bubble about (p-1)/(v*m+p-1)",
          "[schedule]") {
  const auto fn = schedule_fn(PipelineSchedule::Interleaved);
  const int v = 2;
  for (int p : kPs)
    for (int m = p; m <= 16; m += p) {
      const SimResult r = simulate(fn, p, m, v);
      require_valid(r, fmt::format("interleaved p={} m={} v={}", p, m, v));
      // Formula: each chunk costs F = 1, B = 2 (a chunk is 1/v of the rank's layers), so a rank is busy 3 v m
      // and the ideal bubble is the fill/drain of one full stage, 3 (p - 1): fraction (p-1)/(v m + p - 1).
      const double theory = double(p - 1) / (v * m + p - 1);
      for (int rank = 0; rank < p; ++rank) {
        INFO("p=" << p << " m=" << m << " rank=" << rank << " bubble=" << bubble_fraction(r, rank)
                  << " theory=" << theory);
        // Megatron's bound: warm-up W = (p - rank - 1) * 2 + (v - 1) * p chunk-forwards (all m v of them when
        // m == p), then one more forward before the first backward: at most min(W + 1, m v) chunk activations.
        const int warm = m == p ? m * v : std::min((p - rank - 1) * 2 + (v - 1) * p, m * v);
        CHECK(r.ranks[rank].peak_alive <= std::min(warm + 1, m * v));
        CHECK(r.ranks[rank].busy == 3.0 * v * m);
        // Measured: exact here (idle = 3 (p - 1) on every rank), so the tolerance is only for floating point.
        CHECK(r.ranks[rank].idle == 3.0 * (p - 1));
        CHECK(bubble_fraction(r, rank) == Approx(theory).margin(1e-12));
        // and always strictly below the non-interleaved bubble for the same m
        CHECK(bubble_fraction(r, rank) < double(p - 1) / (m + p - 1));
      }
    }
  REQUIRE_THROWS(interleaved(4, 6, 2, 0));  // m must be a multiple of p
}

TEST_CASE("zb1: valid, at most p - rank activations alive and 2p - rank - 1 held, bubble below 1f1b's for m >= p", "[schedule]") {
  const auto fn = schedule_fn(PipelineSchedule::ZB1);
  for (int p : kPs)
    for (int m = 1; m <= 16; ++m) {
      const SimResult r = simulate(fn, p, m, 1);
      require_valid(r, fmt::format("zb1 p={} m={}", p, m));
      const double onefoneb = double(p - 1) / (m + p - 1);  // 1F1B's bubble fraction with the same 3 per mb
      for (int rank = 0; rank < p; ++rank) {
        INFO("p=" << p << " m=" << m << " rank=" << rank << " bubble=" << bubble_fraction(r, rank));
        // Activations are alive from F to B (the input pass); W keeps only what the weight gradient needs.
        CHECK(r.ranks[rank].peak_alive <= std::min(p - rank, m));
        // Records held until the W pass: 1F1B's p - rank plus at most p - 1 deferred weight passes.
        CHECK(r.ranks[rank].peak_held <= std::min(2 * p - rank - 1, m));
        CHECK(r.ranks[rank].busy == 3.0 * m);
        // Formula: the drain is on B = 1 per stage instead of 3 and the W passes fill the waits, so the bubble
        // is strictly smaller than 1F1B's (p-1)/(m+p-1) for m >= p, and never larger for any m.
        // ZB-H1's formula (F = B = W = 1): idle (p-1)(F + B - W) = p - 1, a third of 1F1B's 3 (p - 1), so for
        // m >= p the makespan is 3 m + p - 1 and the fraction (p-1)/(3m+p-1).
        if (m >= p) {
          CHECK(bubble_fraction(r, rank) < onefoneb);
          CHECK(r.ranks[rank].idle == double(p - 1));
          CHECK(bubble_fraction(r, rank) == Approx(double(p - 1) / (3 * m + p - 1)).epsilon(1e-12));
        }
        else CHECK(bubble_fraction(r, rank) <= onefoneb + 1e-12);
      }
    }
}

TEST_CASE("simulator detects deadlock and ordering errors", "[schedule]") {
  // Every rank receives before it sends anything: rank 1 waits on rank 0's activation, rank 0 on rank 1's gradient
  // which needs rank 1's forward first -- here rank 0 starts with its backward.
  ScheduleFn bad = [](int, int, int, int rank) {
    std::vector<Action> a;
    if (rank == 0) {
      a.push_back({ActionKind::RecvGrad, 0, 0, 1});
      a.push_back({ActionKind::Forward, 0, 0, -1});
    } else {
      a.push_back({ActionKind::RecvAct, 0, 0, 0});
    }
    return a;
  };
  SimResult r = simulate(bad, 2, 1, 1);
  CHECK(r.deadlock);
  CHECK_FALSE(r.complete);
  // A backward before its forward, on a single stage: no deadlock, but out of order.
  ScheduleFn reversed = [](int, int, int, int) {
    return std::vector<Action>{{ActionKind::Backward, 0, 0, -1}, {ActionKind::Forward, 0, 0, -1}};
  };
  r = simulate(reversed, 1, 1, 1);
  CHECK_FALSE(r.deadlock);
  CHECK_FALSE(r.complete);
  // A missing micro-batch is reported.
  r = simulate([](int p, int, int, int rank) { return one_f_one_b(p, 2, rank); }, 2, 3, 1);
  CHECK_FALSE(r.complete);
}

TEST_CASE("bubble fractions at p = 2 (printed)", "[schedule][.print]") {
  for (PipelineSchedule s : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::ZB1}) {
    const SimResult r = simulate(schedule_fn(s), 2, 8, 1);
    std::printf("%s p=2 m=8: bubble %.4f\n", name_of(s), bubble_fraction(r, 0));
  }
  const SimResult r = simulate(schedule_fn(PipelineSchedule::Interleaved), 2, 8, 2);
  std::printf("interleaved p=2 m=8 v=2: bubble %.4f\n", bubble_fraction(r, 0));
}
