// The hierarchical all-reduce (comm.hierarchical): layouts, bit-identity with the flat all_reduce for every node
// layout the world size allows (emulated nodes of 1, 2, 3 and 4 ranks, the real node, reversed and strided groups),
// issue order with many operations in flight, the phases' events and the emulated alpha-beta time.
// Runs at any world size (mpiexec -n 1|2|3|4 build-hier/tests/test_hierarchical); a layout the world size makes
// uneven must throw InputError on every rank. Inputs are rank-valued (r + 1 + i % 7), so every sum is exact in
// fp32, bf16 and fp16 and the results must equal the flat communicator's bit for bit (tolerance 0).
#include <catch2/catch.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "comm/hierarchical_communicator.h"
#include "comm/make_communicator.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "core/tensor.h"
#include "rank_values.h"

using namespace mt;
using namespace mt::test;

namespace {

CommOptions test_opts(int ranks_per_node) {
  CommOptions o;
  o.timeout_s = 60;  // a mismatched rank aborts the job instead of hanging CI
  o.ranks_per_node = ranks_per_node;
  return o;
}

Tensor filled(int64_t n, DType dt, int r) {
  Tensor t = Tensor::empty({n}, dt);
  for (int64_t i = 0; i < n; ++i) set(t, i, input(r, i));
  return t;
}
int mismatches(const Tensor& t, ReduceOp op, int p) {
  int bad = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float want = expected(op, p, i);
    // Avg over 3 ranks is not exact: compare with the same single rounding the backends do.
    const float w = t.dtype() == DType::BF16 ? bf16_to_float(float_to_bf16(want))
                    : t.dtype() == DType::F16 ? fp16_to_float(float_to_fp16(want))
                                              : want;
    bad += get(t, i) != w;
  }
  return bad;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

// The world ranks of a communicator's members, in group-rank order.
std::vector<int> world_ranks(MPI_Comm c) {
  int p = 1;
  MPI_Comm_size(c, &p);
  std::vector<int> mine(p), world(p);
  for (int i = 0; i < p; ++i) mine[i] = i;
  MPI_Group g, gw;
  MPI_Comm_group(c, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &gw);
  MPI_Group_translate_ranks(g, p, mine.data(), gw, world.data());
  MPI_Group_free(&g);
  MPI_Group_free(&gw);
  return world;
}

// The layout a group gets with emulated nodes of `ranks_per_node` (0: one node, as on the test machine).
HierarchicalLayout expected_layout(MPI_Comm c, int ranks_per_node) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return hierarchical_layout(emulated_nodes(world_ranks(c), ranks_per_node), r);
}

// The first of `candidates` ranks-per-node that splits the world evenly (1 always does).
int even_ranks_per_node(std::vector<int> candidates) {
  candidates.push_back(1);
  for (int k : candidates)
    if (expected_layout(MPI_COMM_WORLD, k).error.empty()) return k;
  return 1;
}

// Groups to test: the world, the world in reverse order (group rank 0 = the last world rank), and the even or
// odd world ranks (a strided group, like a dp group under tp > 1).
struct Group {
  const char* what;
  MPI_Comm comm;
};
std::vector<Group> test_groups() {
  const int r = world_rank(), p = world_size();
  MPI_Comm reversed, strided;
  MPI_Comm_split(MPI_COMM_WORLD, 0, p - 1 - r, &reversed);
  MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &strided);
  return {{"world", MPI_COMM_WORLD}, {"reversed", reversed}, {"strided", strided}};
}
void free_groups(std::vector<Group>& g) {
  for (Group& x : g)
    if (x.comm != MPI_COMM_WORLD) MPI_Comm_free(&x.comm);
}

}  // namespace

