// Communicators on device tensors: the MPI backend staging Device::CUDA tensors through pinned host buffers
// (any number of ranks, sharing one GPU or not), and the NCCL backend. Every result is compared bit for bit with
// the MPI backend on host tensors, and with the exact value (rank-valued inputs whose sums are exact in fp32,
// bf16 and fp16). Run with mpiexec -n 1, 2 or 4; the entry point (catch_mpi_main.cpp) exits 77 (skipped) where
// no GPU is usable. Every rank runs every case in the same order.
//
// NCCL does not support several ranks on one GPU (ncclCommInitRank fails on a duplicate GPU), so the NCCL case
// runs only when every rank has a GPU of its own (the node's ranks fit its GPUs), which includes one rank; on a
// single shared GPU with 2 or 4 ranks it says so and checks nothing.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "comm/make_communicator.h"
#include "comm/mpi_init.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "rank_values.h"
#ifdef MESHTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "comm/nccl_communicator.h"
#include "core/cuda/cuda_context.h"
#endif

using namespace mt;
using namespace mt::test;

namespace {

CommOptions test_opts() {
  CommOptions o;
  o.timeout_s = 120;  // a mismatched rank aborts the job instead of hanging CI
  o.transport = CommOptions::Transport::Mpi;  // the transport that stages device tensors
  return o;
}

std::unique_ptr<Communicator> world(const CommOptions& o = test_opts(), const char* name = "world") {
  return make_communicator(MPI_COMM_WORLD, name, o);
}


// A pattern that names the rank, for broadcast and send/recv: rr * 16 + i % 16 (exact in bf16 up to 16 ranks).
float rank_pattern(int rr, int64_t i) { return static_cast<float>(rr * 16 + i % 16); }

Tensor host_filled(int64_t n, DType dt, float (*f)(int, int64_t), int r) {
  Tensor t = Tensor::empty({n}, dt);
  for (int64_t i = 0; i < n; ++i) set(t, i, f(r, i));
  return t;
}
Tensor rank_input(int64_t n, DType dt, int r) { return host_filled(n, dt, &input, r); }

// A device copy of a host tensor (queued on the compute stream).
Tensor to_device(const Tensor& h) {
  Tensor d = Tensor::empty(h.shape(), h.dtype(), Device::CUDA);
  copy_convert(d, h);
  return d;
}

// Same bytes (so bf16/fp16 rounding, signed zeros and all).
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

int count_unexpected(const Tensor& host, ReduceOp op, int p, int64_t first = 0) {
  int bad = 0;
  for (int64_t i = 0; i < host.numel(); ++i) bad += get(host, i) != expected(op, p, first + i);
  return bad;
}

const std::vector<int64_t> kSizes = {0, 1, 1000, 4099};  // 4099: uneven shards on 2 and 4 ranks
const std::vector<DType> kTypes = {DType::F32, DType::BF16, DType::F16};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};

// The collectives on `dev` (a communicator taking device tensors) against the MPI backend on host tensors.
// with_avg = false leaves Avg out: NCCL averages floats by pre-multiplying with 1/p, which rounds differently
// from the MPI backend's Sum-then-divide unless p is a power of two.
void check_collectives_against_host(Communicator& dev, Communicator& host, bool with_avg = true) {
  const int p = host.size(), r = host.rank();
  REQUIRE(dev.size() == p);
  REQUIRE(dev.rank() == r);
  std::vector<ReduceOp> ops = kOps;
  if (!with_avg) ops = {ReduceOp::Sum, ReduceOp::Max};
  for (DType dt : kTypes)
    for (int64_t n : kSizes) {
      for (ReduceOp op : ops) {
        INFO("dtype " << dtype_name(dt) << " op " << int(op) << " n " << n);
        // all_reduce
        Tensor h = rank_input(n, dt, r);
        Tensor d = to_device(h);
        host.all_reduce(h, op);
        dev.all_reduce(d, op);
        Tensor back = to_host(d);
        CHECK(same_bits(back, h));
        CHECK(count_unexpected(back, op, p) == 0);

        // reduce_scatter, then all_gather of the shards (= all_reduce)
        const ShardRange s = shard_range(n, p, r);
        Tensor hin = rank_input(n, dt, r), hshard = Tensor::empty({s.size()}, dt), hfull = Tensor::empty({n}, dt);
        Tensor din = to_device(hin), dshard = Tensor::empty({s.size()}, dt, Device::CUDA);
        Tensor dfull = Tensor::empty({n}, dt, Device::CUDA);
        host.reduce_scatter(hin, hshard, op);
        dev.reduce_scatter(din, dshard, op);
        Tensor shard_back = to_host(dshard);
        CHECK(same_bits(shard_back, hshard));
        CHECK(count_unexpected(shard_back, op, p, s.begin) == 0);
        host.all_gather(hshard, hfull);
        dev.all_gather(dshard, dfull);
        Tensor full_back = to_host(dfull);
        CHECK(same_bits(full_back, hfull));
        CHECK(count_unexpected(full_back, op, p) == 0);
      }
      // broadcast from the last rank
      INFO("broadcast dtype " << dtype_name(dt) << " n " << n);
      const int root = p - 1;
      Tensor h = host_filled(n, dt, &rank_pattern, r);
      Tensor d = to_device(h);
      host.broadcast(h, root);
      dev.broadcast(d, root);
      Tensor back = to_host(d);
      CHECK(same_bits(back, h));
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) bad += get(back, i) != rank_pattern(root, i);
      CHECK(bad == 0);
    }

  // The ZeRO layout on the device: reduce_scatter into this rank's own shard of the input, all_gather in place.
  for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{4099}}) {
    INFO("in place, n " << n);
    Tensor buf = to_device(rank_input(n, DType::F32, r));
    const ShardRange s = shard_range(n, p, r);
    Tensor mine = buf.slice(s.begin, {s.size()});
    dev.reduce_scatter(buf, mine, ReduceOp::Sum);
    dev.all_gather(mine, buf);
    CHECK(count_unexpected(to_host(buf), ReduceOp::Sum, p) == 0);
  }
}

}  // namespace

