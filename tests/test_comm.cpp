// The communication layer: exact collectives at any world size (run with mpiexec -n 1, 2, 3 or 4), ordering,
// events, network emulation and the alpha-beta model, for both host transports (shared memory, and MPI with
// polled waits). Every rank runs every case in the same order.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <sched.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/make_communicator.h"
#include "comm/mpi_init.h"
#include "comm/mpi_types.h"
#include "comm/realtime_threads.h"
#include "comm/shm_communicator.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "rank_values.h"

using namespace mt;
using namespace mt::test;

namespace {

using Transport = CommOptions::Transport;

CommOptions test_opts(Transport t) {
  CommOptions o;
  o.timeout_s = 60;  // a mismatched rank aborts the job instead of hanging CI
  o.transport = t;
  return o;
}

std::unique_ptr<Communicator> world(const CommOptions& o, const char* name = "world") {
  return make_communicator(MPI_COMM_WORLD, name, o);
}

// The case runs once per host transport (Catch2 re-enters it for each generated value, on every rank alike).
#define EACH_TRANSPORT()                                                     \
  const Transport transport = GENERATE(Transport::Shm, Transport::Mpi); \
  INFO((transport == Transport::Shm ? "shared-memory transport" : "MPI transport"))


const std::vector<int64_t> kSizes = {0, 1, 2, 3, 5, 7, 13, 1000, 4099};
const std::vector<DType> kTypes = {DType::F32, DType::BF16, DType::F16};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};

double now_us() { return trace_clock_us(); }

}  // namespace

TEST_CASE("shard_range splits n into size contiguous shards, last ones short") {
  CHECK(shard_range(10, 4, 0).begin == 0);
  CHECK(shard_range(10, 4, 0).end == 3);
  CHECK(shard_range(10, 4, 2).begin == 6);
  CHECK(shard_range(10, 4, 3).begin == 9);
  CHECK(shard_range(10, 4, 3).end == 10);
  CHECK(shard_range(2, 4, 1).size() == 1);
  CHECK(shard_range(2, 4, 2).size() == 0);
  CHECK(shard_range(2, 4, 3).begin == 2);
  CHECK(shard_range(0, 3, 1).size() == 0);
  for (int64_t n : {0, 1, 7, 100, 101}) {
    for (int p : {1, 2, 3, 4, 8}) {
      int64_t covered = 0;
      for (int r = 0; r < p; ++r) {
        ShardRange s = shard_range(n, p, r);
        CHECK(s.begin == covered);
        covered = s.end;
      }
      CHECK(covered == n);
    }
  }
}

TEST_CASE("alpha-beta predictions") {
  CommOptions o;
  o.latency_us = 10;
  o.bandwidth_gbps = 1;  // 1e-3 us per byte
  o.inter_latency_us = 100;
  o.inter_bandwidth_gbps = 0.5;
  LinkModel intra = link_model(o, false), inter = link_model(o, true);
  CHECK(intra.alpha_us == 10);
  CHECK(intra.beta_us_per_byte == Approx(1e-3));
  CHECK(inter.alpha_us == 100);
  CHECK(inter.beta_us_per_byte == Approx(2e-3));
  CHECK(predict_us(CommKind::AllReduce, 4000, 4, intra) == Approx(2 * 3 * (10 + 1000 * 1e-3)));
  CHECK(predict_us(CommKind::ReduceScatter, 4000, 4, intra) == Approx(3 * (10 + 1.0)));
  CHECK(predict_us(CommKind::AllGather, 4000, 4, inter) == Approx(3 * (100 + 2.0)));
  CHECK(predict_us(CommKind::Broadcast, 4000, 4, intra) == Approx(2 * (10 + 4.0)));
  CHECK(predict_us(CommKind::Broadcast, 4000, 5, intra) == Approx(3 * (10 + 4.0)));
  CHECK(predict_us(CommKind::Send, 4000, 4, inter) == Approx(100 + 8.0));
  CHECK(predict_us(CommKind::Recv, 4000, 2, intra) == Approx(10 + 4.0));
  CHECK(predict_us(CommKind::Barrier, 0, 4, intra) == Approx(2 * 2 * 10));
  CHECK(predict_us(CommKind::AllReduce, 4000, 1, intra) == 0);
  CHECK(predict_us(CommKind::Barrier, 0, 1, intra) == 0);
  CommOptions unlimited;
  unlimited.latency_us = 5;
  CHECK(link_model(unlimited, false).beta_us_per_byte == 0);
  CHECK(!CommOptions{}.emulating());
  CHECK(o.emulating());
}

