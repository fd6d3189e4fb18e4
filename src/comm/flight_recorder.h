// The flight recorder (run.flight_recorder, docs/flight_recorder.md): each communicator's last N operations on this
// rank, what they were, where the trainer issued them and how far they got, written as JSON to
// run.dir/flight/rank_R.json when a hang or a failure needs explaining:
//  * a watchdog timeout: this rank dumps, asks every other rank to dump (through a listener thread each rank runs),
//    waits a moment for them, and only then ends the job;
//  * a fatal error on this rank;
//  * the dump signal (SIGUSR2, unless run.stop_signals claims it), which leaves the job running.
// scripts/flight.py reads the dumps of all ranks and names who never joined which collective.
//
// One recorder per process (FlightRecorder::get()): the watchdog, the signal and the communicators reach it from
// wherever they run, as PyTorch's flight recorder is. Recording takes one short lock per operation on the issuing
// thread and one on the communication thread; dumps take the same locks, so a dump written while other threads
// issue operations is a consistent file, written to a temporary name and renamed.
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_options.h"
#include "comm/communicator.h"

namespace mt {

// Where the trainer is: set by the code that issues communication, on the thread that issues it, and copied into
// each operation's record at issue. -1: not known (outside a step, a pass...).
struct FlightWhere {
  int step = -1, micro_batch = -1, stage = -1, chunk = -1;
  const char* site = nullptr;  // what issued it: "gradient bucket", "layer", "tied embedding", "loss", ...
  int site_index = -1;         // which bucket or layer, or -1
};
FlightWhere& flight_where();  // this thread's

// Sets a field of this thread's FlightWhere for a scope and restores it after.
class FlightSite {
 public:
  FlightSite(const char* site, int index = -1) : saved_(flight_where()) {
    flight_where().site = site;
    flight_where().site_index = index;
  }
  ~FlightSite() { flight_where() = saved_; }
  FlightSite(const FlightSite&) = delete;
  FlightSite& operator=(const FlightSite&) = delete;

 private:
  FlightWhere saved_;
};

enum class FlightState { Queued, Started, Completed };

class FlightRecorder {
 public:
  static FlightRecorder& get();

  // Turns recording on with `capacity` operations per communicator, dumps into `dir` (run.dir/flight).
  void configure(int capacity, const std::string& dir, int world_rank, int world_size);
  bool on() const { return capacity_ > 0; }
  const std::string& dir() const { return dir_; }

  // A communicator: its name, and the world ranks of its group in group-rank order. Returns its id.
  int add_group(const std::string& name, std::vector<int> world_ranks, int group_rank);
  // An operation issued on group `g` (at this thread's FlightWhere); returns its sequence number on the group.
  // count: elements; peer: the peer's group rank (send, recv), broadcast's root, or -1; reduce: a ReduceOp, or -1.
  uint64_t issue(int g, CommKind kind, int64_t count, DType dtype, int reduce, int peer, int tag);
  void started(int g, uint64_t seq, double at_us);
  // start_us < 0: not known (the caller saw it complete).
  void completed(int g, uint64_t seq, double start_us, double end_us);

  // Writes this rank's dump (reason: why), replacing an earlier one; false where it could not. Thread-safe.
  bool dump(const std::string& reason);
  // A watchdog timeout on this rank: dumps, asks every other rank to dump and waits up to `grace_s` for their
  // answers. Returns the line the watchdog prints after its own (the folder and the analyzer's command), or "".
  std::string dump_all(const std::string& reason, double grace_s);

  // The listener (a thread polling a duplicate of `world` every 50 ms, so it costs no core): answers other ranks'
  // dump requests, and dumps on `dump_signal` (0: none). stop_listener() before MPI_Finalize.
  void start_listener(MPI_Comm world, int dump_signal);
  void stop_listener();

 private:
  struct Record {
    uint64_t seq = 0, coll_seq = 0;  // coll_seq 0: not a collective
    CommKind kind = CommKind::Barrier;
    int64_t count = 0;
    DType dtype = DType::F32;
    int reduce = -1, peer = -1, tag = -1;
    FlightState state = FlightState::Queued;
    double issue_us = 0, start_us = -1, end_us = -1;
    FlightWhere where;
  };
  struct Group {
    std::string name;
    std::vector<int> ranks;
    int rank = 0;
    std::mutex mu;
    uint64_t issued = 0, collectives = 0;
    std::vector<Record> ring;  // the capacity when it was added; record seq at (seq - 1) % ring.size()
  };
  Group* group(int id);
  Record* find(Group& g, uint64_t seq);  // under g.mu; null when it left the ring
  std::string to_json(const std::string& reason);
  void listen();

  int capacity_ = 0, world_rank_ = 0, world_size_ = 1;
  std::string dir_;
  std::mutex groups_mu_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::mutex dump_mu_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::thread listener_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> own_dump_{false};  // dumped for its own watchdog: a peer's request then keeps that dump
  int dump_signal_ = 0;
};

// The watchdog's dump (FlightRecorder::dump_all with a grace of a few seconds) when recording is on, else "".
std::string flight_dump_on_timeout(const std::string& reason);

// The desync check that rides on each step's metrics (train/step_report.cpp's world all-reduce, no collective of its
// own): every rank writes its groups' collective digests (kDigestFloats floats per group of `groups`, the same
// list in the same order on every rank; zeros for a null group or one without a digest) into its own row, and once
// the rows are reduced each rank compares its groups' members' digests with its own. A difference (a rank that
// reduced another size, which MPICH does without an error, or skipped a collective that did not hang) ends the job
// with every rank's dump. In flight_communicator.cpp.
constexpr int kDigestFloats = 3;
void write_digests(const std::vector<Communicator*>& groups, float* mine);
// all: every rank's row (world x groups.size() x kDigestFloats).
void check_digests(const std::vector<Communicator*>& groups, const float* all, int world_rank, int step);

// Wraps a communicator so that every operation is recorded (`comm`: its group, for the members' world ranks), in
// flight_communicator.cpp. Returns it unchanged when recording is off.
std::unique_ptr<Communicator> with_flight_recorder(std::unique_ptr<Communicator> c, MPI_Comm comm);

}  // namespace mt
