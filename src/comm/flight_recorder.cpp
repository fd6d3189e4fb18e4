// The flight recorder (see flight_recorder.h).
#include "comm/flight_recorder.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>

#include "comm/make_communicator.h"
#include "comm/mpi_init.h"
#include "core/check.h"

namespace mt {

namespace {

constexpr int kRequestTag = 1, kAnswerTag = 2;
constexpr double kPollMs = 50;  // the listener's period: a dump request waits at most this long

std::atomic<int> g_signal{0};  // the dump signal arrived (set in the handler, async-signal-safe)
extern "C" void on_dump_signal(int sig) { g_signal.store(sig, std::memory_order_relaxed); }

const char* reduce_name(int r) {
  switch (r) {
    case static_cast<int>(ReduceOp::Sum): return "\"sum\"";
    case static_cast<int>(ReduceOp::Avg): return "\"avg\"";
    case static_cast<int>(ReduceOp::Max): return "\"max\"";
    default: return "null";
  }
}

const char* state_name(FlightState s) {
  return s == FlightState::Queued ? "queued" : s == FlightState::Started ? "started" : "completed";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
    else out += c;
  }
  return out + "\"";
}

std::string json_time(double us) { return us < 0 ? "null" : fmt::format("{:.1f}", us); }

std::string where_json(const FlightWhere& w) {
  const std::string site = !w.site ? "null"
                           : w.site_index >= 0 ? json_string(fmt::format("{} {}", w.site, w.site_index))
                                               : json_string(w.site);
  auto field = [](int v) { return v < 0 ? std::string("null") : std::to_string(v); };
  return fmt::format("{{\"step\": {}, \"micro_batch\": {}, \"stage\": {}, \"chunk\": {}, \"site\": {}}}", field(w.step),
                     field(w.micro_batch), field(w.stage), field(w.chunk), site);
}

bool collective(CommKind k) { return k != CommKind::Send && k != CommKind::Recv; }

}  // namespace

FlightWhere& flight_where() {
  thread_local FlightWhere where;
  return where;
}

FlightRecorder& FlightRecorder::get() {
  static FlightRecorder recorder;
  return recorder;
}

void FlightRecorder::configure(int capacity, const std::string& dir, int world_rank, int world_size) {
  capacity_ = capacity;
  dir_ = dir;
  world_rank_ = world_rank;
  world_size_ = world_size;
}

int FlightRecorder::add_group(const std::string& name, std::vector<int> world_ranks, int group_rank) {
  auto g = std::make_unique<Group>();
  g->name = name;
  g->ranks = std::move(world_ranks);
  g->rank = group_rank;
  g->ring.resize(capacity_);
  std::lock_guard<std::mutex> lk(groups_mu_);
  groups_.push_back(std::move(g));
  return static_cast<int>(groups_.size()) - 1;
}

FlightRecorder::Group* FlightRecorder::group(int id) {
  std::lock_guard<std::mutex> lk(groups_mu_);  // add_group may grow the list meanwhile
  return groups_[id].get();
}

uint64_t FlightRecorder::issue(int id, CommKind kind, int64_t count, DType dtype, int reduce, int peer, int tag) {
  Group* g = group(id);
  std::lock_guard<std::mutex> lk(g->mu);
  Record& r = g->ring[g->issued % g->ring.size()];
  r = Record{};
  r.seq = ++g->issued;
  r.coll_seq = collective(kind) ? ++g->collectives : 0;
  r.kind = kind;
  r.count = count;
  r.dtype = dtype;
  r.reduce = reduce;
  r.peer = peer;
  r.tag = tag;
  r.issue_us = trace_clock_us();
  r.where = flight_where();
  return r.seq;
}

FlightRecorder::Record* FlightRecorder::find(Group& g, uint64_t seq) {
  if (seq == 0 || seq > g.issued || g.issued - seq >= g.ring.size()) return nullptr;
  return &g.ring[(seq - 1) % g.ring.size()];
}

void FlightRecorder::started(int id, uint64_t seq, double at_us) {
  Group* g = group(id);
  std::lock_guard<std::mutex> lk(g->mu);
  Record* r = find(*g, seq);
  if (r && r->state == FlightState::Queued) r->state = FlightState::Started, r->start_us = at_us;
}