TEST_CASE("all_reduce: exact sums, averages and maxima for fp32, bf16, fp16 at uneven and zero sizes") {
  EACH_TRANSPORT();
  auto c = world(test_opts(transport));
  const int p = c->size(), r = c->rank();
  for (DType dt : kTypes)
    for (ReduceOp op : kOps)
      for (int64_t n : kSizes) {
        Tensor t = Tensor::empty({n}, dt);
        for (int64_t i = 0; i < n; ++i) set(t, i, input(r, i));
        c->all_reduce(t, op);
        int bad = 0;
        for (int64_t i = 0; i < n; ++i) bad += get(t, i) != expected(op, p, i);
        INFO("dtype " << dtype_name(dt) << " op " << int(op) << " n " << n);
        CHECK(bad == 0);
      }
}

TEST_CASE("MPI transport in groups of two: its one-exchange all-reduce gives MPICH's own bits on both ranks") {
  // Inexact values (every sum rounds) in pairs of ranks, large enough for MPICH's rendezvous protocol: the
  // exchange must round exactly as MPI_Allreduce does, or layouts with dp groups of two would drift.
  const int world_size = [] { int s = 0; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }();
  const int world_rank = [] { int r = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }();
  if (world_size < 2) return;
  MPI_Comm pair;  // {0, 1}, {2, 3}, ...; an odd last rank alone
  MPI_Comm_split(MPI_COMM_WORLD, world_rank / 2, world_rank, &pair);
  auto c = make_communicator(pair, "pair", test_opts(Transport::Mpi));
  const int64_t n = 300001;
  for (DType dt : {DType::F32, DType::BF16})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      Tensor mine = Tensor::empty({n}, dt), theirs = Tensor::empty({n}, dt);
      for (int64_t i = 0; i < n; ++i) set(mine, i, std::sin(0.37 * double(i) + 1.3 * world_rank) * 1e3 / (1 + i % 97));
      copy_convert(theirs, mine);
      c->all_reduce(mine, op);
      MPI_Allreduce(MPI_IN_PLACE, theirs.data(), int(n), mpi_type(dt), mpi_op(dt, op), pair);
      uint32_t digest = 0;  // the ranks of a pair hold the same bits
      for (int64_t i = 0; i < n; ++i) digest = digest * 31u + uint32_t(get(mine, i) * 64.0);
      uint32_t peer = digest;
      MPI_Allreduce(MPI_IN_PLACE, &peer, 1, MPI_UINT32_T, MPI_BXOR, pair);
      INFO("dtype " << dtype_name(dt) << " op " << int(op) << " group of " << c->size());
      CHECK(std::memcmp(mine.data(), theirs.data(), mine.nbytes()) == 0);
      CHECK(peer == (c->size() == 2 ? 0u : digest));
    }
  c.reset();
  MPI_Comm_free(&pair);
}

