// DeviceMesh: the dp x tp x pp x cp grid of ranks and each rank's place in it (pure arithmetic, no MPI), and
// MeshComms: the world, dp, tp, pp and cp communicators of one rank, split from a base MPI communicator.
// Order semantics (parallel.order, docs/mesh.md): the first axis of the order string varies fastest. With
// "tp-dp-pp", global rank = tp_rank + tp * (dp_rank + dp * pp_rank), so a tp group is a run of consecutive
// ranks (same node, fastest links) and pipeline stages are furthest apart. An order that leaves out cp (every
// order when cp = 1) places it right after tp: "tp-dp-pp" is "tp-cp-dp-pp". See docs/mesh.md.
// The context-parallel ranks of one dp replica hold the same parameters and each computes a share of its
// gradient, so the gradients are averaged, and ZeRO shards its state, over dp x cp: the replica group.
// The mesh and its communicators are built once at start-up and passed in; there is no global mesh.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace mt {

enum class MeshAxis : int { DP = 0, TP = 1, PP = 2, CP = 3 };
const char* mesh_axis_name(MeshAxis a);  // "dp", "tp", "pp", "cp"

struct MeshCoord {
  int dp = 0, tp = 0, pp = 0, cp = 0;
  int operator[](MeshAxis a) const {
    return a == MeshAxis::DP ? dp : a == MeshAxis::TP ? tp : a == MeshAxis::PP ? pp : cp;
  }
  bool operator==(const MeshCoord& o) const { return dp == o.dp && tp == o.tp && pp == o.pp && cp == o.cp; }
};

class DeviceMesh {
 public:
  // dp = 0 means world_size / (tp * pp * cp). CHECKs (an internal invariant: config validation already reported
  // bad user input with exit 2) that dp*tp*pp*cp == world_size, that order is a permutation of dp, tp, pp (and
  // optionally cp) joined by '-', and that 0 <= world_rank < world_size.
  DeviceMesh(int dp, int tp, int pp, const std::string& order, int world_size, int world_rank, int cp = 1);

  int dp() const { return size_[0]; }
  int tp() const { return size_[1]; }
  int pp() const { return size_[2]; }
  int cp() const { return size_[3]; }
  int size(MeshAxis a) const { return size_[static_cast<int>(a)]; }
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }  // this rank's global (world) rank
  const std::string& order() const { return order_; }
  // The axes fastest-varying first, as the order string names them (cp placed after tp if it leaves it out).
  const std::array<MeshAxis, 4>& axes() const { return axes_; }

  // This rank's coordinates.
  const MeshCoord& coord() const { return coord_; }
  int dp_rank() const { return coord_.dp; }
  int tp_rank() const { return coord_.tp; }
  int pp_rank() const { return coord_.pp; }
  int cp_rank() const { return coord_.cp; }
  // The replica group: the dp x cp ranks that hold the same parameters (with the same tp and pp coordinates).
  // Its group rank is dp_rank * cp + cp_rank.
  int replicas() const { return size_[0] * size_[3]; }
  int replica_rank() const { return coord_.dp * size_[3] + coord_.cp; }
  // Its members for `global_rank`, in replica-rank order.
  std::vector<int> replica_members(int global_rank) const;

  // Any rank's coordinates, and the global rank at given coordinates (inverse of each other).
  MeshCoord coord_of(int global_rank) const;
  int rank_of(const MeshCoord& c) const;

  // The global ranks of the group along `axis` that contains `global_rank` (default: this rank), in group-rank
  // order: element i is the rank whose coordinate on `axis` is i, the others being equal. So a communicator
  // split from these members has group rank == the mesh coordinate on that axis.
  std::vector<int> group_members(MeshAxis axis, int global_rank) const;
  std::vector<int> group_members(MeshAxis axis) const { return group_members(axis, rank_); }
  // A number that is the same for exactly the ranks of one group along `axis` (0 .. world/size(axis)-1): the
  // colour of the MPI_Comm_split for that group.
  int group_index(MeshAxis axis, int global_rank) const;

  // Pipeline neighbours of this rank (same dp and tp coordinates, stage -1 / +1), as global ranks; -1 at the
  // first / last stage. In the pp communicator the neighbours are group ranks pp_rank()-1 and pp_rank()+1.
  int pp_prev() const { return pp_prev_; }
  int pp_next() const { return pp_next_; }
  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == pp() - 1; }

  // One line for the start-up log (cp only when it is above 1):
  // "mesh dp=2 x tp=2 x pp=2 (order tp-dp-pp): rank 5 = (dp 0, tp 1, pp 1)".
  std::string describe() const;
  // Every rank with its coordinates, one per line (for rank 0 to print at start-up).
  std::string table() const;

 private:
  std::array<int, 4> size_{};    // indexed by MeshAxis
  std::array<int, 4> stride_{};  // indexed by MeshAxis: global rank = sum coord[a] * stride[a]
  std::array<MeshAxis, 4> axes_{};
  std::string order_;
  int world_size_ = 1, rank_ = 0;
  MeshCoord coord_;
  int pp_prev_ = -1, pp_next_ = -1;
};