void FlightRecorder::completed(int id, uint64_t seq, double start_us, double end_us) {
  Group* g = group(id);
  std::lock_guard<std::mutex> lk(g->mu);
  Record* r = find(*g, seq);
  if (!r || r->state == FlightState::Completed) return;
  r->state = FlightState::Completed;
  if (start_us >= 0) r->start_us = start_us;
  r->end_us = end_us;
}

std::string FlightRecorder::to_json(const std::string& reason) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::string s = fmt::format(
      "{{\"format\": \"meshtrain-flight-recorder\", \"version\": 1, \"rank\": {}, \"world\": {}, \"host\": {}, "
      "\"pid\": {}, \"reason\": {}, \"dumped_us\": {:.1f}, \"capacity\": {}, \"where\": {},\n\"groups\": [",
      world_rank_, world_size_, json_string(host), getpid(), json_string(reason), trace_clock_us(), capacity_,
      where_json(flight_where()));
  std::lock_guard<std::mutex> lk(groups_mu_);
  for (size_t i = 0; i < groups_.size(); ++i) {
    Group& g = *groups_[i];
    std::lock_guard<std::mutex> glk(g.mu);
    std::string ranks;
    for (size_t k = 0; k < g.ranks.size(); ++k) ranks += fmt::format("{}{}", k ? ", " : "", g.ranks[k]);
    const uint64_t first = g.issued > g.ring.size() ? g.issued - g.ring.size() + 1 : 1;
    s += fmt::format("{}\n {{\"name\": {}, \"ranks\": [{}], \"rank\": {}, \"issued\": {}, \"collectives_issued\": {}, "
                     "\"dropped\": {}, \"ops\": [",
                     i ? "," : "", json_string(g.name), ranks, g.rank, g.issued, g.collectives, first - 1);
    for (uint64_t seq = first; seq <= g.issued; ++seq) {
      const Record& r = *find(g, seq);
      s += fmt::format(
          "{}\n  {{\"seq\": {}, \"coll_seq\": {}, \"op\": \"{}\", \"count\": {}, \"dtype\": \"{}\", \"reduce\": {}, "
          "\"peer\": {}, \"tag\": {}, \"state\": \"{}\", \"issue_us\": {}, \"start_us\": {}, \"end_us\": {}, "
          "\"where\": {}}}",
          seq == first ? "" : ",", r.seq, r.coll_seq ? std::to_string(r.coll_seq) : "null", comm_kind_name(r.kind),
          r.count, dtype_name(r.dtype), reduce_name(r.reduce), r.peer, r.tag, state_name(r.state),
          json_time(r.issue_us), json_time(r.start_us), json_time(r.end_us), where_json(r.where));
    }
    s += "]}";
  }
  return s + "\n]}\n";
}

bool FlightRecorder::dump(const std::string& reason) {
  if (!on()) return false;
  std::lock_guard<std::mutex> lk(dump_mu_);
  const std::string path = fmt::format("{}/rank_{}.json", dir_, world_rank_), tmp = path + ".tmp";
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << to_json(reason);
    f.flush();
    if (!f) {
      std::fprintf(stderr, "[rank %d] flight recorder: cannot write %s: %s\n", world_rank_, tmp.c_str(),
                   std::strerror(errno));
      return false;
    }
  }
  // Renamed complete: a reader never sees half a file, even when the process dies during the write.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return false;
  return true;
}

