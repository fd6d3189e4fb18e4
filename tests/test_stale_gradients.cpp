// Stale-synchronous gradient averages (parallel/stale_gradients.h) on however many ranks the test runs (ctest runs
// it on 1 rank and, through tests/staleness_tests.cmake, on 2, 3 and 4): every step's average is applied exactly
// once, in step order, with every rank's contribution, on every rank alike; none later than S steps; and no rank
// starts a step more than S steps ahead of the slowest.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm/make_communicator.h"
#include "parallel/stale_gradients.h"

using namespace mt;

namespace {
// Rank r's gradient element i at step k: the average over P ranks is known in closed form.
float grad_value(int64_t i, int r, int64_t k) { return float(0.5 * (r + 1) + 0.25 * double(i % 5) + k); }
double avg_value(int64_t i, int P, int64_t k) { return 0.5 * (P + 1) / 2.0 + 0.25 * double(i % 5) + double(k); }

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

TEST_CASE("stale gradients: each average once, in order, complete, at most S steps late", "[staleness]") {
  CommOptions o;
  o.timeout_s = 60;
  auto dp = make_communicator(MPI_COMM_WORLD, "dp", o);
  const int P = dp->size(), r = dp->rank();
  const int64_t n = 1000, steps = 24;
  for (int S : {1, 2, 4}) {
    for (StalenessPolicy policy : {StalenessPolicy::Newest, StalenessPolicy::Fixed}) {
      INFO("S " << S << ", policy " << (policy == StalenessPolicy::Fixed ? "fixed" : "newest"));
      StaleGradients stale(*dp, n, S, policy);
      Tensor g = Tensor::zeros({n}, DType::F32);
      std::vector<int64_t> applied;
      std::vector<double> start_us(steps + 1, 0);
      bool values_ok = true;
      // fp32 averages of values up to ~P + k: a few ulps, 1e-4 x (1 + k) leaves room without hiding a missing or
      // doubled contribution (which moves the average by at least 0.5 / P).
      auto apply = [&](int64_t k, const Tensor& avg) {
        applied.push_back(k);
        for (int64_t i = 0; i < n; ++i)
          values_ok = values_ok && std::abs(avg.data_as<float>()[i] - avg_value(i, P, k)) <= 1e-4 * (1 + k);
      };
      for (int64_t t = 1; t <= steps; ++t) {
        start_us[t] = now_us();
        // The last rank is the straggler: its steps take 3 ms longer (slept, like train.straggler).
        if (r == P - 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));
        for (int64_t i = 0; i < n; ++i) g.data_as<float>()[i] = grad_value(i, r, t);
        stale.issue(t, g);
        stale.apply_ready(t, apply);
        // Everything up to t - S is applied; with the fixed policy nothing later.
        CHECK((applied.empty() ? 0 : applied.back()) >= t - S);
        if (policy == StalenessPolicy::Fixed) CHECK((applied.empty() ? 0 : applied.back()) == std::max<int64_t>(0, t - S));
        CHECK(stale.in_flight() <= S);
      }
      stale.finish(apply);
      CHECK(values_ok);
      REQUIRE(applied.size() == size_t(steps));
      for (int64_t k = 1; k <= steps; ++k) CHECK(applied[k - 1] == k);
      // The bound, causally: a rank starts step t only after every rank has issued step t - S - 1 (whose average
      // it applied during step t - 1), so after the slowest rank started that step. Holds under any load.
      std::vector<double> all(size_t(P) * (steps + 1));
      MPI_Allgather(start_us.data(), steps + 1, MPI_DOUBLE, all.data(), steps + 1, MPI_DOUBLE, MPI_COMM_WORLD);
      for (int q = 0; q < P; ++q)
        for (int64_t t = S + 2; t <= steps; ++t)
          CHECK(start_us[t] > all[size_t(q) * (steps + 1) + (t - S - 1)]);
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
}
