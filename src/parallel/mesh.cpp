// DeviceMesh coordinates and groups (mixed-radix arithmetic over the order string), and the MPI split that
// turns the groups into communicators.
#include "parallel/mesh.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <sstream>

#include "comm/comm_util.h"
#include "comm/mpi_init.h"
#include "core/check.h"

namespace mt {

const char* mesh_axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::DP: return "dp";
    case MeshAxis::TP: return "tp";
    case MeshAxis::PP: return "pp";
    case MeshAxis::CP: return "cp";
  }
  return "?";
}

namespace {

constexpr int kAxes = 4;

int idx(MeshAxis a) { return static_cast<int>(a); }

// The order's axes, fastest first; cp right after tp when the order leaves it out.
std::array<MeshAxis, kAxes> parse_order(const std::string& order) {
  std::vector<MeshAxis> axes;
  std::array<bool, kAxes> seen{};
  std::stringstream ss(order);
  std::string part;
  while (std::getline(ss, part, '-')) {
    MeshAxis a;
    if (part == "dp") a = MeshAxis::DP;
    else if (part == "tp") a = MeshAxis::TP;
    else if (part == "pp") a = MeshAxis::PP;
    else if (part == "cp") a = MeshAxis::CP;
    else MT_CHECK(false, "mesh order '{}': unknown axis '{}' (expected dp, tp, pp, cp)", order, part);
    MT_CHECK(!seen[idx(a)], "mesh order '{}' names {} twice", order, part);
    seen[idx(a)] = true;
    axes.push_back(a);
  }
  MT_CHECK(seen[idx(MeshAxis::DP)] && seen[idx(MeshAxis::TP)] && seen[idx(MeshAxis::PP)] && order.back() != '-',
           "mesh order '{}' must be a permutation of dp, tp, pp (and cp) joined by '-'", order);
  if (!seen[idx(MeshAxis::CP)])
    axes.insert(std::find(axes.begin(), axes.end(), MeshAxis::TP) + 1, MeshAxis::CP);
  std::array<MeshAxis, kAxes> out{};
  std::copy(axes.begin(), axes.end(), out.begin());
  return out;
}

MeshCoord with(MeshCoord c, MeshAxis a, int v) {
  (a == MeshAxis::DP ? c.dp : a == MeshAxis::TP ? c.tp : a == MeshAxis::PP ? c.pp : c.cp) = v;
  return c;
}

}  // namespace

DeviceMesh::DeviceMesh(int dp, int tp, int pp, const std::string& order, int world_size, int world_rank, int cp)
    : order_(order), world_size_(world_size), rank_(world_rank) {
  MT_CHECK(tp >= 1 && pp >= 1 && cp >= 1 && dp >= 0,
           "mesh sizes dp={} tp={} pp={} cp={} must be positive (dp 0 = derive)", dp, tp, pp, cp);
  MT_CHECK(world_size >= 1 && world_rank >= 0 && world_rank < world_size, "rank {} of world {}", world_rank,
           world_size);
  if (dp == 0) {
    MT_CHECK(world_size % (tp * pp * cp) == 0, "tp*pp*cp={}*{}*{} does not divide the world size {}", tp, pp, cp,
             world_size);
    dp = world_size / (tp * pp * cp);
  }
  MT_CHECK(static_cast<long long>(dp) * tp * pp * cp == world_size, "mesh dp*tp*pp*cp={}*{}*{}*{}={} != world size {}",
           dp, tp, pp, cp, static_cast<long long>(dp) * tp * pp * cp, world_size);
  size_ = {dp, tp, pp, cp};
  axes_ = parse_order(order);
  if (cp > 1) {  // the order as the ranks are laid out, cp's place included
    order_.clear();
    for (MeshAxis a : axes_) order_ += (order_.empty() ? "" : "-") + std::string(mesh_axis_name(a));
  }
  int stride = 1;
  for (MeshAxis a : axes_) {
    stride_[idx(a)] = stride;
    stride *= size_[idx(a)];
  }
  coord_ = coord_of(world_rank);
  pp_prev_ = coord_.pp > 0 ? rank_of(with(coord_, MeshAxis::PP, coord_.pp - 1)) : -1;
  pp_next_ = coord_.pp + 1 < pp ? rank_of(with(coord_, MeshAxis::PP, coord_.pp + 1)) : -1;
}

MeshCoord DeviceMesh::coord_of(int r) const {
  MT_CHECK(r >= 0 && r < world_size_, "rank {} outside the mesh of {} ranks", r, world_size_);
  MeshCoord c;
  c.dp = (r / stride_[0]) % size_[0];
  c.tp = (r / stride_[1]) % size_[1];
  c.pp = (r / stride_[2]) % size_[2];
  c.cp = (r / stride_[3]) % size_[3];
  return c;
}

