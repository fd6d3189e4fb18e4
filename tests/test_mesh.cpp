// DeviceMesh: coordinates for every order and shape (pure arithmetic, checked against an independent
// nested-loop enumeration), group membership and pipeline neighbours; and, at whatever world size the test runs
// with (ctest runs it with 1, 4 and 8 ranks), the MPI split checked against the computed members.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "parallel/mesh.h"

using namespace mt;

namespace {

const std::vector<std::string> kOrders = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};

struct Shape3 {
  int dp, tp, pp;
};
const std::vector<Shape3> kShapes = {{2, 2, 2}, {1, 4, 2}, {4, 1, 1}, {1, 1, 4}, {1, 1, 1},
                                     {2, 1, 4}, {3, 2, 1}, {2, 3, 2}, {1, 8, 1}, {8, 1, 1}};

int axis_size(const Shape3& s, const std::string& a) { return a == "dp" ? s.dp : a == "tp" ? s.tp : s.pp; }

std::vector<std::string> split_order(const std::string& order) {
  std::vector<std::string> v;
  size_t p = 0;
  while (true) {
    size_t q = order.find('-', p);
    v.push_back(order.substr(p, q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return v;
}

// Independent reference: enumerate ranks with the first axis in the innermost loop (it varies fastest).
std::vector<MeshCoord> reference_coords(const Shape3& s, const std::string& order) {
  auto ax = split_order(order);
  std::vector<MeshCoord> out;
  for (int k = 0; k < axis_size(s, ax[2]); ++k)
    for (int j = 0; j < axis_size(s, ax[1]); ++j)
      for (int i = 0; i < axis_size(s, ax[0]); ++i) {
        std::map<std::string, int> v{{ax[0], i}, {ax[1], j}, {ax[2], k}};
        out.push_back(MeshCoord{v["dp"], v["tp"], v["pp"]});
      }
  return out;
}

}  // namespace

TEST_CASE("mesh coordinates match the first-varies-fastest enumeration for every order and shape") {
  for (const auto& s : kShapes)
    for (const auto& order : kOrders) {
      const int world = s.dp * s.tp * s.pp;
      const auto ref = reference_coords(s, order);
      REQUIRE(static_cast<int>(ref.size()) == world);
      for (int r = 0; r < world; ++r) {
        INFO("shape " << s.dp << "x" << s.tp << "x" << s.pp << " order " << order << " rank " << r);
        DeviceMesh m(s.dp, s.tp, s.pp, order, world, r);
        CHECK(m.coord() == ref[r]);
        CHECK(m.coord_of(r) == ref[r]);
        CHECK(m.rank_of(ref[r]) == r);
        CHECK(m.dp_rank() == ref[r].dp);
        CHECK(m.tp_rank() == ref[r].tp);
        CHECK(m.pp_rank() == ref[r].pp);
      }
    }
}

TEST_CASE("mesh tp-dp-pp follows the contract formula rank = tp + tp*(dp + dp*pp)") {
  const int dp = 2, tp = 2, pp = 2;
  for (int r = 0; r < 8; ++r) {
    DeviceMesh m(dp, tp, pp, "tp-dp-pp", 8, r);
    CHECK(m.tp_rank() + tp * (m.dp_rank() + dp * m.pp_rank()) == r);
  }
  // The worked example of docs/mesh.md and the log line's format.
  DeviceMesh m5(2, 2, 2, "tp-dp-pp", 8, 5);
  CHECK(m5.describe() == "mesh dp=2 x tp=2 x pp=2 (order tp-dp-pp): rank 5 = (dp 0, tp 1, pp 1)");
  CHECK(m5.group_members(MeshAxis::TP) == std::vector<int>{4, 5});
  CHECK(m5.group_members(MeshAxis::DP) == std::vector<int>{5, 7});
  CHECK(m5.group_members(MeshAxis::PP) == std::vector<int>{1, 5});
  CHECK(m5.pp_prev() == 1);
  CHECK(m5.pp_next() == -1);
  const std::string table = m5.table();
  CHECK(std::count(table.begin(), table.end(), '\n') == 2 + 8);
}

TEST_CASE("mesh dp=0 means world / (tp*pp)") {
  DeviceMesh m(0, 2, 2, "tp-dp-pp", 8, 3);
  CHECK(m.dp() == 2);
  DeviceMesh m1(0, 1, 1, "tp-dp-pp", 1, 0);
  CHECK(m1.dp() == 1);
}

TEST_CASE("a fourth axis, cp: its place in the order, its groups and the replica group", "[cp]") {
  // Without cp in the order it comes right after tp: "tp-dp-pp" lays ranks out as "tp-cp-dp-pp".
  for (const std::string order : {"tp-dp-pp", "tp-cp-dp-pp", "cp-pp-tp-dp", "pp-dp-tp-cp"}) {
    const int dp = 2, tp = 2, pp = 2, cp = 2, world = dp * tp * pp * cp;
    INFO("order " << order);
    std::set<std::vector<int>> replica_groups, cp_groups;
    for (int r = 0; r < world; ++r) {
      DeviceMesh m(0, tp, pp, order, world, r, cp);
      CHECK(m.dp() == dp);
      CHECK(m.cp() == cp);
      CHECK(m.rank_of(m.coord()) == r);
      CHECK(m.order() == (order == "tp-dp-pp" ? "tp-cp-dp-pp" : order));
      // The order's first axis varies fastest: rank 1 is coordinate 1 along it.
      CHECK(m.coord_of(1)[m.axes()[0]] == 1);
      const std::vector<int> ring = m.group_members(MeshAxis::CP);
      CHECK(ring[m.cp_rank()] == r);
      for (int k = 0; k < cp; ++k) {
        const MeshCoord c = m.coord_of(ring[k]);
        CHECK((c.cp == k && c.dp == m.dp_rank() && c.tp == m.tp_rank() && c.pp == m.pp_rank()));
      }
      // The replica group: every (dp, cp) pair at this rank's (tp, pp), in replica-rank order dp * cp + cp_rank.
      const std::vector<int> replicas = m.replica_members(r);
      REQUIRE(static_cast<int>(replicas.size()) == m.replicas());
      CHECK(m.replicas() == dp * cp);
      CHECK(replicas[m.replica_rank()] == r);
      for (int i = 0; i < m.replicas(); ++i) {
        const MeshCoord c = m.coord_of(replicas[i]);
        CHECK((c.dp * cp + c.cp == i && c.tp == m.tp_rank() && c.pp == m.pp_rank()));
      }
      replica_groups.insert(replicas);
      cp_groups.insert(ring);
    }
    CHECK(replica_groups.size() == size_t(world / (dp * cp)));
    CHECK(cp_groups.size() == size_t(world / cp));
  }
  // cp = 1 keeps the three-axis order string and log lines.
  DeviceMesh plain(2, 2, 2, "tp-dp-pp", 8, 5);
  CHECK(plain.order() == "tp-dp-pp");
  CHECK(plain.describe().find("cp") == std::string::npos);
  CHECK(plain.replica_rank() == plain.dp_rank());
}

TEST_CASE("mesh groups partition the world, in coordinate order, for every order and shape") {
  for (const auto& s : kShapes)
    for (const auto& order : kOrders) {
      const int world = s.dp * s.tp * s.pp;
      for (MeshAxis axis : {MeshAxis::DP, MeshAxis::TP, MeshAxis::PP}) {
        INFO("shape " << s.dp << "x" << s.tp << "x" << s.pp << " order " << order << " axis "
                      << mesh_axis_name(axis));
        std::set<std::vector<int>> groups;
        std::vector<int> times_seen(world, 0);
        std::map<int, std::vector<int>> by_index;
        for (int r = 0; r < world; ++r) {
          DeviceMesh m(s.dp, s.tp, s.pp, order, world, r);
          const auto g = m.group_members(axis);
          REQUIRE(static_cast<int>(g.size()) == m.size(axis));
          // r sits at its own coordinate, and every member differs from r only along `axis`.
          CHECK(g[m.coord()[axis]] == r);
          for (int i = 0; i < static_cast<int>(g.size()); ++i) {
            const MeshCoord c = m.coord_of(g[i]);
            CHECK(c[axis] == i);
            for (MeshAxis o : {MeshAxis::DP, MeshAxis::TP, MeshAxis::PP})
              if (o != axis) CHECK(c[o] == m.coord()[o]);
          }
          // The split colour names the group: equal colours <=> equal member lists.
          const int gi = m.group_index(axis, r);
          CHECK(gi >= 0);
          CHECK(gi < world / m.size(axis));
          if (by_index.count(gi)) CHECK(by_index[gi] == g);
          by_index[gi] = g;
          if (groups.insert(g).second)
            for (int x : g) ++times_seen[x];
        }
        CHECK(static_cast<int>(groups.size()) == world / axis_size(s, mesh_axis_name(axis)));
        CHECK(static_cast<int>(by_index.size()) == static_cast<int>(groups.size()));
        for (int r = 0; r < world; ++r) CHECK(times_seen[r] == 1);  // each rank in exactly one group
      }
    }
}

TEST_CASE("mesh pipeline neighbours are the adjacent stages of the same dp and tp coordinates") {
  for (const auto& s : kShapes)
    for (const auto& order : kOrders) {
      const int world = s.dp * s.tp * s.pp;
      for (int r = 0; r < world; ++r) {
        INFO("shape " << s.dp << "x" << s.tp << "x" << s.pp << " order " << order << " rank " << r);
        DeviceMesh m(s.dp, s.tp, s.pp, order, world, r);
        const auto stages = m.group_members(MeshAxis::PP);
        const int st = m.pp_rank();
        CHECK(m.pp_prev() == (st > 0 ? stages[st - 1] : -1));
        CHECK(m.pp_next() == (st + 1 < s.pp ? stages[st + 1] : -1));
        CHECK(m.is_first_stage() == (st == 0));
        CHECK(m.is_last_stage() == (st == s.pp - 1));
        if (m.pp_next() >= 0) {
          DeviceMesh n(s.dp, s.tp, s.pp, order, world, m.pp_next());
          CHECK(n.pp_prev() == r);
        }
      }
    }
}

TEST_CASE("mesh tp groups are consecutive ranks under tp-dp-pp") {
  DeviceMesh m(2, 4, 1, "tp-dp-pp", 8, 6);
  CHECK(m.group_members(MeshAxis::TP) == std::vector<int>{4, 5, 6, 7});
  CHECK(m.group_members(MeshAxis::DP) == std::vector<int>{2, 6});
}

namespace {

// A stand-in backend: only the group's rank and size, read from the MPI communicator it is given. The split
// itself is verified with raw MPI below, so this test depends on no real backend.
class RankOnlyCommunicator : public Communicator {
 public:
  RankOnlyCommunicator(MPI_Comm c, std::string name) : comm_(c), name_(std::move(name)) {
    MPI_Comm_rank(c, &rank_);
    MPI_Comm_size(c, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  WorkPtr all_reduce_async(const Tensor&, ReduceOp) override { return fail(); }
  WorkPtr reduce_scatter_async(const Tensor&, const Tensor&, ReduceOp) override { return fail(); }
  WorkPtr all_gather_async(const Tensor&, const Tensor&) override { return fail(); }
  WorkPtr broadcast_async(const Tensor&, int) override { return fail(); }
  WorkPtr send_async(const Tensor&, int, int) override { return fail(); }
  WorkPtr recv_async(const Tensor&, int, int) override { return fail(); }
  WorkPtr barrier_async() override { return fail(); }
  double total_wait_us() const override { return 0; }
  MPI_Comm comm_;

 private:
  WorkPtr fail() {
    FAIL("not used");
    return nullptr;
  }
  std::string name_;
  int rank_ = 0, size_ = 0;
};

// All (dp, tp, pp) with dp*tp*pp == world.
std::vector<Shape3> factorisations(int world) {
  std::vector<Shape3> out;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; pp <= world; ++pp)
      if (world % (tp * pp) == 0) out.push_back({world / (tp * pp), tp, pp});
  return out;
}

// Members of `comm` in group-rank order, as world ranks, gathered over the communicator itself.
std::vector<int> members_by_allgather(MPI_Comm comm) {
  int wr = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(comm, &n);
  std::vector<int> v(n);
  MPI_Allgather(&wr, 1, MPI_INT, v.data(), 1, MPI_INT, comm);
  return v;
}

}  // namespace

TEST_CASE("mesh MPI split: each communicator holds exactly the computed members (any world size)") {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (const auto& s : factorisations(world))
    for (const auto& order : kOrders) {
      // Oversubscribed runs (8 ranks on 2 cores) spend seconds per split: above 4 ranks, every order only for
      // the shapes where all three axes are > 1, and the default order and its reverse for the others.
      const bool all_axes = s.dp > 1 && s.tp > 1 && s.pp > 1;
      if (world > 4 && !all_axes && order != "tp-dp-pp" && order != "pp-dp-tp") continue;
      INFO("world " << world << " shape " << s.dp << "x" << s.tp << "x" << s.pp << " order " << order);
      DeviceMesh mesh(s.dp, s.tp, s.pp, order, world, rank);
      MeshComms mc = make_mesh_comms(mesh, MPI_COMM_WORLD, [](MPI_Comm c, const std::string& name) {
        return std::unique_ptr<Communicator>(new RankOnlyCommunicator(c, name));
      });
      CHECK(mc.world->size() == world);
      CHECK(mc.world->rank() == rank);
      CHECK(mc.dp->name() == "dp");
      const std::pair<MeshAxis, Communicator*> groups[] = {
          {MeshAxis::DP, mc.dp.get()}, {MeshAxis::TP, mc.tp.get()}, {MeshAxis::PP, mc.pp.get()}};
      for (const auto& [axis, comm] : groups) {
        INFO("axis " << mesh_axis_name(axis));
        const auto expect = mesh.group_members(axis);
        MPI_Comm raw = static_cast<RankOnlyCommunicator*>(comm)->comm_;
        CHECK(comm->size() == static_cast<int>(expect.size()));
        CHECK(comm->rank() == mesh.coord()[axis]);
        // The sum of world ranks over the communicator (exact in integers) and the count of members.
        int sums[2] = {rank, 1}, got[2] = {0, 0};
        MPI_Allreduce(sums, got, 2, MPI_INT, MPI_SUM, raw);
        CHECK(got[0] == std::accumulate(expect.begin(), expect.end(), 0));
        CHECK(got[1] == static_cast<int>(expect.size()));
        // And exactly who, in which order: group rank i is the rank at coordinate i.
        CHECK(members_by_allgather(raw) == expect);
      }
      // Pipeline neighbours reached through the pp communicator are the computed global ranks.
      int prev_world = -1;
      MPI_Comm pp_raw = static_cast<RankOnlyCommunicator*>(mc.pp.get())->comm_;
      const int st = mesh.pp_rank();
      std::vector<int> all = members_by_allgather(pp_raw);
      if (st > 0) prev_world = all[st - 1];
      CHECK(prev_world == mesh.pp_prev());
    }
  // With cp: the cp ring along its axis, and `dp` over the replica group (dp x cp) in replica-rank order.
  if (world % 2 == 0) {
    DeviceMesh mesh(0, 1, 1, "tp-dp-pp", world, rank, 2);
    MeshComms mc = make_mesh_comms(mesh, MPI_COMM_WORLD, [](MPI_Comm c, const std::string& name) {
      return std::unique_ptr<Communicator>(new RankOnlyCommunicator(c, name));
    });
    REQUIRE(mc.cp);
    CHECK(members_by_allgather(static_cast<RankOnlyCommunicator*>(mc.cp.get())->comm_) ==
          mesh.group_members(MeshAxis::CP));
    CHECK(members_by_allgather(static_cast<RankOnlyCommunicator*>(mc.dp.get())->comm_) == mesh.replica_members(rank));
    CHECK(mc.dp->rank() == mesh.replica_rank());
  }
}

#if MESHTRAIN_WITH_CUDA
// The NCCL backend over MPI_COMM_WORLD, one GPU per rank; skipped (passes) where there are fewer GPUs than ranks,
// as on the CPU-only CI machine. Rank-valued inputs make every result exact in fp32 and bf16 (small integers).
#include <cuda_runtime.h>  // cudaMalloc's typed overloads

#include "comm/nccl_communicator.h"
#include "core/cuda_check.h"

namespace {
std::vector<float> from_device(const void* p, int64_t n) {
  std::vector<float> v(n);
  if (n) CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}
}  // namespace

TEST_CASE("nccl collectives give exact rank-valued results, even and uneven shards", "[nccl]") {
  int world = 0, rank = 0, gpus = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  int enough = gpus >= world ? 1 : 0, all = 0;
  MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    WARN("skipped: " << gpus << " GPUs for " << world << " ranks");
    return;
  }
  CUDA_CHECK(cudaSetDevice(rank));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  CommOptions opts;
  opts.timeout_s = 60;
  auto comm = make_nccl_communicator(MPI_COMM_WORLD, "world", opts, stream);
  REQUIRE(comm->size() == world);
  REQUIRE(comm->rank() == rank);
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(world * 5), int64_t(1000003)}) {
    INFO("n = " << n);
    float* buf = nullptr;
    float* shard = nullptr;
    CUDA_CHECK(cudaMalloc(&buf, (n + 1) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&shard, (n + 1) * sizeof(float)));
    std::vector<float> host(n);
    for (int64_t i = 0; i < n; ++i) host[i] = float((rank + 1) * (i % 13));
    auto upload = [&] {
      if (n) CUDA_CHECK(cudaMemcpy(buf, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    };
    const float ranks_sum = world * (world + 1) / 2.0f;
    Tensor t(buf, Shape{n}, DType::F32, Device::CUDA);

    upload();
    comm->all_reduce(t, ReduceOp::Sum);  // orders `stream` after it
    CUDA_CHECK(cudaStreamSynchronize(stream));
    auto got = from_device(buf, n);
    for (int64_t i = 0; i < n; ++i) REQUIRE(got[i] == ranks_sum * float(i % 13));

    upload();
    const ShardRange sr = shard_range(n, world, rank);
    Tensor out(shard, Shape{sr.size()}, DType::F32, Device::CUDA);
    comm->reduce_scatter(t, out, ReduceOp::Max);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    got = from_device(shard, sr.size());
    for (int64_t i = 0; i < sr.size(); ++i) REQUIRE(got[i] == float(world * ((sr.begin + i) % 13)));

    // all_gather of each rank's shard of the rank-valued buffer reassembles it.
    if (sr.size())
      CUDA_CHECK(cudaMemcpy(shard, host.data() + sr.begin, sr.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(buf, 0, (n + 1) * sizeof(float)));
    comm->all_gather(out, t);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    got = from_device(buf, n);
    for (int64_t i = 0; i < n; ++i) {
      const int owner = static_cast<int>(i / ((n + world - 1) / world));
      REQUIRE(got[i] == float((owner + 1) * (i % 13)));
    }

    upload();
    comm->broadcast(t, world - 1);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    got = from_device(buf, n);
    for (int64_t i = 0; i < n; ++i) REQUIRE(got[i] == float(world * (i % 13)));
    CUDA_CHECK(cudaFree(buf));
    CUDA_CHECK(cudaFree(shard));
  }
  // bf16: small integers are exact.
  {
    const int64_t n = 33;
    uint16_t* b = nullptr;
    CUDA_CHECK(cudaMalloc(&b, n * 2));
    std::vector<uint16_t> h(n);
    for (int64_t i = 0; i < n; ++i) h[i] = float_to_bf16(float(rank + i % 5));
    CUDA_CHECK(cudaMemcpy(b, h.data(), n * 2, cudaMemcpyHostToDevice));
    comm->all_reduce(Tensor(b, Shape{n}, DType::BF16, Device::CUDA), ReduceOp::Sum);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(h.data(), b, n * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i) REQUIRE(bf16_to_float(h[i]) == float(world * (world - 1) / 2 + world * (i % 5)));
    CUDA_CHECK(cudaFree(b));
  }
  comm->barrier();
  comm.reset();
  CUDA_CHECK(cudaStreamDestroy(stream));
}
#endif
