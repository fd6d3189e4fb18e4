// DeviceMesh coordinates and groups (mixed-radix arithmetic over the order string), and the MPI split that
// turns the groups into communicators.
#include "parallel/mesh.h"

#include <fmt/format.h>

#include <sstream>

#include "core/check.h"

namespace mt {

const char* mesh_axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::DP: return "dp";
    case MeshAxis::TP: return "tp";
    case MeshAxis::PP: return "pp";
  }
  return "?";
}

namespace {

int idx(MeshAxis a) { return static_cast<int>(a); }

std::array<MeshAxis, 3> parse_order(const std::string& order) {
  std::array<MeshAxis, 3> axes{};
  std::array<bool, 3> seen{};
  std::stringstream ss(order);
  std::string part;
  int n = 0;
  while (std::getline(ss, part, '-')) {
    MT_CHECK(n < 3, "mesh order '{}' has more than three axes", order);
    MeshAxis a;
    if (part == "dp") a = MeshAxis::DP;
    else if (part == "tp") a = MeshAxis::TP;
    else if (part == "pp") a = MeshAxis::PP;
    else MT_CHECK(false, "mesh order '{}': unknown axis '{}' (expected dp, tp, pp)", order, part);
    MT_CHECK(!seen[idx(a)], "mesh order '{}' names {} twice", order, part);
    seen[idx(a)] = true;
    axes[n++] = a;
  }
  MT_CHECK(n == 3 && order.back() != '-', "mesh order '{}' must be a permutation of dp, tp, pp joined by '-'",
           order);
  return axes;
}

// The two axes other than `a`, in MeshAxis order.
std::array<MeshAxis, 2> others(MeshAxis a) {
  switch (a) {
    case MeshAxis::DP: return {MeshAxis::TP, MeshAxis::PP};
    case MeshAxis::TP: return {MeshAxis::DP, MeshAxis::PP};
    default: return {MeshAxis::DP, MeshAxis::TP};
  }
}

MeshCoord with(MeshCoord c, MeshAxis a, int v) {
  (a == MeshAxis::DP ? c.dp : a == MeshAxis::TP ? c.tp : c.pp) = v;
  return c;
}

}  // namespace

DeviceMesh::DeviceMesh(int dp, int tp, int pp, const std::string& order, int world_size, int world_rank)
    : order_(order), world_size_(world_size), rank_(world_rank) {
  MT_CHECK(tp >= 1 && pp >= 1 && dp >= 0, "mesh sizes dp={} tp={} pp={} must be positive (dp 0 = derive)", dp, tp,
           pp);
  MT_CHECK(world_size >= 1 && world_rank >= 0 && world_rank < world_size, "rank {} of world {}", world_rank,
           world_size);
  if (dp == 0) {
    MT_CHECK(world_size % (tp * pp) == 0, "tp*pp={}*{} does not divide the world size {}", tp, pp, world_size);
    dp = world_size / (tp * pp);
  }
  MT_CHECK(static_cast<long long>(dp) * tp * pp == world_size, "mesh dp*tp*pp={}*{}*{}={} != world size {}", dp,
           tp, pp, static_cast<long long>(dp) * tp * pp, world_size);
  size_ = {dp, tp, pp};
  axes_ = parse_order(order);
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
  return c;
}

int DeviceMesh::rank_of(const MeshCoord& c) const {
  MT_CHECK(c.dp >= 0 && c.dp < size_[0] && c.tp >= 0 && c.tp < size_[1] && c.pp >= 0 && c.pp < size_[2],
           "coordinates (dp {}, tp {}, pp {}) outside mesh {}x{}x{}", c.dp, c.tp, c.pp, size_[0], size_[1], size_[2]);
  return c.dp * stride_[0] + c.tp * stride_[1] + c.pp * stride_[2];
}

std::vector<int> DeviceMesh::group_members(MeshAxis axis, int global_rank) const {
  const MeshCoord c = coord_of(global_rank);
  std::vector<int> members(size(axis));
  for (int i = 0; i < size(axis); ++i) members[i] = rank_of(with(c, axis, i));
  return members;
}

