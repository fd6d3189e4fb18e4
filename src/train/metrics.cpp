// metrics.jsonl rows. Floats keep 10 significant digits so parity checks at 1e-5 relative have room.
#include "train/metrics.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/durable_file.h"
#include "core/errors.h"
#include "core/json.h"

namespace mt {

namespace {
// JSON has no inf or NaN: a non-finite value (the gradient norm of a step skipped for overflow, a diverged loss)
// is written as null.
std::string num(double v) { return std::isfinite(v) ? fmt::format("{:.10g}", v) : "null"; }
}  // namespace

std::string to_json(const StepMetrics& m) {
  std::string s = fmt::format(
      "{{\"step\": {}, \"loss\": {}, \"lr\": {:.10g}, \"grad_norm\": {}, \"tokens\": {}, "
      "\"step_ms\": {:.4f}, \"elapsed_ms\": {:.3f}, \"tokens_per_s\": {:.2f}, \"compute_ms\": {:.4f}, \"comm_ms\": {:.4f}, "
      "\"comm_cpu_ms\": {:.4f}, \"exposed_comm_ms\": {:.4f}, \"bubble_ms\": {:.4f}, \"comm_bytes\": {}, "
      "\"slowest_rank\": {}, \"straggler_wait_ms\": {:.4f}, \"slowest_exposed_comm_ms\": {:.4f}",
      m.step, num(m.loss), m.lr, num(m.grad_norm), m.tokens, m.step_ms, m.elapsed_ms, m.tokens_per_s, m.compute_ms, m.comm_ms,
      m.comm_cpu_ms, m.exposed_comm_ms, m.bubble_ms, m.comm_bytes, m.slowest_rank, m.straggler_wait_ms,
      m.slowest_exposed_comm_ms);
  if (m.loss_scale > 0) s += fmt::format(", \"loss_scale\": {:.10g}", m.loss_scale);
  if (m.skipped_steps >= 0) s += fmt::format(", \"skipped_steps\": {}", m.skipped_steps);
  if (m.bucket_mb > 0) s += fmt::format(", \"bucket_mb\": {:g}, \"compress\": {}", m.bucket_mb, json_quote(m.compress));
  if (m.sync_every > 0) s += fmt::format(", \"sync_every\": {}", m.sync_every);
  if (!m.adapt.empty()) s += fmt::format(", \"adapt\": {}", json_quote(m.adapt));
  if (m.staleness_max >= 0)
    s += fmt::format(", \"staleness_max\": {:.0f}, \"staleness_mean\": {:.4f}", m.staleness_max, m.staleness_mean);
  if (m.val_loss >= 0) s += fmt::format(", \"val_loss\": {}", num(m.val_loss));
  if (m.energy_j >= 0) s += fmt::format(", \"energy_j\": {:.4f}", m.energy_j);
  if (m.gpu_energy_j >= 0) s += fmt::format(", \"gpu_energy_j\": {:.4f}", m.gpu_energy_j);
  return s + "}";
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t keep_through_step) {
  if (keep_through_step >= 0) {
    // The rows to keep go to a new file that replaces the old one in one rename: a crash here loses nothing.
    std::string kept;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const size_t at = line.find("\"step\": ");
      if (at != std::string::npos && std::strtoll(line.c_str() + at + 8, nullptr, 10) <= keep_through_step)
        kept += line + "\n";
    }
    // A failure (a full disk) names its cause, leaves no .tmp behind and is not an input error (exit 1).
    write_text_durably(path, kept);
  }
  f_ = std::fopen(path.c_str(), keep_through_step >= 0 ? "a" : "w");
  if (!f_) input_error("cannot write {}: {}", path, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const StepMetrics& m) {
  std::string line = to_json(m) + "\n";
  std::fwrite(line.data(), 1, line.size(), f_);
  std::fflush(f_);
}

}  // namespace mt
