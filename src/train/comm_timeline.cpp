// Union of communication intervals per step (see comm_timeline.h).
#include "train/comm_timeline.h"

#include <algorithm>
#include <utility>

namespace mt {

void CommTimeline::leave_out_next_all_reduce(const std::string& comm, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  // A backend reporting its sub-operations instead (the hierarchical one) never matches: keep the list bounded.
  if (left_out_.size() == 1024) left_out_.pop_front();
  left_out_.emplace_back(comm, bytes);
}

void CommTimeline::record(const CommEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!left_out_.empty() && e.op == "all_reduce" && left_out_.front() == std::make_pair(e.comm, e.bytes)) {
    left_out_.pop_front();
    return;
  }
  events_.push_back(e);
  bytes_ += e.bytes;
  if ((e.comm == "dp" && (e.op == "all_reduce" || e.op == "all_gather")) ||
      (world_is_dp_ && e.comm == "world" && e.op == "all_reduce")) {
    const double mib = e.bytes / 1048576.0, us = e.end_us - e.start_us;
    link_.ops += 1;
    link_.mib += mib;
    link_.us += us;
    link_.mib2 += mib * mib;
    link_.mib_us += mib * us;
  }
}

CommTimeline::LinkSums CommTimeline::take_link_sums() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(link_, LinkSums());
}

int64_t CommTimeline::take_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(bytes_, 0);
}

double CommTimeline::busy_ms(double begin_us, double end_us) {
  std::vector<std::pair<double, double>> spans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const CommEvent& e : events_) {
      const double s = std::max(e.start_us, begin_us), t = std::min(e.end_us, end_us);
      if (s < t) spans.emplace_back(s, t);
    }
    events_.erase(std::remove_if(events_.begin(), events_.end(), [&](const CommEvent& e) { return e.end_us < end_us; }),
                  events_.end());
  }
  std::sort(spans.begin(), spans.end());
  double total = 0, cur_s = 0, cur_t = -1;
  for (const auto& [s, t] : spans) {
    if (s > cur_t) {
      if (cur_t > cur_s) total += cur_t - cur_s;
      cur_s = s;
      cur_t = t;
    } else {
      cur_t = std::max(cur_t, t);
    }
  }
  if (cur_t > cur_s) total += cur_t - cur_s;
  return total / 1000.0;
}

}  // namespace mt