TEST_CASE("hierarchical_layout: ranks per node and nodes and local ranks and uneven groups") {
  HierarchicalLayout l = hierarchical_layout({0, 0, 1, 1}, 3);
  CHECK(l.error.empty());
  CHECK(l.ranks_per_node == 2);
  CHECK(l.nodes == 2);
  CHECK(l.node == 1);
  CHECK(l.local_rank == 1);
  l = hierarchical_layout({1, 1, 0, 0}, 0);  // a reversed group: group rank 0 on the second node
  CHECK(l.node == 1);
  CHECK(l.local_rank == 0);
  l = hierarchical_layout({0, 1, 0, 1}, 2);  // interleaved
  CHECK(l.error.empty());
  CHECK(l.ranks_per_node == 2);
  CHECK(l.local_rank == 1);
  l = hierarchical_layout({7}, 0);
  CHECK(l.error.empty());
  CHECK(l.ranks_per_node == 1);
  CHECK(l.nodes == 1);
  l = hierarchical_layout({0, 1, 2}, 1);  // one rank per node
  CHECK(l.ranks_per_node == 1);
  CHECK(l.nodes == 3);
  CHECK(l.local_rank == 0);
  l = hierarchical_layout({0, 0, 0, 1}, 0);
  CHECK(l.error.find("unevenly") != std::string::npos);
  CHECK(l.error.find("node 0 holds 3") != std::string::npos);
  CHECK(l.error.find("node 1 holds 1") != std::string::npos);

  CHECK(emulated_nodes({0, 1, 2, 3}, 2) == std::vector<int>{0, 0, 1, 1});
  CHECK(emulated_nodes({3, 2, 1, 0}, 2) == std::vector<int>{1, 1, 0, 0});
  CHECK(emulated_nodes({0, 2, 4}, 0) == std::vector<int>{0, 0, 0});
}

TEST_CASE("predict_hierarchical_us is the alpha-beta time of the three phases") {
  CommOptions o;
  o.latency_us = 10;
  o.bandwidth_gbps = 1;  // 1e-3 us per byte
  o.inter_latency_us = 100;
  o.inter_bandwidth_gbps = 0.5;  // 2e-3 us per byte
  o.ranks_per_node = 2;
  // 2(k-1)(a_i + n/k b_i) + 2(m-1)(a_e + n/(km) b_e), n = 4000
  CHECK(predict_hierarchical_us(4000, 2, 2, o) == Approx(2 * (10 + 2.0) + 2 * (100 + 2.0)));
  CHECK(predict_hierarchical_us(4000, 1, 4, o) == Approx(predict_us(CommKind::AllReduce, 4000, 4, link_model(o, true))));
  CHECK(predict_hierarchical_us(4000, 4, 1, o) == Approx(predict_us(CommKind::AllReduce, 4000, 4, link_model(o, false))));
  CHECK(predict_hierarchical_us(4000, 1, 1, o) == 0);
  // The flat ring across both nodes runs every step on the inter-node link.
  CHECK(predict_us(CommKind::AllReduce, 4000, 4, link_model(o, true)) == Approx(6 * (100 + 2.0)));
}

TEST_CASE("hierarchical all_reduce equals the flat all_reduce bit for bit for every layout") {
  const std::vector<int64_t> sizes = {0, 1, 2, 3, 5, 7, 13, 1000, 4099};  // divisible and not by k = 2, 3, 4
  const std::vector<DType> types = {DType::F32, DType::BF16, DType::F16};
  const std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};
  auto groups = test_groups();
  for (const Group& g : groups)
    for (int rpn : {0, 1, 2, 3, 4}) {
      INFO("group " << g.what << " ranks_per_node " << rpn);
      const CommOptions o = test_opts(rpn);
      const HierarchicalLayout want = expected_layout(g.comm, rpn);
      if (!want.error.empty()) {
        CHECK_THROWS_AS(make_hierarchical_communicator(g.comm, "dp", o), InputError);
        continue;
      }
      auto h = make_hierarchical_communicator(g.comm, "dp", o);
      auto flat = make_communicator(g.comm, "flat", o);
      const int p = h->size(), r = h->rank();
      REQUIRE(p == flat->size());
      REQUIRE(r == flat->rank());
      for (DType dt : types)
        for (ReduceOp op : ops)
          for (int64_t n : sizes) {
            INFO("dtype " << dtype_name(dt) << " op " << int(op) << " n " << n);
            Tensor a = filled(n, dt, r), b = filled(n, dt, r);
            h->all_reduce(a, op);
            flat->all_reduce(b, op);
            CHECK(std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
            CHECK(mismatches(a, op, p) == 0);
          }
      // A 2-D tensor is reduced over its flattened elements.
      Tensor m2 = Tensor::empty({3, 5}, DType::F32);
      for (int64_t i = 0; i < 15; ++i) set(m2, i, input(r, i));
      h->all_reduce(m2, ReduceOp::Sum);
      CHECK(mismatches(m2, ReduceOp::Sum, p) == 0);
    }
  free_groups(groups);
}