TEST_CASE("reduce_scatter gives each rank its shard, and all_gather of the shards equals all_reduce") {
  EACH_TRANSPORT();
  auto c = world(test_opts(transport));
  const int p = c->size(), r = c->rank();
  for (DType dt : kTypes)
    for (ReduceOp op : kOps)
      for (int64_t n : kSizes) {
        INFO("dtype " << dtype_name(dt) << " op " << int(op) << " n " << n);
        Tensor in = Tensor::empty({n}, dt);
        for (int64_t i = 0; i < n; ++i) set(in, i, input(r, i));
        const ShardRange s = shard_range(n, p, r);
        Tensor shard = Tensor::empty({s.size()}, dt);
        c->reduce_scatter(in, shard, op);
        int bad = 0;
        for (int64_t j = 0; j < s.size(); ++j) bad += get(shard, j) != expected(op, p, s.begin + j);
        CHECK(bad == 0);
        Tensor full = Tensor::empty({n}, dt);
        c->all_gather(shard, full);
        bad = 0;
        for (int64_t i = 0; i < n; ++i) bad += get(full, i) != expected(op, p, i);
        CHECK(bad == 0);
      }
}

TEST_CASE("reduce_scatter into its own shard of the input and all_gather in place (the ZeRO layout)") {
  EACH_TRANSPORT();
  auto c = world(test_opts(transport));
  const int p = c->size(), r = c->rank();
  for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{1001}}) {
    Tensor buf = Tensor::empty({n}, DType::F32);
    for (int64_t i = 0; i < n; ++i) set(buf, i, input(r, i));
    const ShardRange s = shard_range(n, p, r);
    Tensor mine = buf.slice(s.begin, {s.size()});
    c->reduce_scatter(buf, mine, ReduceOp::Sum);
    c->all_gather(mine, buf);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += get(buf, i) != expected(ReduceOp::Sum, p, i);
    CHECK(bad == 0);
  }
}

TEST_CASE("all_gather concatenates shards in rank order") {
  EACH_TRANSPORT();
  auto c = world(test_opts(transport));
  const int p = c->size(), r = c->rank();
  for (DType dt : kTypes)
    for (int64_t n : kSizes) {
      const ShardRange s = shard_range(n, p, r);
      Tensor in = Tensor::empty({s.size()}, dt);
      for (int64_t j = 0; j < s.size(); ++j) set(in, j, static_cast<float>((s.begin + j) % 200));
      Tensor out = Tensor::empty({n}, dt);
      c->all_gather(in, out);
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) bad += get(out, i) != static_cast<float>(i % 200);
      INFO("dtype " << dtype_name(dt) << " n " << n);
      CHECK(bad == 0);
    }
}

TEST_CASE("broadcast from the last rank") {
  EACH_TRANSPORT();
  auto c = world(test_opts(transport));
  const int p = c->size(), r = c->rank(), root = p - 1;
  for (DType dt : kTypes)
    for (int64_t n : kSizes) {
      Tensor t = Tensor::empty({n}, dt);
      for (int64_t i = 0; i < n; ++i) set(t, i, r == root ? static_cast<float>(i % 100) : -1.0f);
      c->broadcast(t, root);
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) bad += get(t, i) != static_cast<float>(i % 100);
      CHECK(bad == 0);
    }
}

TEST_CASE("send/recv around a ring, every rank sending before receiving (large messages do not deadlock)") {
  EACH_TRANSPORT();
  auto c = world(test_opts(transport));
  const int p = c->size(), r = c->rank();
  for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{1} << 20}) {
    Tensor out = Tensor::empty({n}, DType::F32), in = Tensor::empty({n}, DType::F32);
    for (int64_t i = 0; i < n; ++i) set(out, i, static_cast<float>(r * 1000 + i % 1000));
    WorkPtr s = c->send_async(out, (r + 1) % p, 7);
    WorkPtr q = c->recv_async(in, (r + p - 1) % p, 7);
    q->wait();
    s->wait();
    const int from = (r + p - 1) % p;
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += get(in, i) != static_cast<float>(from * 1000 + i % 1000);
    CHECK(bad == 0);
  }
  // Tags keep messages apart: two messages to the same peer received in the opposite order.
  Tensor a = Tensor::empty({4}, DType::F32), b = Tensor::empty({4}, DType::F32);
  Tensor ra = Tensor::empty({4}, DType::F32), rb = Tensor::empty({4}, DType::F32);
  for (int i = 0; i < 4; ++i) set(a, i, 1), set(b, i, 2);
  auto s1 = c->send_async(a, (r + 1) % p, 1);
  auto s2 = c->send_async(b, (r + 1) % p, 2);
  auto q2 = c->recv_async(rb, (r + p - 1) % p, 2);
  auto q1 = c->recv_async(ra, (r + p - 1) % p, 1);
  q1->wait(), q2->wait(), s1->wait(), s2->wait();
  CHECK(get(ra, 3) == 1);
  CHECK(get(rb, 3) == 2);
}