int DeviceMesh::rank_of(const MeshCoord& c) const {
  MT_CHECK(c.dp >= 0 && c.dp < size_[0] && c.tp >= 0 && c.tp < size_[1] && c.pp >= 0 && c.pp < size_[2] &&
               c.cp >= 0 && c.cp < size_[3],
           "coordinates (dp {}, tp {}, pp {}, cp {}) outside mesh {}x{}x{}x{}", c.dp, c.tp, c.pp, c.cp, size_[0],
           size_[1], size_[2], size_[3]);
  return c.dp * stride_[0] + c.tp * stride_[1] + c.pp * stride_[2] + c.cp * stride_[3];
}

std::vector<int> DeviceMesh::group_members(MeshAxis axis, int global_rank) const {
  const MeshCoord c = coord_of(global_rank);
  std::vector<int> members(size(axis));
  for (int i = 0; i < size(axis); ++i) members[i] = rank_of(with(c, axis, i));
  return members;
}

int DeviceMesh::group_index(MeshAxis axis, int global_rank) const {
  // Mixed radix over the other axes in MeshAxis order (dp, tp, pp, cp): 0 .. world / size(axis) - 1.
  const MeshCoord c = coord_of(global_rank);
  int index = 0, radix = 1;
  for (int a = 0; a < kAxes; ++a) {
    if (a == idx(axis)) continue;
    index += radix * c[static_cast<MeshAxis>(a)];
    radix *= size_[a];
  }
  return index;
}

std::vector<int> DeviceMesh::replica_members(int global_rank) const {
  const MeshCoord c = coord_of(global_rank);
  std::vector<int> members;
  for (int d = 0; d < dp(); ++d)
    for (int k = 0; k < cp(); ++k) members.push_back(rank_of(with(with(c, MeshAxis::DP, d), MeshAxis::CP, k)));
  return members;
}

std::string DeviceMesh::describe() const {
  if (cp() == 1)
    return fmt::format("mesh dp={} x tp={} x pp={} (order {}): rank {} = (dp {}, tp {}, pp {})", dp(), tp(), pp(),
                       order_, rank_, coord_.dp, coord_.tp, coord_.pp);
  return fmt::format("mesh dp={} x tp={} x pp={} x cp={} (order {}): rank {} = (dp {}, tp {}, pp {}, cp {})", dp(), tp(),
                     pp(), cp(), order_, rank_, coord_.dp, coord_.tp, coord_.pp, coord_.cp);
}

std::string DeviceMesh::table() const {
  const bool with_cp = cp() > 1;
  std::string s = with_cp ? fmt::format("mesh dp={} x tp={} x pp={} x cp={} (order {}, {} varies fastest)\n", dp(), tp(),
                                        pp(), cp(), order_, mesh_axis_name(axes_[0]))
                          : fmt::format("mesh dp={} x tp={} x pp={} (order {}, {} varies fastest)\n", dp(), tp(), pp(),
                                        order_, mesh_axis_name(axes_[0]));
  s += with_cp ? "  rank    dp   tp   pp   cp   pp_prev  pp_next\n" : "  rank    dp   tp   pp   pp_prev  pp_next\n";
  for (int r = 0; r < world_size_; ++r) {
    const MeshCoord c = coord_of(r);
    const int prev = c.pp > 0 ? rank_of(with(c, MeshAxis::PP, c.pp - 1)) : -1;
    const int next = c.pp + 1 < pp() ? rank_of(with(c, MeshAxis::PP, c.pp + 1)) : -1;
    s += fmt::format("  {:>4}  {:>4} {:>4} {:>4}", r, c.dp, c.tp, c.pp) +
         (with_cp ? fmt::format(" {:>4}", c.cp) : std::string()) + fmt::format("  {:>8} {:>8}\n", prev, next);
  }
  return s;
}

// ---- communicators ----

MPI_Comm split_mesh_axis(const DeviceMesh& mesh, MPI_Comm base, MeshAxis axis) {
  int size = 0, rank = 0;
  MPI_CHECK(MPI_Comm_size(base, &size));
  MPI_CHECK(MPI_Comm_rank(base, &rank));
  MT_CHECK(size == mesh.world_size() && rank == mesh.rank(), "base communicator is rank {} of {}, mesh is rank {} of {}",
           rank, size, mesh.rank(), mesh.world_size());
  // Colour: which group; key: the coordinate along the axis, so group rank == coordinate.
  MPI_Comm out = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(base, mesh.group_index(axis, rank), mesh.coord()[axis], &out));
  int gsize = 0, grank = 0;
  MPI_CHECK(MPI_Comm_size(out, &gsize));
  MPI_CHECK(MPI_Comm_rank(out, &grank));
  MT_CHECK(gsize == mesh.size(axis) && grank == mesh.coord()[axis], "{} group: rank {} of {}, expected {} of {}",
           mesh_axis_name(axis), grank, gsize, mesh.coord()[axis], mesh.size(axis));
  return out;
}