TEST_CASE("uneven layouts throw InputError on every rank") {
  const int p = world_size();
  if (p < 3) return;  // 1 or 2 ranks: every ranks_per_node gives an even layout
  // Nodes of p-1 ranks: the first node holds p-1 of the group, the second 1.
  try {
    make_hierarchical_communicator(MPI_COMM_WORLD, "dp", test_opts(p - 1));
    FAIL("no error for an uneven layout");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("'dp'") != std::string::npos);
    CHECK(msg.find("comm.emulate.ranks_per_node = " + std::to_string(p - 1)) != std::string::npos);
    CHECK(msg.find("unevenly") != std::string::npos);
  }
  // The ranks are still in step: a collective after the throw completes.
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("many async operations in flight run in issue order with the right results") {
  const int rpn = even_ranks_per_node({2});
  auto h = make_hierarchical_communicator(MPI_COMM_WORLD, "dp", test_opts(rpn));
  const int p = h->size(), r = h->rank();
  std::vector<CommEvent> events;
  std::mutex mu;
  h->set_event_sink([&](const CommEvent& e) {
    std::lock_guard<std::mutex> lk(mu);
    events.push_back(e);
  });

  struct Check {
    Tensor t;
    std::vector<float> want;
  };
  std::vector<Check> checks;
  std::vector<WorkPtr> works;
  auto want_of = [&](int64_t n, auto f) {
    std::vector<float> w(n);
    for (int64_t i = 0; i < n; ++i) w[i] = f(i);
    return w;
  };
  for (int k = 0; k < 12; ++k) {
    const int64_t n = 1 + 257 * k;
    const DType dt = k % 3 == 1 ? DType::BF16 : DType::F32;
    const ReduceOp op = k % 2 ? ReduceOp::Avg : ReduceOp::Sum;
    Tensor t = filled(n, dt, r);
    works.push_back(h->all_reduce_async(t, op));
    checks.push_back({t, want_of(n, [&](int64_t i) { return expected(op, p, i); })});
  }
  // Dependent operations on one buffer: each sees the previous one's result only if they run in issue order.
  const int64_t n = 3001;
  Tensor chain = Tensor::empty({n}, DType::F32);
  const int root = p - 1;
  for (int64_t i = 0; i < n; ++i) set(chain, i, r == root ? input(root, i) : -1000.0f);
  works.push_back(h->broadcast_async(chain, root));        // everyone: input(root, i)
  works.push_back(h->all_reduce_async(chain, ReduceOp::Sum));  // p * input(root, i)
  works.push_back(h->all_reduce_async(chain, ReduceOp::Sum));  // p^2 * input(root, i)
  // A send of a buffer that an all_reduce issued just before fills: the message carries the reduced values.
  Tensor sent = filled(n, DType::F32, r), got = Tensor::empty({n}, DType::F32);
  works.push_back(h->all_reduce_async(sent, ReduceOp::Sum));
  works.push_back(h->send_async(sent, (r + 1) % p, 5));
  works.push_back(h->recv_async(got, (r + p - 1) % p, 5));
  // reduce_scatter then all_gather (flat) of another buffer, then an all_reduce of the gathered result.
  Tensor rs_in = filled(n, DType::F32, r);
  const ShardRange s = shard_range(n, p, r);
  Tensor rs_out = Tensor::empty({s.size()}, DType::F32), gathered = Tensor::empty({n}, DType::F32);
  works.push_back(h->reduce_scatter_async(rs_in, rs_out, ReduceOp::Sum));
  works.push_back(h->all_gather_async(rs_out, gathered));
  works.push_back(h->all_reduce_async(gathered, ReduceOp::Avg));  // the average of equal values: unchanged
  works.push_back(h->barrier_async());
  checks.push_back({chain, want_of(n, [&](int64_t i) { return float(p * p) * input(root, i); })});
  checks.push_back({sent, want_of(n, [&](int64_t i) { return expected(ReduceOp::Sum, p, i); })});
  checks.push_back({got, want_of(n, [&](int64_t i) { return expected(ReduceOp::Sum, p, i); })});
  checks.push_back({gathered, want_of(n, [&](int64_t i) { return expected(ReduceOp::Sum, p, i); })});

  for (auto& w : works) w->wait();  // in issue order
  for (auto& w : works) CHECK(w->done());
  for (size_t c = 0; c < checks.size(); ++c) {
    int bad = 0;
    for (int64_t i = 0; i < checks[c].t.numel(); ++i) {
      float want = checks[c].want[i];
      if (checks[c].t.dtype() == DType::BF16) want = bf16_to_float(float_to_bf16(want));
      bad += get(checks[c].t, i) != want;
    }
    INFO("check " << c);
    CHECK(bad == 0);
  }
  // The collectives ran one after another: every phase started after the previous one ended.
  std::lock_guard<std::mutex> lk(mu);
  std::vector<CommEvent> coll;
  for (const CommEvent& e : events)
    if (e.op != "send" && e.op != "recv") coll.push_back(e);
  for (size_t i = 1; i < coll.size(); ++i) {
    INFO("event " << i << " " << coll[i].comm << " " << coll[i].op);
    CHECK(coll[i - 1].end_us <= coll[i].start_us);
  }
}