TEST_CASE("MPI backend, device tensors: every collective equals the host path, exactly") {
  auto host = world(test_opts(), "host");
  auto dev = world(test_opts(), "device");
  check_collectives_against_host(*dev, *host);
}

TEST_CASE("MPI backend, device tensors: send/recv around a ring, every rank sending before receiving") {
  auto c = world();
  const int p = c->size(), r = c->rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;  // one rank: sends to itself
  for (DType dt : kTypes)
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{4099}, int64_t{1} << 20}) {
      INFO("dtype " << dtype_name(dt) << " n " << n);
      Tensor out = to_device(host_filled(n, dt, &rank_pattern, r));
      Tensor in = Tensor::empty({n}, dt, Device::CUDA);
      WorkPtr s = c->send_async(out, next, 7);
      WorkPtr q = c->recv_async(in, prev, 7);
      q->wait();
      s->wait();
      Tensor got = to_host(in);
      CHECK(same_bits(got, host_filled(n, dt, &rank_pattern, prev)));
    }
  // Tags keep messages apart: two messages to the same peer received in the opposite order.
  Tensor a = to_device(host_filled(4, DType::F32, [](int, int64_t) { return 1.0f; }, r));
  Tensor b = to_device(host_filled(4, DType::F32, [](int, int64_t) { return 2.0f; }, r));
  Tensor ra = Tensor::empty({4}, DType::F32, Device::CUDA), rb = Tensor::empty({4}, DType::F32, Device::CUDA);
  auto s1 = c->send_async(a, next, 1);
  auto s2 = c->send_async(b, next, 2);
  auto q2 = c->recv_async(rb, prev, 2);
  auto q1 = c->recv_async(ra, prev, 1);
  q1->wait(), q2->wait(), s1->wait(), s2->wait();
  CHECK(get(to_host(ra), 3) == 1);
  CHECK(get(to_host(rb), 3) == 2);
  // A barrier between device operations.
  auto w = c->all_reduce_async(a, ReduceOp::Sum);
  c->barrier();
  w->wait();
  CHECK(get(to_host(a), 0) == static_cast<float>(p));
}

