// A communicator that does nothing: every operation completes at once and leaves its buffers as they are. The
// planner times one tensor-parallel rank's compute on one process with it (the model only talks to its tp group
// through a Communicator); the values computed are meaningless, their cost is not.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_options.h"
#include "comm/communicator.h"

namespace mt::plan {

class NullCommunicator : public Communicator {
 public:
  NullCommunicator(int size, int rank) : size_(size), rank_(rank), name_("null") {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  WorkPtr all_reduce_async(const Tensor&, ReduceOp) override { return done(); }
  WorkPtr reduce_scatter_async(const Tensor&, const Tensor&, ReduceOp) override { return done(); }
  WorkPtr all_gather_async(const Tensor&, const Tensor&) override { return done(); }
  WorkPtr broadcast_async(const Tensor&, int) override { return done(); }
  WorkPtr send_async(const Tensor&, int, int) override { return done(); }
  WorkPtr recv_async(const Tensor&, int, int) override { return done(); }
  WorkPtr barrier_async() override { return done(); }
  double total_wait_us() const override { return 0; }

 private:
  struct Done : Work {
    void wait() override {}
    bool done() const override { return true; }
  };
  static WorkPtr done() { return std::make_shared<Done>(); }
  int size_, rank_;
  std::string name_;
};

// A collective as the planner's time model charges it: its kind and bytes as predict_us takes them (all-reduce: the
// tensor; all-gather: the output; reduce-scatter: the input).
struct TpOp {
  CommKind kind;
  int64_t bytes;
  bool operator<(const TpOp& o) const { return std::make_pair(int(kind), bytes) < std::make_pair(int(o.kind), o.bytes); }
  bool operator==(const TpOp& o) const { return kind == o.kind && bytes == o.bytes; }
};

// A NullCommunicator that also notes each collective it is asked for: the calibration runs the model's passes on
// one, so the planner's tensor-parallel traffic is what the model's own code asks for.
class CountingCommunicator : public NullCommunicator {
 public:
  using NullCommunicator::NullCommunicator;
  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    ops.push_back({CommKind::AllReduce, int64_t(t.nbytes())});
    return NullCommunicator::all_reduce_async(t, op);
  }
  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override {
    ops.push_back({CommKind::ReduceScatter, int64_t(in.nbytes())});
    return NullCommunicator::reduce_scatter_async(in, out, op);
  }
  WorkPtr all_gather_async(const Tensor& in, const Tensor& out) override {
    ops.push_back({CommKind::AllGather, int64_t(out.nbytes())});
    return NullCommunicator::all_gather_async(in, out);
  }
  std::vector<TpOp> ops;  // in the order asked
};

}  // namespace mt::plan
