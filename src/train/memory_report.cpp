// Gathering, logging and writing the per-rank memory report.
#include "train/memory_report.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <fstream>

#include "core/check.h"

namespace mt {

double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss * 1024.0;  // ru_maxrss is in KiB on Linux
}

void report_memory(const RankMemory& m, const DeviceMesh& mesh, Communicator& world, const std::string& path) {
  constexpr int kFields = 8;
  const int n = mesh.world_size();
  // fp64 holds byte counts exactly (below 2^53).
  Tensor mine = Tensor::zeros({kFields}, DType::F64), all = Tensor::zeros({kFields * int64_t(n)}, DType::F64);
  double* me = mine.data_as<double>();
  const double fields[kFields] = {m.params,  m.grads,   m.optimizer,    m.activations,
                                  m.records, m.buffers, m.peak_tensors, m.peak_rss};
  for (int i = 0; i < kFields; ++i) me[i] = fields[i];
  world.all_gather(mine, all);
  if (mesh.rank() != 0) return;
  const double* a = all.data_as<double>();
  for (int s = 0; s < mesh.pp(); ++s) {
    const double* r = a + kFields * mesh.rank_of({0, 0, s});
    // Without a pipeline there is one stage and no receive buffers: the line says so, not "stage 0".
    if (mesh.pp() == 1)
      spdlog::info("peak activations {:.2f} MiB ({} record{}), peak tensor memory {:.2f} MiB", r[3] / 1048576.0,
                   int(r[4]), int(r[4]) == 1 ? "" : "s", r[6] / 1048576.0);
    else
      spdlog::info("[pipeline stage {}] peak activations {:.2f} MiB ({} records), receive buffers {:.2f} MiB, peak "
                   "tensor memory {:.2f} MiB",
                   s, r[3] / 1048576.0, int(r[4]), r[5] / 1048576.0, r[6] / 1048576.0);
  }
  std::ofstream f(path);
  CHECK(f.good(), "cannot write {}", path);
  f << "{\"ranks\": [";
  for (int rank = 0; rank < n; ++rank) {
    const double* r = a + kFields * rank;
    const MeshCoord c = mesh.coord_of(rank);
    f << (rank ? ",\n  " : "\n  ")
      << fmt::format("{{\"rank\": {}, \"dp_rank\": {}, \"tp_rank\": {}, \"pp_rank\": {}, \"cp_rank\": {}, "
                     "\"params_bytes\": {:.0f}, "
                     "\"grads_bytes\": {:.0f}, \"optimizer_bytes\": {:.0f}, \"activation_bytes\": {:.0f}, "
                     "\"activation_records\": {:.0f}, \"buffer_bytes\": {:.0f}, \"peak_tensor_bytes\": {:.0f}, "
                     "\"peak_rss_bytes\": {:.0f}}}",
                     rank, c.dp, c.tp, c.pp, c.cp, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
  }
  f << "\n]}\n";
}

}  // namespace mt
