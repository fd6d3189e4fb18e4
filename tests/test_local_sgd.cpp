// Local SGD's parameter average and outer Nesterov step against a hand computation, on however many ranks the
// test runs (ctest runs it on 1 rank and, through tests/local_sgd_tests.cmake, on 2 and 3).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "comm/make_communicator.h"
#include "optim/local_sgd.h"
#include "optim/optimizer.h"

using namespace mt;

namespace {
// Replica r's parameter i after its local steps: rank-valued, so the average is known in closed form.
double local_value(int64_t i, int r, int round) { return 0.25 * double(i % 7) + 0.5 * r + 0.125 * round; }
}  // namespace

TEST_CASE("local SGD: plain average and outer Nesterov steps match the formulas", "[local_sgd]") {
  CommOptions o;
  o.timeout_s = 60;
  auto dp = make_communicator(MPI_COMM_WORLD, "dp", o);
  const int P = dp->size(), r = dp->rank();
  const int64_t n = 37;
  for (bool mixed : {false, true}) {
    for (bool nesterov : {false, true}) {
      INFO("bf16 compute " << mixed << ", nesterov " << nesterov);
      std::vector<OptimSegment> segs = {{0, 0, n, true, false, true}};
      Optimizer opt(segs, n, DType::F32, Device::CPU, OptimizerSettings{}, nullptr, nullptr, nullptr, mixed);
      Tensor params = Tensor::zeros({n}, mixed ? DType::BF16 : DType::F32);
      Tensor full = Tensor::zeros({n}, DType::F32);
      for (int64_t i = 0; i < n; ++i) full.data_as<float>()[i] = float(0.1 * i);  // the shared start
      if (mixed) opt.load_masters(full);
      copy_convert(params, full);
      LocalSGDSettings s;
      s.sync_every = 3, s.nesterov = nesterov, s.outer_lr = 0.7, s.outer_momentum = 0.9;
      LocalSGD local(s, *dp, params, opt);
      CHECK(local.due(3, 10));
      CHECK_FALSE(local.due(2, 10));
      CHECK(local.due(10, 10));  // the last step always syncs
      std::vector<double> anchor(n), vel(n, 0.0);
      for (int64_t i = 0; i < n; ++i) anchor[i] = double(float(0.1 * i));
      for (int round = 0; round < 3; ++round) {
        // The replicas' local steps, as their optimizers would leave them (masters under 16-bit compute).
        for (int64_t i = 0; i < n; ++i) full.data_as<float>()[i] = float(local_value(i, r, round));
        if (mixed) opt.load_masters(full);
        copy_convert(params, full);
        local.sync(3 * (round + 1), params, opt);
        Tensor got = Tensor::zeros({n}, DType::F32);
        if (mixed)
          opt.store_masters(got);
        else
          copy_convert(got, params);
        for (int64_t i = 0; i < n; ++i) {
          // The average of 0.5 r over P ranks is 0.25 (P-1): all values are exact in fp32.
          const double avg = 0.25 * double(i % 7) + 0.25 * (P - 1) + 0.125 * round;
          double want = avg;
          if (nesterov) {
            const double d = anchor[i] - avg;
            vel[i] = 0.9 * vel[i] + d;
            anchor[i] -= 0.7 * (d + 0.9 * vel[i]);
            want = anchor[i];
          }
          // Plain average: exact. Nesterov: a few fp32 operations on values below 10 per round, three rounds:
          // within 1e-5.
          REQUIRE(double(got.data_as<float>()[i]) == Approx(want).margin(nesterov ? 1e-5 : 0.0));
          // Every replica holds the same weights, and the compute copy is their rounding.
          if (mixed) REQUIRE(bf16_to_float(static_cast<const uint16_t*>(params.data())[i]) == bf16_to_float(float_to_bf16(got.data_as<float>()[i])));
        }
      }
    }
  }
}

TEST_CASE("local SGD: a period changed by comm.adapt counts from the last average", "[local_sgd]") {
  CommOptions o;
  o.timeout_s = 60;
  auto dp = make_communicator(MPI_COMM_WORLD, "dp", o);
  const int64_t n = 5;
  std::vector<OptimSegment> segs = {{0, 0, n, true, false, true}};
  Optimizer opt(segs, n, DType::F32, Device::CPU, OptimizerSettings{}, nullptr, nullptr, nullptr, false);
  Tensor params = Tensor::zeros({n}, DType::F32);
  LocalSGDSettings s;
  s.sync_every = 4;
  LocalSGD local(s, *dp, params, opt);
  CHECK_FALSE(local.due(3, 100));
  CHECK(local.due(4, 100));
  local.sync(4, params, opt);
  local.set_sync_every(3);  // decided at step 4: the next average ends step 7, not the next multiple of 3
  CHECK(local.sync_every() == 3);
  CHECK_FALSE(local.due(6, 100));
  CHECK(local.due(7, 100));
  local.sync(7, params, opt);
  local.set_sync_every(8);
  CHECK_FALSE(local.due(14, 100));
  CHECK(local.due(15, 100));
  CHECK(local.due(9, 9));  // the last step always averages
}