TEST_CASE("the event sink sees the three phases with their bytes") {
  const int rpn = even_ranks_per_node({2, 4});
  const HierarchicalLayout l = expected_layout(MPI_COMM_WORLD, rpn);
  auto h = make_hierarchical_communicator(MPI_COMM_WORLD, "dp", test_opts(rpn));
  std::vector<CommEvent> events;
  std::mutex mu;
  h->set_event_sink([&](const CommEvent& e) {
    std::lock_guard<std::mutex> lk(mu);
    events.push_back(e);
  });
  const int64_t n = 1001;  // odd: shards of 501 and 500 elements with k = 2
  Tensor t = filled(n, DType::BF16, h->rank());
  h->all_reduce(t, ReduceOp::Sum);
  Tensor u = filled(n, DType::F32, h->rank());
  h->broadcast(u, 0);
  const int k = l.ranks_per_node, m = l.nodes;
  const int64_t shard = shard_range(n, k, l.local_rank).size();
  struct Want {
    std::string comm, op;
    int64_t bytes;
    uint64_t seq;
  };
  std::vector<Want> want;
  if (k > 1) want.push_back({"dp.intra", "reduce_scatter", n * 2, 1});
  if (m > 1) want.push_back({"dp.inter", "all_reduce", shard * 2, 1});
  if (k > 1) want.push_back({"dp.intra", "all_gather", shard * 2, 2});
  want.push_back({"dp", "broadcast", n * 4, 1});
  std::lock_guard<std::mutex> lk(mu);
  REQUIRE(events.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("event " << i);
    CHECK(events[i].comm == want[i].comm);
    CHECK(events[i].op == want[i].op);
    CHECK(events[i].bytes == want[i].bytes);
    CHECK(events[i].seq == want[i].seq);
    CHECK(events[i].issue_us <= events[i].start_us);
    CHECK(events[i].start_us <= events[i].end_us);
    if (i > 0) CHECK(events[i - 1].end_us <= events[i].start_us);
  }
  CHECK(mismatches(t, ReduceOp::Sum, h->size()) == 0);
}