// Builds a Communicator over an MPI communicator; the backend is the caller's choice (MPI, NCCL). `comm` is
// borrowed: MeshComms frees it after destroying the Communicator, so a backend that needs it longer (or wants
// its own context) must MPI_Comm_dup it.
using CommFactory = std::function<std::unique_ptr<Communicator>(MPI_Comm comm, const std::string& name)>;

// The communicators of one rank. Group ranks equal mesh coordinates: tp->rank() == mesh.tp_rank(), etc. `dp` is
// the replica group (what the gradients are averaged over): the dp axis, or with cp > 1 the dp x cp ranks, its rank
// mesh.replica_rank(). `cp` is the context-parallel ring (null when cp == 1).
// Destroy it before MPI_Finalize (it frees its split MPI communicators).
struct MeshComms {
  std::unique_ptr<Communicator> world, dp, tp, pp, cp;
  // The tied-embedding group: with pp > 1, the first and the last stage of this rank's (dp, tp) pipeline, which
  // both hold wte and sum its gradient (Megatron's embedding group). Null on middle stages and when pp == 1.
  std::unique_ptr<Communicator> emb;
  // Over the dp group's MPI communicator, a host transport for what an NCCL dp group cannot take (host
  // tensors): the compressed gradient reduction's collectives on a GPU (comm.compress int8, topk, powersgd).
  // Null unless made for that.
  std::unique_ptr<Communicator> dp_host;

  MeshComms() = default;
  MeshComms(MeshComms&&) noexcept;
  MeshComms& operator=(MeshComms&&) noexcept;
  MeshComms(const MeshComms&) = delete;
  MeshComms& operator=(const MeshComms&) = delete;
  ~MeshComms();

  // Every communicator object once (a group may serve two axes), without the null ones.
  std::vector<Communicator*> all() const {
    std::vector<Communicator*> out;
    for (Communicator* c : {world.get(), dp.get(), tp.get(), pp.get(), cp.get(), emb.get(), dp_host.get()})
      if (c && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    return out;
  }

  // The split MPI communicators the Communicators above were built on (owned; freed by the destructor).
  MPI_Comm world_mpi = MPI_COMM_NULL, dp_mpi = MPI_COMM_NULL, tp_mpi = MPI_COMM_NULL, pp_mpi = MPI_COMM_NULL,
           cp_mpi = MPI_COMM_NULL, emb_mpi = MPI_COMM_NULL;

 private:
  void release();
};

// Splits `base` (whose size and rank must match the mesh's world; usually MPI_COMM_WORLD) into this rank's replica
// (dp, or dp x cp), tp, pp and cp groups, and duplicates it for the world communicator. Collective over `base`: every rank calls it
// once, in the same order relative to other collectives on `base`.
MeshComms make_mesh_comms(const DeviceMesh& mesh, MPI_Comm base, const CommFactory& factory);

// The raw MPI part of make_mesh_comms: the communicator of this rank's group along `axis` (group rank = mesh
// coordinate). The caller owns the result (MPI_Comm_free).
MPI_Comm split_mesh_axis(const DeviceMesh& mesh, MPI_Comm base, MeshAxis axis);
// The same for this rank's replica group (dp x cp; group rank = mesh.replica_rank()).
MPI_Comm split_replica_group(const DeviceMesh& mesh, MPI_Comm base);

}  // namespace mt
