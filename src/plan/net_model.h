// The communication side of the planner's time model: the alpha-beta prediction the network emulation uses
// (predict_us, link_model in comm/comm_options.h) for every collective and message of a layout, on the link each
// group of the mesh uses (intra- or inter-node, from comm.emulate.ranks_per_node and the mesh's rank order),
// plus what an operation costs beyond the emulated link: handing it to a communication thread and back, and the
// real shared-memory transfer where that is slower than the emulated one.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm_options.h"
#include "train/config.h"

namespace mt::plan {

// What the communication runtime (communication threads, MPI, the kernel's scheduler) adds to the network's
// alpha-beta time. Defaults measured on the 2-core development machine (docs/planner_log.md, "Calibration and
// validation").
struct NetOptions {
  double op_overhead_us = 10;  // hand-off to a communication thread and back per operation (docs/comm.md: 5-10 us)
  double shm_latency_us = 2;   // the real transfer between two processes of this machine (MPICH shared memory)
  double shm_gbps = 5;         // its bandwidth (bench_allreduce: ~5-6 GB/s from 256 KiB up)
  // A pipeline message's extra delay: the sender's communication thread picking it up, the receiver's noticing
  // it (it polls outstanding receives every 25-200 us) and waking the compute thread, each needing a core.
  double p2p_latency_us = 2000;
  // What a rank blocked on a pipeline message waits beyond its arrival when the other ranks' compute threads take
  // every core (the timeline's wake_us, plan/timeline.h).
  double p2p_wake_us = 0;
  // The core share each pipeline rank's communication thread takes from the rank's compute while it polls the
  // step's receives (refit 2026-11-27 from 0.65: docs/planner_log.md, "Refit of the poll share").
  double poll_share = 0.15;
  // When the ranks' threads outnumber the cores, a rank's peers are not running at the same moment (the scheduler
  // time-slices them): each wait below is charged once per thread taking turns on a core (ranks x threads /
  // cores), since the peer is one of that many (2026-11-28; charged flat before: sync and step sync at twice these
  // values, fit on 4 ranks of one thread on 2 cores, and the ring at 700 us; on 8 ranks flat values fit at about
  // twice their 4-rank ones, docs/planner_log.md, "Several samples").
  // A collective's or a message's extra wait inside the pipeline phase; a tensor-parallel collective pays it once
  // at any tp degree. (Charged log2(tp) times from 2026-12-02 to -05: once the collectives' CPU ran inside the
  // emulated link, tp 4 came out slow and tp 2 fast, and dp 4 x tp 2 at micro-batch 1 ran as fast as dp 2 x tp 4
  // at micro-batch 2, the same work and collectives per rank; docs/planner.md, "One sync per tp collective".)
  double oversubscribed_sync_us = 75;
  // The same for the step's collectives between its phases (tied embedding, data-parallel buckets, loss,
  // gradient norm's first all-reduce, ZeRO-1 all-gather): they follow long stretches of compute, over which ranks
  // drift further. Not where data parallelism is all there is; and log2(replicas) / 2 of it per micro-batch of
  // ZeRO-2/3's gradient ring, on every mesh (predict_step says why).
  double oversubscribed_step_sync_us = 1000;
  // The same for each message of the context-parallel ring: the receiving rank blocks until its peer has run to
  // its send.
  double oversubscribed_ring_us = 200;
  // The CPU time a collective costs its rank's communication thread: per operation (waking for the emulated link's
  // delays, handing over) and per byte the ring moves (the shared-memory copies and sums). When the ranks' compute
  // threads fill the cores, the data-parallel reductions and gathers that overlap the passes take that time from
  // them, and a pass runs its tensor-parallel collectives' share at the shared speed, as compute. Chosen by hand
  // 2026-11-28 on the 2-core Intel Xeon from metrics.jsonl's comm_cpu_ms and compute_ms (ZeRO-0, -1 and -3 at dp 2
  // and 4 on an emulated link: docs/planner_log.md, "The communication thread's CPU").
  double comm_cpu_op_us = 80;
  double comm_cpu_ns_per_byte = 0.7;
};

class NetModel {
 public:
  NetModel(const Config& cfg, const NetOptions& o);
  // One operation over p ranks of a group whose links are inter-node or not: max(emulated, real) + overhead
  // (the emulated delay includes the real operation; docs/comm.md). A group of one rank costs the overhead only.
  // `sharers`: groups crossing a node's link at once (node_link_sharers, comm/comm_options.h; inter only).
  double op_us(CommKind kind, int64_t bytes, int p, bool inter, int sharers = 1) const;
  // Its communication thread's CPU time: comm_cpu_op_us plus the bytes a ring moves per rank (predict_us's beta
  // term) at comm_cpu_ns_per_byte. 0 for a group of one rank.
  double cpu_us(CommKind kind, int64_t bytes, int p) const;
  const CommOptions& comm() const { return opts_; }

 private:
  CommOptions opts_;
  NetOptions net_;
};

// Which groups of a layout's mesh cross emulated nodes (the slowest group of each kind decides).
struct MeshLinks {
  bool tp = false, dp = false, cp = false, emb = false, world = false;  // dp: the dp x cp replicas' group
  std::vector<bool> pp;  // per stage boundary r -> r+1 (r = 0 .. pp-2)
  // Groups of each kind crossing one node's link at once, where that kind spans nodes (node_link_sharers).
  int tp_sharers = 1, dp_sharers = 1, pp_sharers = 1, cp_sharers = 1;
};
MeshLinks mesh_links(const Config& cfg, int world);

}  // namespace mt::plan
