// The weights' copies compared by hash (see copies_check.h).
#include "train/copies_check.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <vector>

#include "comm/flight_recorder.h"
#include "core/device.h"
#include "core/errors.h"
#include "train/training_run.h"

namespace mt {

namespace {

// FNV-1a over the bytes, one 64-bit word at a time in eight lanes, so that eight independent multiply chains keep
// the core busy and memory, not the multiplies, bounds it; the lanes are then hashed together. Each step is a
// bijection of its lane's state for a given word, so two runs of bytes that differ in any one element always hash
// apart.
uint64_t hash_bytes(const void* data, int64_t bytes) {
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  constexpr int kLanes = 8;
  const char* p = static_cast<const char*>(data);
  uint64_t lane[kLanes];
  for (int l = 0; l < kLanes; ++l) lane[l] = 0xcbf29ce484222325ULL + uint64_t(l) * 0x9e3779b97f4a7c15ULL;
  const int64_t blocks = bytes / int64_t(sizeof(uint64_t) * kLanes);
  for (int64_t b = 0; b < blocks; ++b) {
    uint64_t w[kLanes];
    std::memcpy(w, p + b * int64_t(sizeof w), sizeof w);
    for (int l = 0; l < kLanes; ++l) lane[l] = (lane[l] ^ w[l]) * kPrime;
  }
  uint64_t h = uint64_t(bytes);
  for (uint64_t l : lane) h = (h ^ l) * kPrime;
  for (int64_t i = blocks * int64_t(sizeof(uint64_t) * kLanes); i < bytes; ++i)  // the tail, byte by byte
    h = (h ^ uint8_t(p[i])) * kPrime;
  return h;
}

// Each rank's row of the table: whether it holds a tied wte and that copy's hash, then one hash per parameter of its
// table, padded to the longest row. The world sums the table with every rank's row filled in and
// zeros elsewhere, as it sums the step's figures (through its communicator, so the watchdog and the flight recorder
// cover the check): each 64-bit value travels as four 16-bit pieces in floats, which a sum of zeros keeps exact.
constexpr int kHeader = 2, kPieces = 4;

void put(float* at, uint64_t v) {
  for (int k = 0; k < kPieces; ++k) at[k] = float((v >> (16 * k)) & 0xffff);
}

uint64_t get(const float* at) {
  uint64_t v = 0;
  for (int k = 0; k < kPieces; ++k) v |= uint64_t(at[k]) << (16 * k);
  return v;
}

// The world's sum of one float.
float world_sum(Communicator& world, float x, ReduceOp op = ReduceOp::Sum) {
  world.all_reduce(Tensor(&x, {1}, DType::F32), op);
  return x;
}

}  // namespace

std::string check_weight_copies(TrainingRun& r, int step, const Tensor& weights) {
  const DeviceMesh& mesh = r.mesh;
  const int world = mesh.world_size(), me = mesh.rank();
  if (world == 1) return "";
  r.dp->wait_params();  // ZeRO-1/2's gathers of the step's weights, in flight
  const PipelineChunks& model = *r.model;
  const ParamTable& table = model.table();
  // Under ZeRO-0 each replica updates a copy of its own; under ZeRO-1/2 each holds the compute weights gathered from
  // the replicas' shards, which its passes read. In fp32 those are the export's weights (export_weights returns
  // them); with 16-bit compute they are hashed apart. ZeRO-3 keeps no whole copy anywhere.
  const bool replicas = mesh.replicas() > 1 && !r.dp->shards_parameters();
  const bool gathered = replicas && r.dp->shards_optimizer();
  const Tensor compute = gathered && r.mixed ? to_host(model.params()) : Tensor();
  // The export's fp32 weights: for the replicas (unless `compute` stands for them), the tp copies and the tied
  // embedding (pp > 1, conservatively). Under ZeRO with 16-bit compute or ZeRO-3 they are gathered from the shards.
  const bool fp32_compared = (replicas && !compute.defined()) || mesh.tp() > 1 || mesh.pp() > 1;
  const Tensor host = fp32_compared ? to_host(weights.defined() ? weights : export_weights(r)) : Tensor();
  const float* w = fp32_compared ? host.data_as<float>() : nullptr;
  // Elements [offset, offset + numel) of a flat buffer whose elements are `size` bytes.
  auto hash_range = [](const void* base, int64_t size, int64_t offset, int64_t numel) {
    return hash_bytes(static_cast<const char*>(base) + offset * size, numel * size);
  };

  Communicator& world_comm = *r.comms.world;
  FlightSite site("copies check");
  const int n = table.size();
  const int most = int(world_sum(world_comm, float(n), ReduceOp::Max));
  const int row = kHeader + (compute.defined() ? 2 : 1) * most;  // the 16-bit compute weights' hashes after the rest
  std::vector<float> all(size_t(row) * kPieces * size_t(world), 0.0f);
  auto slot = [&](int rank, int k) { return all.data() + (size_t(rank) * size_t(row) + size_t(k)) * kPieces; };
  const int tc = model.tied_chunk();
  uint64_t tied_hash = 0;
  if (tc >= 0) {
    const ParamSpec& s = model.chunk(tc).table()[model.tied_param()];
    tied_hash = hash_range(w, sizeof(float), model.base(tc) + s.offset, s.numel());
    put(slot(me, 0), 1), put(slot(me, 1), tied_hash);
  }
  for (int i = 0; i < n; ++i) {
    if (w) put(slot(me, kHeader + i), hash_range(w, sizeof(float), table[i].offset, table[i].numel()));
    if (compute.defined())
      put(slot(me, kHeader + most + i), hash_range(compute.data(), int64_t(dtype_size(compute.dtype())),
                                                   table[i].offset, table[i].numel()));
  }
  world_comm.all_reduce(Tensor(all.data(), {int64_t(all.size())}, DType::F32), ReduceOp::Sum);
  auto hash_of = [&](int rank, int i) { return get(slot(rank, kHeader + i)); };
  auto replica_hash_of = [&](int rank, int i) { return get(slot(rank, kHeader + (compute.defined() ? most : 0) + i)); };

  // What differs from this rank's point of view, against the first copy of each group.
  int found = 0;
  auto differ = [&](const std::string& what, const std::string& between) {
    if (++found <= 5) spdlog::error("copies check after step {}: {} differs {}", step, what, between);
  };
  if (replicas) {
    const int first = mesh.replica_members(me).front();
    if (first != me)
      for (int i = 0; i < n; ++i)
        if (replica_hash_of(first, i) != replica_hash_of(me, i))
          differ(gathered ? "the gathered " + table[i].name : table[i].name,
                 fmt::format("between replica 0 (rank {}) and replica {} (rank {})", first, mesh.replica_rank(), me));
  }
  int tp_copies = 0;  // the parameters several tp ranks hold
  if (mesh.tp() > 1) {
    const std::vector<int> members = mesh.group_members(MeshAxis::TP);
    const int t = mesh.tp_rank();
    for (int i = 0; i < n; ++i) {
      const Shard& sh = table[i].shard;
      if (!sh.whole() && sh.copies == 1) continue;
      ++tp_copies;
      const int first = sh.whole() ? 0 : t / sh.copies * sh.copies;
      if (first != t && hash_of(members[size_t(first)], i) != hash_of(me, i))
        differ(table[i].name, fmt::format("between tp rank {} (rank {}) and tp rank {} (rank {})", first,
                                          members[size_t(first)], t, me));
    }
  }
  if (tc >= 0 && model.tied_copy_is_head()) {  // compared on the last stage's ranks, against stage 0's
    MeshCoord c = mesh.coord();
    c.pp = 0;
    const int embedding = mesh.rank_of(c);
    if (embedding != me && (get(slot(embedding, 0)) != 1 || get(slot(embedding, 1)) != tied_hash))
      differ("the tied " + model.chunk(tc).table()[model.tied_param()].name,
             fmt::format("between stage 0 (rank {}) and stage {} (rank {})", embedding, model.num_stages() - 1, me));
  }
  if (found > 5) spdlog::error("copies check after step {}: {} more parameters differ on this rank", step, found - 5);
  const int ranks_found = int(world_sum(world_comm, found > 0 ? 1.0f : 0.0f));
  if (ranks_found > 0)
    throw StoppedTogether(fmt::format(
        "copies check after step {}: the weights' copies differ on {} of {} ranks (their lines name the parameters): "
        "copies that training keeps equal drifted apart, a bug or a corrupted update", step, ranks_found, world));

  std::vector<std::string> parts;
  if (replicas)
    parts.push_back(fmt::format("the {} replicas' {}weights", mesh.replicas(), gathered ? "gathered " : ""));
  if (tp_copies) parts.push_back(fmt::format("{} parameters on every tp rank that holds them", tp_copies));
  if (tc >= 0) parts.push_back("the tied wte on the first and the last stage");
  if (parts.empty()) return "";  // the start-up log says so where run.check_copies_every is set (ignored_settings)
  std::string list;
  for (size_t i = 0; i < parts.size(); ++i)
    list += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return fmt::format("copies check after step {}: {} agree, bit for bit", step, list);
}

}  // namespace mt