MPI_Comm split_replica_group(const DeviceMesh& mesh, MPI_Comm base) {
  // Colour: the (tp, pp) place; key: the replica rank.
  MPI_Comm out = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(base, mesh.tp_rank() + mesh.tp() * mesh.pp_rank(), mesh.replica_rank(), &out));
  int gsize = 0, grank = 0;
  MPI_CHECK(MPI_Comm_size(out, &gsize));
  MPI_CHECK(MPI_Comm_rank(out, &grank));
  MT_CHECK(gsize == mesh.replicas() && grank == mesh.replica_rank(), "replica group: rank {} of {}, expected {} of {}",
           grank, gsize, mesh.replica_rank(), mesh.replicas());
  return out;
}

MeshComms make_mesh_comms(const DeviceMesh& mesh, MPI_Comm base, const CommFactory& factory) {
  MeshComms mc;
  comm_dup_yielding(base, &mc.world_mpi);
  mc.dp_mpi = mesh.cp() > 1 ? split_replica_group(mesh, base) : split_mesh_axis(mesh, base, MeshAxis::DP);
  mc.tp_mpi = split_mesh_axis(mesh, base, MeshAxis::TP);
  mc.pp_mpi = split_mesh_axis(mesh, base, MeshAxis::PP);
  if (mesh.cp() > 1) mc.cp_mpi = split_mesh_axis(mesh, base, MeshAxis::CP);
  const bool pipeline_end = mesh.pp() > 1 && (mesh.is_first_stage() || mesh.is_last_stage());
  MPI_CHECK(MPI_Comm_split(base, pipeline_end ? mesh.group_index(MeshAxis::PP, mesh.rank()) : MPI_UNDEFINED,
                           mesh.pp_rank(), &mc.emb_mpi));
  // Same order on every rank: backends may run collectives while constructing (the NCCL unique id broadcast).
  mc.world = factory(mc.world_mpi, "world");
  mc.dp = factory(mc.dp_mpi, "dp");
  mc.tp = factory(mc.tp_mpi, "tp");
  mc.pp = factory(mc.pp_mpi, "pp");
  if (mesh.cp() > 1) mc.cp = factory(mc.cp_mpi, "cp");
  if (pipeline_end) mc.emb = factory(mc.emb_mpi, "emb");
  MT_CHECK(mc.world && mc.dp && mc.tp && mc.pp && (mc.cp || mesh.cp() == 1) && (mc.emb || !pipeline_end),
           "communicator factory returned null");
  MT_CHECK(mc.dp->size() == mesh.replicas() && mc.dp->rank() == mesh.replica_rank(), "dp communicator rank {} of {}",
           mc.dp->rank(), mc.dp->size());
  MT_CHECK(mc.tp->size() == mesh.tp() && mc.tp->rank() == mesh.tp_rank(), "tp communicator rank {} of {}",
           mc.tp->rank(), mc.tp->size());
  MT_CHECK(mc.pp->size() == mesh.pp() && mc.pp->rank() == mesh.pp_rank(), "pp communicator rank {} of {}",
           mc.pp->rank(), mc.pp->size());
  return mc;
}

MeshComms::MeshComms(MeshComms&& o) noexcept { *this = std::move(o); }

MeshComms& MeshComms::operator=(MeshComms&& o) noexcept {
  if (this != &o) {
    release();
    world = std::move(o.world);
    dp = std::move(o.dp);
    tp = std::move(o.tp);
    pp = std::move(o.pp);
    cp = std::move(o.cp);
    emb = std::move(o.emb);
    dp_host = std::move(o.dp_host);
    world_mpi = o.world_mpi;
    dp_mpi = o.dp_mpi;
    tp_mpi = o.tp_mpi;
    pp_mpi = o.pp_mpi;
    cp_mpi = o.cp_mpi;
    emb_mpi = o.emb_mpi;
    o.world_mpi = o.dp_mpi = o.tp_mpi = o.pp_mpi = o.cp_mpi = o.emb_mpi = MPI_COMM_NULL;
  }
  return *this;
}

MeshComms::~MeshComms() { release(); }

void MeshComms::release() {
  // Communicators first: a backend's thread may still be using its MPI communicator until it is joined.
  dp_host.reset();
  emb.reset();
  cp.reset();
  pp.reset();
  tp.reset();
  dp.reset();
  world.reset();
  MPI_Comm* const comms[] = {&emb_mpi, &cp_mpi, &pp_mpi, &tp_mpi, &dp_mpi, &world_mpi};
  const bool finalized =
      std::any_of(std::begin(comms), std::end(comms), [](MPI_Comm* c) { return *c != MPI_COMM_NULL; }) &&
      finalized_before_free("the mesh's MPI communicators");
  for (MPI_Comm* c : comms) {
    if (*c != MPI_COMM_NULL && !finalized) MPI_Comm_free(c);
    *c = MPI_COMM_NULL;
  }
}

}  // namespace mt