TEST_CASE("barrier") {
  EACH_TRANSPORT();
  auto c = world(test_opts(transport));
  for (int i = 0; i < 5; ++i) c->barrier();
  CHECK(c->barrier_async() != nullptr);
}

TEST_CASE("many async operations issued back to back complete in order with the right results") {
  EACH_TRANSPORT();
  auto c = world(test_opts(transport));
  const int p = c->size(), r = c->rank();
  std::vector<CommEvent> events;
  std::mutex m;
  c->set_event_sink([&](const CommEvent& e) {
    std::lock_guard<std::mutex> lk(m);
    events.push_back(e);
  });
  const int kOpsN = 60;
  std::vector<Tensor> bufs;
  std::vector<WorkPtr> works;
  for (int k = 0; k < kOpsN; ++k) {
    const int64_t n = 1 + 97 * k;
    Tensor t = Tensor::empty({n}, k % 3 == 0 ? DType::BF16 : DType::F32);
    for (int64_t i = 0; i < n; ++i) set(t, i, input(r, i));
    bufs.push_back(t);
    works.push_back(k % 5 == 4 ? c->broadcast_async(t, k % p) : c->all_reduce_async(t, ReduceOp::Sum));
  }
  // Waiting on the last handle implies every earlier one is done.
  works.back()->wait();
  for (auto& w : works) CHECK(w->done());
  for (int k = 0; k < kOpsN; ++k) {
    int bad = 0;
    for (int64_t i = 0; i < bufs[k].numel(); ++i) {
      const float want = k % 5 == 4 ? input(k % p, i) : expected(ReduceOp::Sum, p, i);
      bad += get(bufs[k], i) != want;
    }
    INFO("op " << k);
    CHECK(bad == 0);
  }
  std::lock_guard<std::mutex> lk(m);
  REQUIRE(events.size() == static_cast<size_t>(kOpsN));
  for (int k = 0; k < kOpsN; ++k) {
    CHECK(events[k].seq == static_cast<uint64_t>(k + 1));
    CHECK(events[k].comm == "world");
    CHECK(events[k].op == (k % 5 == 4 ? "broadcast" : "all_reduce"));
    CHECK(events[k].bytes == static_cast<int64_t>(bufs[k].nbytes()));
    CHECK(events[k].issue_us <= events[k].start_us);
    CHECK(events[k].start_us <= events[k].end_us);
    if (k > 0) CHECK(events[k - 1].end_us <= events[k].start_us);
  }
}

TEST_CASE("set-up calls: shares_memory with and without the node map agrees with MPI's own split, and the "
          "yielding collectives give MPI's results") {
  int wr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, wr % 2, wr, &half);
  std::vector<MPI_Comm> comms = {MPI_COMM_WORLD, half};
  std::vector<bool> expected;
  for (MPI_Comm c : comms) {  // MPI's own answer: the group's node-local split holds the whole group on every rank
    int size = 0, local = 0;
    MPI_Comm_size(c, &size);
    MPI_Comm node;
    MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    int every = 0, one = local == size ? 1 : 0;
    MPI_Allreduce(&one, &every, 1, MPI_INT, MPI_MIN, c);
    expected.push_back(every == 1);
  }
  // The CPU tests' session does not call node_ranks() (unless an earlier case did): shares_memory asks MPI. The
  // trainer calls it at start: shares_memory reads the map.
  for (size_t i = 0; i < comms.size(); ++i) CHECK(shares_memory(comms[i]) == expected[i]);
  node_ranks();
  REQUIRE(world_node_map() != nullptr);
  for (size_t i = 0; i < comms.size(); ++i) CHECK(shares_memory(comms[i]) == expected[i]);
  for (MPI_Comm c : comms) {
    int size = 0, rank = 0, dup_size = 0, dup_rank = -1;
    MPI_Comm_size(c, &size), MPI_Comm_rank(c, &rank);
    MPI_Comm dup;
    comm_dup_yielding(c, &dup);
    MPI_Comm_size(dup, &dup_size), MPI_Comm_rank(dup, &dup_rank);
    CHECK((dup_rank == rank && dup_size == size));
    barrier_yielding(dup);
    CHECK(allreduce_int_yielding(rank, MPI_MAX, dup) == size - 1);
    CHECK(allreduce_int_yielding(rank + 1, MPI_SUM, dup) == size * (size + 1) / 2);
    MPI_Comm_free(&dup);
  }
  MPI_Comm_free(&half);
}

