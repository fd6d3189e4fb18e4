// A communicator that does nothing: every operation completes at once and leaves its buffers as they are. The
// planner times one tensor-parallel rank's compute on one process with it (the model only talks to its tp group
// through a Communicator); the values computed are meaningless, their cost is not.
#pragma once
#include <memory>
#include <string>

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

}  // namespace mt::plan
