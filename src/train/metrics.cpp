// metrics.jsonl rows. Floats keep 10 significant digits so parity checks at 1e-5 relative have room.
#include "train/metrics.h"

#include <fmt/format.h>

#include "core/errors.h"

namespace mt {

std::string to_json(const StepMetrics& m) {
  std::string s = fmt::format(
      "{{\"step\": {}, \"loss\": {:.10g}, \"lr\": {:.10g}, \"grad_norm\": {:.10g}, \"tokens\": {}, "
      "\"step_ms\": {:.4f}, \"tokens_per_s\": {:.2f}, \"compute_ms\": {:.4f}, \"comm_ms\": {:.4f}, "
      "\"exposed_comm_ms\": {:.4f}, \"bubble_ms\": {:.4f}",
      m.step, m.loss, m.lr, m.grad_norm, m.tokens, m.step_ms, m.tokens_per_s, m.compute_ms, m.comm_ms,
      m.exposed_comm_ms, m.bubble_ms);
  if (m.val_loss >= 0) s += fmt::format(", \"val_loss\": {:.10g}", m.val_loss);
  return s + "}";
}

MetricsWriter::MetricsWriter(const std::string& path) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) input_error("cannot write {}", path);
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