TEST_CASE("two communicators (world and a split) run concurrently") {
  EACH_TRANSPORT();
  int wr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, wr % 2, wr, &half);
  auto a = world(test_opts(transport), "a");
  auto b = make_communicator(half, "b", test_opts(transport));
  MPI_Comm_free(&half);
  std::vector<Tensor> ta, tb;
  std::vector<WorkPtr> w;
  for (int k = 0; k < 20; ++k) {
    ta.push_back(Tensor::empty({4096}, DType::F32));
    tb.push_back(Tensor::empty({333}, DType::F16));
    for (int64_t i = 0; i < 4096; ++i) set(ta.back(), i, input(a->rank(), i));
    for (int64_t i = 0; i < 333; ++i) set(tb.back(), i, input(b->rank(), i));
    w.push_back(a->all_reduce_async(ta.back(), ReduceOp::Sum));
    w.push_back(b->all_reduce_async(tb.back(), ReduceOp::Max));
  }
  for (auto& x : w) x->wait();
  int bad = 0;
  for (int k = 0; k < 20; ++k) {
    for (int64_t i = 0; i < 4096; ++i) bad += get(ta[k], i) != expected(ReduceOp::Sum, a->size(), i);
    for (int64_t i = 0; i < 333; ++i) bad += get(tb[k], i) != expected(ReduceOp::Max, b->size(), i);
  }
  CHECK(bad == 0);
}

TEST_CASE("emulation: operations take at least the predicted time, off the caller's thread") {
  EACH_TRANSPORT();
  CommOptions o = test_opts(transport);
  o.latency_us = 20000;
  o.bandwidth_gbps = 0.5;  // 4 MB: 8 ms per full transfer
  auto c = world(o);
  const int p = c->size(), r = c->rank();
  const LinkModel link = link_model(o, false);
  const int64_t n = 1 << 20;  // 4 MB of fp32
  Tensor t = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) set(t, i, input(r, i));
  c->barrier();
  const double wait0 = c->total_wait_us();
  double t0 = now_us();
  WorkPtr w = c->all_reduce_async(t, ReduceOp::Sum);
  const double issue_cost = now_us() - t0;
  w->wait();
  const double took = now_us() - t0;
  const double want = predict_us(CommKind::AllReduce, n * 4, p, link);
  CHECK(took >= want);
  CHECK(get(t, 5) == expected(ReduceOp::Sum, p, 5));
  if (want > 0) {
    // Structure, not speed: issuing returned long before the emulated time (>= 56 ms here) had passed, and the
    // caller then blocked in wait(). Both hold on a loaded machine.
    CHECK(issue_cost < 0.5 * want);
    CHECK(c->total_wait_us() - wait0 >= 0.25 * want);
  }

  // Point-to-point: alpha + n beta, at any size (p = 1 sends to itself).
  Tensor in = Tensor::empty({n}, DType::F32);
  t0 = now_us();
  auto s = c->send_async(t, (r + 1) % p, 3);
  auto q = c->recv_async(in, (r + p - 1) % p, 3);
  q->wait();
  s->wait();
  CHECK(now_us() - t0 >= predict_us(CommKind::Recv, n * 4, p, link));

  t0 = now_us();
  c->barrier();
  CHECK(now_us() - t0 >= predict_us(CommKind::Barrier, 0, p, link));

  // The emulated delay passes while the caller computes: an operation left alone completes by itself, and
  // waiting on it afterwards costs the caller nothing.
  if (want > 0) {
    c->barrier();
    w = c->all_reduce_async(t, ReduceOp::Sum);
    const double w0 = c->total_wait_us();
    t0 = now_us();
    while (!w->done() && now_us() - t0 < 100 * want) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(w->done());
    w->wait();
    CHECK(c->total_wait_us() - w0 < 0.25 * want);
  }
}