std::string FlightRecorder::dump_all(const std::string& reason, double grace_s) {
  if (!on()) return "";
  own_dump_ = true;
  dump(reason);
  std::vector<int> answered;
  if (comm_ != MPI_COMM_NULL && world_size_ > 1) {
    // Small nonblocking messages: they leave even when a peer is stopped, and a peer that never answers is named.
    // Their payload is a member: a send to a stopped peer may still read it after this function returns.
    // A send to a killed peer can fail at once (the recorder's communicator returns errors instead of aborting,
    // start_listener): that peer is then just one that never answers.
    std::vector<MPI_Request> sent(world_size_ - 1, MPI_REQUEST_NULL);
    for (int r = 0, i = 0; r < world_size_; ++r)
      if (r != world_rank_) {
        if (MPI_Isend(&world_rank_, 1, MPI_INT, r, kRequestTag, comm_, &sent[i]) != MPI_SUCCESS)
          sent[i] = MPI_REQUEST_NULL;
        ++i;
      }
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    while (int(answered.size()) < world_size_ - 1 && std::chrono::steady_clock::now() < until) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kAnswerTag, comm_, &flag, &st) != MPI_SUCCESS) flag = 0;
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      int ok = 0;
      if (MPI_Recv(&ok, 1, MPI_INT, st.MPI_SOURCE, kAnswerTag, comm_, MPI_STATUS_IGNORE) == MPI_SUCCESS)
        answered.push_back(st.MPI_SOURCE);
    }
    for (MPI_Request& q : sent)
      if (q != MPI_REQUEST_NULL) MPI_Request_free(&q);
  }
  std::string silent;
  for (int r = 0; r < world_size_; ++r)
    if (r != world_rank_ && std::find(answered.begin(), answered.end(), r) == answered.end())
      silent += fmt::format("{}{}", silent.empty() ? "" : ", ", r);
  return fmt::format("flight recorder: dumps in {}/ ({} of {} ranks answered{}); read them with: scripts/flight.py {}",
                     dir_, answered.size() + 1, world_size_,
                     silent.empty() ? "" : fmt::format("; no answer from rank {}", silent),
                     std::filesystem::path(dir_).parent_path().string());
}

namespace {

// A failed CHECK (core/check.h) dumps every rank's last operations, as a fatal exception does. The dump runs on a
// thread of its own and is waited for at most 10 s, so that a check failing where the recorder's lock is held still
// ends in the abort that follows.
void dump_on_check_failure(const std::string& failure) {
  auto done = std::make_shared<std::promise<std::string>>();
  std::future<std::string> line = done->get_future();
  std::thread([done, failure] { done->set_value(FlightRecorder::get().dump_all("fatal error: " + failure, 1.0)); })
      .detach();
  const bool ready = line.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  const std::string text = ready ? line.get() : "flight recorder: no dump within 10 s of the failed check";
  if (!text.empty()) std::fprintf(stderr, "[rank %d] %s\n", world_rank_or_zero(), text.c_str());
  std::fflush(stderr);
}

}  // namespace

void FlightRecorder::start_listener(MPI_Comm world, int dump_signal) {
  if (!on()) return;
  set_check_failure_hook(dump_on_check_failure);
  comm_dup_yielding(world, &comm_);
  // The recorder talks to peers that may be dead (the dumps are for when something went wrong): an error on this
  // communicator is returned, not fatal, so that a survivor still reports the others and ends the job itself.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  dump_signal_ = dump_signal;
  if (dump_signal) {
    struct sigaction sa {};
    sa.sa_handler = on_dump_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(dump_signal, &sa, nullptr);
  }
  stop_ = false;
  listener_ = std::thread([this] { listen(); });
}

void FlightRecorder::listen() {
  while (!stop_.load(std::memory_order_relaxed)) {
    if (const int sig = g_signal.exchange(0))
      dump(fmt::format("signal {}", sig == SIGUSR2 ? "SIGUSR2" : std::to_string(sig)));
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kRequestTag, comm_, &flag, &st) != MPI_SUCCESS) flag = 0;
    if (flag) {
      int from = 0;
      MPI_Recv(&from, 1, MPI_INT, st.MPI_SOURCE, kRequestTag, comm_, MPI_STATUS_IGNORE);
      if (!own_dump_) dump(fmt::format("asked by rank {} (its watchdog)", from));
      int ok = 1;
      MPI_Send(&ok, 1, MPI_INT, st.MPI_SOURCE, kAnswerTag, comm_);
      continue;
    }
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(kPollMs));
  }
}

void FlightRecorder::stop_listener() {
  set_check_failure_hook(nullptr);
  if (!listener_.joinable()) return;
  stop_ = true;
  listener_.join();
  if (dump_signal_) std::signal(dump_signal_, SIG_DFL);
  MPI_Comm_free(&comm_);
}

std::string flight_dump_on_timeout(const std::string& reason) {
  return FlightRecorder::get().dump_all(reason, 1.0);
}

}  // namespace mt