int DeviceMesh::group_index(MeshAxis axis, int global_rank) const {
  const MeshCoord c = coord_of(global_rank);
  const auto o = others(axis);
  return c[o[0]] + size(o[0]) * c[o[1]];
}

std::string DeviceMesh::describe() const {
  return fmt::format("mesh dp={} x tp={} x pp={} (order {}): rank {} = (dp {}, tp {}, pp {})", dp(), tp(), pp(),
                     order_, rank_, coord_.dp, coord_.tp, coord_.pp);
}

std::string DeviceMesh::table() const {
  std::string s = fmt::format("mesh dp={} x tp={} x pp={} (order {}, {} varies fastest)\n", dp(), tp(), pp(),
                              order_, mesh_axis_name(axes_[0]));
  s += "  rank    dp   tp   pp   pp_prev  pp_next\n";
  for (int r = 0; r < world_size_; ++r) {
    const MeshCoord c = coord_of(r);
    const int prev = c.pp > 0 ? rank_of(with(c, MeshAxis::PP, c.pp - 1)) : -1;
    const int next = c.pp + 1 < pp() ? rank_of(with(c, MeshAxis::PP, c.pp + 1)) : -1;
    s += fmt::format("  {:>4}  {:>4} {:>4} {:>4}  {:>8} {:>8}\n", r, c.dp, c.tp, c.pp, prev, next);
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

MeshComms make_mesh_comms(const DeviceMesh& mesh, MPI_Comm base, const CommFactory& factory) {
  MeshComms mc;
  MPI_CHECK(MPI_Comm_dup(base, &mc.world_mpi));
  mc.dp_mpi = split_mesh_axis(mesh, base, MeshAxis::DP);
  mc.tp_mpi = split_mesh_axis(mesh, base, MeshAxis::TP);
  mc.pp_mpi = split_mesh_axis(mesh, base, MeshAxis::PP);
  const bool pipeline_end = mesh.pp() > 1 && (mesh.is_first_stage() || mesh.is_last_stage());
  MPI_CHECK(MPI_Comm_split(base, pipeline_end ? mesh.group_index(MeshAxis::PP, mesh.rank()) : MPI_UNDEFINED,
                           mesh.pp_rank(), &mc.emb_mpi));
  // Same order on every rank: backends may run collectives while constructing (the NCCL unique id broadcast).
  mc.world = factory(mc.world_mpi, "world");
  mc.dp = factory(mc.dp_mpi, "dp");
  mc.tp = factory(mc.tp_mpi, "tp");
  mc.pp = factory(mc.pp_mpi, "pp");
  if (pipeline_end) mc.emb = factory(mc.emb_mpi, "emb");
  MT_CHECK(mc.world && mc.dp && mc.tp && mc.pp && (mc.emb || !pipeline_end), "communicator factory returned null");
  MT_CHECK(mc.dp->size() == mesh.dp() && mc.dp->rank() == mesh.dp_rank(), "dp communicator rank {} of {}",
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
    emb = std::move(o.emb);
    dp_host = std::move(o.dp_host);
    world_mpi = o.world_mpi;
    dp_mpi = o.dp_mpi;
    tp_mpi = o.tp_mpi;
    pp_mpi = o.pp_mpi;
    emb_mpi = o.emb_mpi;
    o.world_mpi = o.dp_mpi = o.tp_mpi = o.pp_mpi = o.emb_mpi = MPI_COMM_NULL;
  }
  return *this;
}

MeshComms::~MeshComms() { release(); }

void MeshComms::release() {
  // Communicators first: a backend's thread may still be using its MPI communicator until it is joined.
  dp_host.reset();
  emb.reset();
  pp.reset();
  tp.reset();
  dp.reset();
  world.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (MPI_Comm* c : {&emb_mpi, &pp_mpi, &tp_mpi, &dp_mpi, &world_mpi}) {
    if (*c != MPI_COMM_NULL && !finalized) MPI_Comm_free(c);
    *c = MPI_COMM_NULL;
  }
}

}  // namespace mt