TEST_CASE("emulation: a group spanning emulated nodes uses the inter-node link") {
  EACH_TRANSPORT();
  CommOptions o = test_opts(transport);
  o.latency_us = 100;
  o.inter_latency_us = 5000;
  o.ranks_per_node = 1;  // every rank its own node
  auto c = world(o);
  const int p = c->size();
  Tensor t = Tensor::empty({64}, DType::F32);
  c->barrier();
  double t0 = now_us();
  c->all_reduce(t, ReduceOp::Sum);
  CHECK(now_us() - t0 >= predict_us(CommKind::AllReduce, 256, p, link_model(o, p > 1)));

  o.ranks_per_node = 64;     // one node: intra links only
  o.inter_latency_us = 1e6;  // so that "it did not take the inter-node link" holds on a loaded machine
  auto d = world(o);
  d->barrier();
  t0 = now_us();
  d->all_reduce(t, ReduceOp::Sum);
  const double took = now_us() - t0;
  CHECK(took >= predict_us(CommKind::AllReduce, 256, p, link_model(o, false)));
  if (p > 1) CHECK(took < predict_us(CommKind::AllReduce, 256, p, link_model(o, true)));
}

// The shared-memory transport with tiny rounds and slots, so that every operation takes many rounds or chunks.
TEST_CASE("shared memory: collectives in many rounds and messages in many chunks") {
  ShmSizes tiny;
  tiny.half_bytes = 256;
  tiny.slot_bytes = 64;
  tiny.slots = 2;
  auto c = make_shm_transport(MPI_COMM_WORLD, "tiny", test_opts(Transport::Shm), tiny);
  const int p = c->size(), r = c->rank();
  for (DType d : kTypes)
    for (ReduceOp op : kOps)
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64} * p + 5, int64_t{1000}}) {
        INFO(dtype_name(d) << " n=" << n);
        Tensor t = Tensor::empty({n}, d), rs_in = Tensor::empty({n}, d);
        for (int64_t i = 0; i < n; ++i) set(t, i, input(r, i)), set(rs_in, i, input(r, i));
        c->all_reduce(t, op);
        int bad = 0;
        for (int64_t i = 0; i < n; ++i) bad += get(t, i) != expected(op, p, i);
        CHECK(bad == 0);
        const ShardRange mine = shard_range(n, p, r);
        Tensor shard = Tensor::empty({mine.size()}, d), all = Tensor::empty({n}, d);
        c->reduce_scatter(rs_in, shard, op);
        c->all_gather(shard, all);
        bad = 0;
        for (int64_t i = 0; i < n; ++i) bad += get(all, i) != expected(op, p, i);
        CHECK(bad == 0);
      }
  Tensor b = Tensor::empty({777}, DType::F32);
  for (int64_t i = 0; i < 777; ++i) set(b, i, input(r, i));
  c->broadcast(b, p - 1);
  int bad = 0;
  for (int64_t i = 0; i < 777; ++i) bad += get(b, i) != input(p - 1, i);
  CHECK(bad == 0);

  // Messages of many chunks, received in another order than sent (tags 1, 2), and two with the same tag, which
  // must arrive in the order sent; all sent before anything is received.
  const int to = (r + 1) % p, from = (r + p - 1) % p;
  const int64_t n = 300;
  std::vector<Tensor> out(4), in(4);
  for (int k = 0; k < 4; ++k) {
    out[k] = Tensor::empty({n + k}, DType::F32);
    in[k] = Tensor::empty({n + k}, DType::F32);
    for (int64_t i = 0; i < n + k; ++i) set(out[k], i, static_cast<float>(r * 10000 + k * 1000 + i));
  }
  const int tags[4] = {1, 2, 5, 5};
  std::vector<WorkPtr> works;
  for (int k = 0; k < 4; ++k) works.push_back(c->send_async(out[k], to, tags[k]));
  for (int k : {1, 0, 2, 3}) works.push_back(c->recv_async(in[k], from, tags[k]));
  for (auto& w : works) w->wait();
  bad = 0;
  for (int k = 0; k < 4; ++k)
    for (int64_t i = 0; i < n + k; ++i) bad += get(in[k], i) != static_cast<float>(from * 10000 + k * 1000 + i);
  CHECK(bad == 0);
}

