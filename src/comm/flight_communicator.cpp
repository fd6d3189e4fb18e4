// with_flight_recorder (flight_recorder.h): a communicator that records every operation before passing it on.
// An operation is "started" when the inner backend's thread takes it (its start sink), "completed" when the inner
// reports it done (its event, with the backend's own start and end times) or, where its events number other
// operations, when a caller sees its handle complete.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <memory>

#include "comm/comm_util.h"
#include "comm/flight_recorder.h"
#include "comm/make_communicator.h"

namespace mt {

namespace {

class FlightWork final : public Work {
 public:
  FlightWork(WorkPtr inner, int group, uint64_t seq) : inner_(std::move(inner)), group_(group), seq_(seq) {}
  void wait() override {
    inner_->wait();
    FlightRecorder::get().completed(group_, seq_, -1, trace_clock_us());
  }
  bool done() const override {
    const bool d = inner_->done();
    if (d) FlightRecorder::get().completed(group_, seq_, -1, trace_clock_us());
    return d;
  }

 private:
  WorkPtr inner_;
  int group_;
  uint64_t seq_;
};

class FlightCommunicator final : public Communicator {
 public:
  FlightCommunicator(std::unique_ptr<Communicator> inner, std::vector<int> world_ranks)
      : rec_(FlightRecorder::get()), members_(world_ranks), inner_(std::move(inner)) {
    group_ = rec_.add_group(inner_->name(), std::move(world_ranks), inner_->rank());
    const bool own = inner_->events_number_own_operations();
    inner_->set_event_sink([this, own](const CommEvent& e) {
      if (own) rec_.completed(group_, e.seq, e.start_us, e.end_us);
      if (sink_) sink_(e);
    });
    inner_->set_start_sink([this](uint64_t seq) { rec_.started(group_, seq, trace_clock_us()); });
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  double total_wait_us() const override { return inner_->total_wait_us(); }
  double thread_cpu_us() const override { return inner_->thread_cpu_us(); }
  bool set_emulated_link(double latency_us, double bandwidth_gbps) override {
    return inner_->set_emulated_link(latency_us, bandwidth_gbps);
  }
  bool collective_digest(uint64_t* digest, std::vector<int>* world_members) const override {
    *digest = digest_.load();
    *world_members = members_;
    return true;
  }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    const uint64_t seq = record(CommKind::AllReduce, t, static_cast<int>(op), -1, -1);
    return wrap(inner_->all_reduce_async(t, op), seq);
  }
  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override {
    const uint64_t seq = record(CommKind::ReduceScatter, in, static_cast<int>(op), -1, -1);
    return wrap(inner_->reduce_scatter_async(in, out, op), seq);
  }
  WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override {
    const uint64_t seq = record(CommKind::AllGather, out, -1, -1, -1);
    return wrap(inner_->all_gather_async(in, out), seq);
  }
  WorkPtr broadcast_async(const Tensor& t, int root) override {
    const uint64_t seq = record(CommKind::Broadcast, t, -1, root, -1);
    return wrap(inner_->broadcast_async(t, root), seq);
  }
  WorkPtr send_async(const Tensor& t, int peer, int tag) override {
    const uint64_t seq = record(CommKind::Send, t, -1, peer, tag);
    return wrap(inner_->send_async(t, peer, tag), seq);
  }
  WorkPtr recv_async(const Tensor& t, int peer, int tag) override {
    const uint64_t seq = record(CommKind::Recv, t, -1, peer, tag);
    return wrap(inner_->recv_async(t, peer, tag), seq);
  }
  WorkPtr barrier_async() override {
    fold(CommKind::Barrier, 0, DType::F32, -1, -1);
    const uint64_t seq = rec_.issue(group_, CommKind::Barrier, 0, DType::F32, -1, -1, -1);
    return wrap(inner_->barrier_async(), seq);
  }

 private:
  // Recorded before the inner issues it: a record exists before any event can complete it.
  uint64_t record(CommKind kind, const Tensor& t, int reduce, int peer, int tag) {
    if (kind != CommKind::Send && kind != CommKind::Recv) fold(kind, t.numel(), t.dtype(), reduce, peer);
    return rec_.issue(group_, kind, t.numel(), t.dtype(), reduce, peer, tag);
  }
  // The collectives' digest (FNV-1a over each one's fields; sends and receives differ between ranks by nature).
  void fold(CommKind kind, int64_t count, DType dtype, int reduce, int root) {
    uint64_t h = digest_.load();
    for (const int64_t v : {int64_t(kind), count, int64_t(dtype), int64_t(reduce), int64_t(root)})
      for (int b = 0; b < 8; ++b) h = (h ^ ((uint64_t(v) >> (8 * b)) & 0xff)) * 1099511628211ull;
    digest_.store(h);
  }
  WorkPtr wrap(WorkPtr w, uint64_t seq) { return std::make_shared<FlightWork>(std::move(w), group_, seq); }

  // inner_ last: destroyed first, it joins its thread, whose sink still reads rec_ and group_.
  FlightRecorder& rec_;
  int group_ = -1;
  std::vector<int> members_;  // world ranks
  // Written as one group's collectives are issued (one thread at a time), read by the step's check.
  std::atomic<uint64_t> digest_{14695981039346656037ull};
  std::unique_ptr<Communicator> inner_;
};

}  // namespace

namespace {
// A group's digest in kDigestFloats parts of 22 bits: exact in fp32, the step metrics' reduction type.
void digest_parts(uint64_t d, float* out) {
  for (int i = 0; i < kDigestFloats; ++i) out[i] = float((d >> (22 * i)) & 0x3fffff);
}
}  // namespace

void write_digests(const std::vector<Communicator*>& groups, float* mine) {
  std::vector<int> members;
  for (size_t g = 0; g < groups.size(); ++g) {
    uint64_t d = 0;
    if (groups[g] && groups[g]->collective_digest(&d, &members)) digest_parts(d, mine + g * kDigestFloats);
  }
}

void check_digests(const std::vector<Communicator*>& groups, const float* all, int world_rank, int step) {
  const size_t per_rank = groups.size() * kDigestFloats;
  std::vector<int> members;
  for (size_t g = 0; g < groups.size(); ++g) {
    uint64_t d = 0;
    if (!groups[g] || groups[g]->size() <= 1 || !groups[g]->collective_digest(&d, &members)) continue;
    auto same = [&](int a, int b) {
      return std::equal(all + a * per_rank + g * kDigestFloats, all + a * per_rank + (g + 1) * kDigestFloats,
                        all + b * per_rank + g * kDigestFloats);
    };
    std::string agree, differ;
    for (const int m : members) {
      std::string& to = same(m, world_rank) ? agree : differ;
      to += fmt::format("{}{}", to.empty() ? "" : ", ", m);
    }
    if (differ.empty()) continue;
    abort_job_with_dumps(world_rank, fmt::format("desync on communicator '{}': ranks [{}] and [{}] issued different "
                                                 "collectives (operation, count, dtype or root) by the end of step {}",
                                                 groups[g]->name(), agree, differ, step));
  }
}

std::unique_ptr<Communicator> with_flight_recorder(std::unique_ptr<Communicator> c, MPI_Comm comm) {
  if (!FlightRecorder::get().on() || !c) return c;
  return std::make_unique<FlightCommunicator>(std::move(c), world_ranks(comm));
}

}  // namespace mt