TEST_CASE("MPI backend, device tensors: async ops in flight are ordered after the kernels issued before them") {
  auto c = world();
  const int p = c->size(), r = c->rank();
  std::vector<CommEvent> events;
  std::mutex m;
  c->set_event_sink([&](const CommEvent& e) {
    std::lock_guard<std::mutex> lk(m);
    events.push_back(e);
  });
  // Every operation's buffer is written by compute-stream work issued just before the operation: zero_ (a
  // memset), a few conversion kernels through a scratch buffer (to keep the GPU busy while the host has already
  // issued the operation), then the final write of the input. An operation that read its input before that work
  // finished would see zeros or the scratch values; one that wrote its output before it would be overwritten.
  const int64_t n = int64_t{1} << 20;
  const Tensor src = to_device(rank_input(n, DType::F32, r));                 // r + 1 + i % 7
  const Tensor own = to_device(host_filled(n, DType::F32, &rank_pattern, r));  // broadcast payloads
  Tensor scratch = Tensor::empty({n}, DType::BF16, Device::CUDA);
  const int kOpsN = 12;
  std::vector<Tensor> bufs;
  std::vector<WorkPtr> works;
  for (int k = 0; k < kOpsN; ++k) {
    const bool bcast = k % 4 == 3;
    Tensor t = Tensor::empty({n}, k % 3 == 0 ? DType::BF16 : DType::F32, Device::CUDA);
    zero_(t);
    for (int j = 0; j < 4; ++j) copy_convert(scratch, j % 2 ? src : own), copy_convert(t, scratch);
    copy_convert(t, bcast ? own : src);
    bufs.push_back(t);
    works.push_back(bcast ? c->broadcast_async(t, k % p) : c->all_reduce_async(t, ReduceOp::Sum));
  }
  // Waiting on the last handle implies every earlier one is done (one queue per communicator).
  works.back()->wait();
  for (auto& w : works) CHECK(w->done());
  for (int k = 0; k < kOpsN; ++k) {
    // The results feed compute-stream work issued after wait(): a conversion to fp32, then the host copy.
    Tensor as_f32 = Tensor::empty({n}, DType::F32, Device::CUDA);
    copy_convert(as_f32, bufs[k]);
    Tensor got = to_host(as_f32);
    const bool bcast = k % 4 == 3;
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float want = bcast ? rank_pattern(k % p, i) : expected(ReduceOp::Sum, p, i);
      bad += get(got, i) != want;
    }
    INFO("op " << k);
    CHECK(bad == 0);
  }
  std::lock_guard<std::mutex> lk(m);
  REQUIRE(events.size() == static_cast<size_t>(kOpsN));
  for (int k = 0; k < kOpsN; ++k) {
    CHECK(events[k].seq == static_cast<uint64_t>(k + 1));
    CHECK(events[k].op == (k % 4 == 3 ? "broadcast" : "all_reduce"));
    CHECK(events[k].bytes == static_cast<int64_t>(bufs[k].nbytes()));
    CHECK(events[k].issue_us <= events[k].start_us);
    if (k > 0) CHECK(events[k - 1].end_us <= events[k].start_us);
  }
}

TEST_CASE("MPI backend, device tensors: emulated delay, off the caller's thread") {
  CommOptions o = test_opts();
  o.latency_us = 3000;
  o.bandwidth_gbps = 0.5;
  auto c = world(o);
  const int p = c->size(), r = c->rank();
  const int64_t n = int64_t{1} << 20;
  Tensor t = to_device(rank_input(n, DType::F32, r));
  c->barrier();
  const double t0 = trace_clock_us();
  WorkPtr w = c->all_reduce_async(t, ReduceOp::Sum);
  const double issue_cost = trace_clock_us() - t0;
  w->wait();
  const double want = predict_us(CommKind::AllReduce, n * 4, p, link_model(o, false));
  CHECK(trace_clock_us() - t0 >= want);
  if (want > 0) CHECK(issue_cost < 0.2 * want);
  CHECK(count_unexpected(to_host(t).slice(0, {7}), ReduceOp::Sum, p) == 0);
}

TEST_CASE("NCCL backend: the same results as the MPI host path (needs a GPU per rank)") {
#ifdef MESHTRAIN_WITH_CUDA
  // NCCL needs one GPU per rank: run only when each node's ranks fit its GPUs (always true for one rank).
  const NodeRanks node = node_ranks();
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  int fits = node.local_size <= gpus ? 1 : 0, all_fit = 0;
  MPI_Allreduce(&fits, &all_fit, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_fit) {
    WARN("NCCL case not run: ranks share a GPU, which NCCL does not support");
    return;
  }
  auto host = world(test_opts(), "host");
  auto nccl = make_nccl_communicator(MPI_COMM_WORLD, "nccl", test_opts(), compute_stream());
  const int size = nccl->size();
  check_collectives_against_host(*nccl, *host, (size & (size - 1)) == 0);

  // send/recv (NCCL sends to other ranks only; a send blocks its stream until the matching recv runs, so even
  // ranks send first and odd ranks receive first). Work::wait() orders the compute stream; to_host syncs it.
  const int p = nccl->size(), r = nccl->rank();
  if (p > 1) {
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    const int64_t n = 4099;
    Tensor out = to_device(host_filled(n, DType::BF16, &rank_pattern, r));
    Tensor in = Tensor::empty({n}, DType::BF16, Device::CUDA);
    WorkPtr a, b;
    if (r % 2 == 0) {
      a = nccl->send_async(out, next, 0);
      b = nccl->recv_async(in, prev, 0);
    } else {
      b = nccl->recv_async(in, prev, 0);
      a = nccl->send_async(out, next, 0);
    }
    a->wait();
    b->wait();
    CHECK(same_bits(to_host(in), host_filled(n, DType::BF16, &rank_pattern, prev)));
  }
  nccl->barrier();
  nccl.reset();  // every rank destroys it at the same point
#else
  SUCCEED("built without the CUDA backend");
#endif
}