TEST_CASE("shared memory: a receive posted after its message arrived, and a collective between") {
  auto c = make_communicator(MPI_COMM_WORLD, "late", test_opts(Transport::Shm));
  const int p = c->size(), r = c->rank();
  Tensor msg = Tensor::empty({5000}, DType::BF16), got = Tensor::empty({5000}, DType::BF16);
  for (int64_t i = 0; i < 5000; ++i) set(msg, i, static_cast<float>(r + i % 50));
  auto s = c->send_async(msg, (r + 1) % p, 9);
  Tensor t = Tensor::empty({100}, DType::F32);
  for (int64_t i = 0; i < 100; ++i) set(t, i, input(r, i));
  c->all_reduce(t, ReduceOp::Sum);  // every message is sent (or on its way) before any receive is posted
  c->recv(got, (r + p - 1) % p, 9);
  s->wait();
  int bad = 0;
  for (int64_t i = 0; i < 5000; ++i) bad += get(got, i) != static_cast<float>((r + p - 1) % p + i % 50);
  for (int64_t i = 0; i < 100; ++i) bad += get(t, i) != expected(ReduceOp::Sum, p, i);
  CHECK(bad == 0);
}

TEST_CASE("real-time threads: the shared-memory transport and the emulation take them when asked, MPI's thread never") {
  if (!realtime_threads_permitted()) {
    // The same answer on every rank of one machine: all of them leave the case together.
    WARN("this process may not run real-time threads: only that the refusal gives a reason is checked");
    std::string why;
    realtime_threads_permitted(&why);
    CHECK_FALSE(why.empty());
    return;
  }
  // Threads of this process under SCHED_FIFO; a communicator's threads have set their policy once an operation
  // through it has completed (the queue's thread ran it, the emulation's timer completed it).
  const auto fifo_threads = [] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
      n += sched_getscheduler(std::stoi(e.path().filename().string())) == SCHED_FIFO;
    return n;
  };
  // A real-time thread of an earlier communicator may still be ending when a count starts (one did, and every
  // count came out one short): each count starts once none is left, or after 5 s with those that stay.
  const auto settled = [&] {
    int n = fifo_threads();
    for (int i = 0; i < 500 && n > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      n = fifo_threads();
    }
    return n;
  };
  const auto threads_with = [&](Transport t, bool realtime, bool emulated) {
    CommOptions o = test_opts(t);
    o.realtime_threads = realtime;
    if (emulated) o.latency_us = 1;
    const int before = settled();
    auto c = world(o, "rt");
    c->barrier();
    return fifo_threads() - before;
  };
  CHECK(threads_with(Transport::Shm, true, false) == 1);
  CHECK(threads_with(Transport::Shm, true, true) == 2);
  CHECK(threads_with(Transport::Shm, false, true) == 0);
  CHECK(threads_with(Transport::Mpi, true, true) == 1);  // the emulation's timer; MPI's own thread polls
  CHECK(threads_with(Transport::Mpi, false, false) == 0);
}
