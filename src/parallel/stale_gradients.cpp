#include "parallel/stale_gradients.h"

#include "core/check.h"

namespace mt {

StaleGradients::StaleGradients(Communicator& dp, int64_t numel, int staleness, StalenessPolicy policy)
    : dp_(dp), S_(staleness), policy_(policy) {
  CHECK(staleness >= 1, "StaleGradients: staleness {} (S = 0 is the synchronous path)", staleness);
  for (int i = 0; i <= S_; ++i) {
    slots_.push_back(Tensor::zeros({numel}, DType::F32));
    free_.push_back(S_ - i);
  }
}

void StaleGradients::issue(int64_t step, const Tensor& grads) {
  CHECK(!free_.empty(), "StaleGradients: step {} issued with {} averages in flight (apply_ready was skipped)", step,
        queue_.size());
  CHECK(queue_.empty() || queue_.back().step < step, "StaleGradients: step {} issued after step {}", step,
        queue_.back().step);
  const int slot = free_.back();
  free_.pop_back();
  copy_convert(slots_[slot], grads);
  queue_.push_back({step, slot, dp_.all_reduce_async(slots_[slot], ReduceOp::Avg)});
}

void StaleGradients::apply_front(const ApplyFn& apply) {
  InFlight f = std::move(queue_.front());
  queue_.pop_front();
  f.work->wait();
  apply(f.step, slots_[f.slot]);
  free_.push_back(f.slot);
}

int StaleGradients::apply_ready(int64_t step, const ApplyFn& apply) {
  int n = 0;
  while (!queue_.empty()) {
    const bool due = queue_.front().step <= step - S_;
    if (!due && (policy_ == StalenessPolicy::Fixed || !queue_.front().work->done())) break;
    apply_front(apply);
    ++n;
  }
  return n;
}

int StaleGradients::finish(const ApplyFn& apply) {
  int n = 0;
  for (; !queue_.empty(); ++n) apply_front(apply);
  return n;
}

int64_t StaleGradients::state_bytes() const { return int64_t(slots_.size()) * slots_[0].nbytes(); }

}  // namespace mt
