// Chrome trace events ("X" complete events, microseconds) gathered over MPI (see profiler.h).
#include "train/profiler.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "core/check.h"
#include "core/errors.h"

namespace mt {

namespace {
// Event JSON without the pid, which is the same for every event of a rank and is spliced in at write().
std::string event(const std::string& name, const char* cat, int tid, double start_us, double end_us,
                  const std::string& args = "") {
  return fmt::format("{{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"tid\": {}, \"ts\": {:.3f}, \"dur\": {:.3f}{}, "
                     "\"pid\": ",
                     name, cat, tid, start_us, std::max(0.0, end_us - start_us), args);
}
}  // namespace

void Profiler::add(const std::string& name, const char* cat, int tid, double start_us, double end_us) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_ += event(name, cat, tid, start_us, end_us) + "@PID@},\n";
}

void Profiler::comm(const CommEvent& e) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(comm_names_.begin(), comm_names_.end(), e.comm);
  const int index = static_cast<int>(it - comm_names_.begin());
  if (it == comm_names_.end()) comm_names_.push_back(e.comm);
  events_ += event(e.comm + " " + e.op, "comm", 2 + index, e.start_us, e.end_us,
                   fmt::format(", \"args\": {{\"seq\": {}, \"bytes\": {}, \"queued_us\": {:.1f}}}", e.seq, e.bytes,
                               e.start_us - e.issue_us)) +
             "@PID@},\n";
  // When the communication thread ran for this operation, on the communicator's thread row.
  for (const auto& [start, end] : e.thread_run_us)
    events_ += event("running", "comm_thread", kThreadRow0 + index, start, end,
                     fmt::format(", \"args\": {{\"op\": \"{} {}\", \"seq\": {}}}", e.comm, e.op, e.seq)) +
               "@PID@},\n";
}

void Profiler::write(const std::string& path, MPI_Comm world) const {
  if (!enabled_) return;
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &size));
  std::string mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mine = events_;
    for (size_t i = 0; i < comm_names_.size(); ++i)
      mine += fmt::format("{{\"name\": \"thread_name\", \"ph\": \"M\", \"tid\": {}, \"args\": {{\"name\": \"comm {}\"}}, "
                          "\"pid\": @PID@}},\n",
                          2 + i, comm_names_[i]) +
              fmt::format("{{\"name\": \"thread_name\", \"ph\": \"M\", \"tid\": {}, \"args\": {{\"name\": \"comm {} "
                          "thread\"}}, \"pid\": @PID@}},\n",
                          kThreadRow0 + i, comm_names_[i]);
  }
  mine += "{\"name\": \"thread_name\", \"ph\": \"M\", \"tid\": 0, \"args\": {\"name\": \"compute\"}, \"pid\": @PID@},\n"
          "{\"name\": \"thread_name\", \"ph\": \"M\", \"tid\": 1, \"args\": {\"name\": \"waits on communication\"}, "
          "\"pid\": @PID@},\n";
  for (size_t at; (at = mine.find("@PID@")) != std::string::npos;) mine.replace(at, 5, std::to_string(rank));
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size), displs(size);
  MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, world));
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) displs[r] = total, total += lens[r];
    all.resize(total);
  }
  MPI_CHECK(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, world));
  if (rank != 0) return;
  if (all.size() >= 2) all.resize(all.size() - 2);  // the last ",\n"
  std::ofstream f(path);
  if (!f) input_error("run.profile: cannot write {}", path);
  f << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n" << all << "\n]}\n";
}

}  // namespace mt