TEST_CASE("emulated two-tier network: the phases take the alpha-beta time off the caller's thread") {
  const int rpn = even_ranks_per_node({2});
  CommOptions o = test_opts(rpn);
  // Latency-bound, so real transfer times stay far below the prediction; and long enough (a one-node phase pair
  // is ~10 ms) that a scheduling hiccup of the issuing thread on a busy 2-core machine stays under 0.2 x want.
  o.latency_us = 5000;
  o.inter_latency_us = 16000;
  const HierarchicalLayout l = expected_layout(MPI_COMM_WORLD, rpn);
  auto h = make_hierarchical_communicator(MPI_COMM_WORLD, "dp", o);
  const int p = h->size(), r = h->rank(), k = l.ranks_per_node, m = l.nodes;
  const int64_t n = 1 << 14;
  Tensor t = filled(n, DType::F32, r);
  const double want = predict_hierarchical_us(n * 4, k, m, o);
  MPI_Barrier(MPI_COMM_WORLD);
  const double wait0 = h->total_wait_us();
  double t0 = trace_clock_us();
  WorkPtr w = h->all_reduce_async(t, ReduceOp::Sum);
  // The caller was not delayed at issue: the operation, which takes at least `want`, is still in flight. (Not a
  // stopwatch bound on the issue, which a busy machine can stretch past any fraction of `want`.)
  const bool done_at_issue = w->done();
  w->wait();
  const double took = trace_clock_us() - t0;
  CHECK(mismatches(t, ReduceOp::Sum, p) == 0);
  CHECK(took >= want);
  if (want > 0) {
    CHECK(!done_at_issue);
    CHECK(h->total_wait_us() - wait0 >= 0.5 * want);  // but blocked in wait(), which total_wait_us counts
  }
  // Across nodes with k > 1 the three phases beat the flat ring, which runs all 2(p-1) steps on the slow link
  // (here 2 x 5 ms + 2 x 16 ms against 6 x 16 ms on 4 ranks).
  const double flat = predict_us(CommKind::AllReduce, n * 4, p, link_model(o, m > 1));
  if (k > 1 && m > 1) CHECK(want < 0.75 * flat);

  // Three in flight: they serialise (the links are busy) and the last handle's wait covers all of them.
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<Tensor> ts;
  std::vector<WorkPtr> ws;
  for (int i = 0; i < 3; ++i) ts.push_back(filled(n, DType::F32, r));
  t0 = trace_clock_us();
  for (const Tensor& x : ts) ws.push_back(h->all_reduce_async(x, ReduceOp::Sum));
  if (want > 0) CHECK(!ws.back()->done());  // issuing did not wait for the emulated time
  ws.back()->wait();
  CHECK(trace_clock_us() - t0 >= 3 * want);
  for (auto& x : ws) CHECK(x->done());
  for (auto& x : ts) CHECK(mismatches(x, ReduceOp::Sum, p) == 0);
}

TEST_CASE("the flat operations of a hierarchical communicator") {
  const int rpn = even_ranks_per_node({2});
  auto h = make_hierarchical_communicator(MPI_COMM_WORLD, "dp", test_opts(rpn));
  const int p = h->size(), r = h->rank();
  for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{1001}}) {
    Tensor in = filled(n, DType::F16, r);
    const ShardRange s = shard_range(n, p, r);
    Tensor shard = Tensor::empty({s.size()}, DType::F16), full = Tensor::empty({n}, DType::F16);
    h->reduce_scatter(in, shard, ReduceOp::Sum);
    h->all_gather(shard, full);
    CHECK(mismatches(full, ReduceOp::Sum, p) == 0);
    Tensor b = Tensor::empty({n}, DType::F32);
    for (int64_t i = 0; i < n; ++i) set(b, i, r == 0 ? float(i % 100) : -1.0f);
    h->broadcast(b, 0);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += get(b, i) != float(i % 100);
    CHECK(bad == 0);
    // Around the ring, every rank sending before it receives (4 MB: must not deadlock).
    const int64_t big = n == 1001 ? int64_t{1} << 20 : n;
    Tensor out = filled(big, DType::F32, r), got = Tensor::empty({big}, DType::F32);
    WorkPtr sw = h->send_async(out, (r + 1) % p, 9);
    WorkPtr rw = h->recv_async(got, (r + p - 1) % p, 9);
    rw->wait();
    sw->wait();
    bad = 0;
    for (int64_t i = 0; i < big; ++i) bad += get(got, i) != input((r + p - 1) % p, i);
    CHECK(bad == 0);
    h->barrier();
  }
}
