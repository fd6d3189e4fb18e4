// meta.json parsing and checks (see checkpoint_meta.h).
#include "train/checkpoint_meta.h"

#include <fmt/format.h>

#include <stdexcept>

#include "core/checksum.h"
#include "core/errors.h"
#include "core/json.h"

namespace mt {

std::vector<std::pair<const char*, int64_t>> checkpoint_model_shape(const ModelConfig& m) {
  return {{"n_layer", m.n_layer}, {"n_head", m.n_head}, {"d_model", m.d_model}, {"seq_len", m.seq_len},
          {"vocab_size", m.vocab_size}};
}

namespace {

constexpr std::string_view kSealHead = "{\n  \"meta_checksum\": \"";  // then 16 hex digits and "\",\n"
constexpr size_t kSealLine = kSealHead.size() + 16 + 3;

std::string body_checksum(std::string_view head, std::string_view rest) {
  Checksum64 ck;
  ck.update(head.data(), head.size());
  ck.update(rest.data(), rest.size());
  return fmt::format("{:016x}", ck.value());
}

}  // namespace

std::string seal_checkpoint_meta(const std::string& body) {
  if (body.rfind("{\n", 0) != 0) throw std::logic_error("meta.json's body must start with \"{\\n\"");
  const std::string_view rest = std::string_view(body).substr(2);
  return std::string(kSealHead) + body_checksum("{\n", rest) + "\",\n" + std::string(rest);
}

CheckpointMeta parse_checkpoint_meta(std::string_view text, const std::string& path, const std::string& dir,
                                     const ModelConfig& model_cfg) {
  // The seal first: a damaged meta.json is refused as such, before any of its values is believed.
  const bool sealed = text.substr(0, kSealHead.size()) == kSealHead;
  if (sealed) {
    if (text.size() < kSealLine || text.substr(kSealHead.size() + 16, 3) != "\",\n")
      input_error("checkpoint file {} has a damaged \"meta_checksum\" line (the file is corrupt)", path);
    const std::string_view want = text.substr(kSealHead.size(), 16);
    if (body_checksum("{\n", text.substr(kSealLine)) != want)
      input_error("checkpoint file {} fails its own checksum (\"meta_checksum\" {}): the file is corrupt or was "
                  "edited", path, want);
  }
  Json meta;
  try {
    meta = parse_json(text);
  } catch (const JsonError& e) {
    input_error("checkpoint file {} is not valid JSON: {}", path, e.what());
  }
  auto field = [&](const Json* obj, const char* key) -> const Json& {
    const Json* v = obj && obj->is_object() ? obj->get(key) : nullptr;
    if (!v) input_error("checkpoint file {} lacks \"{}\"", path, key);
    return *v;
  };
  // Counts and steps: non-negative integers small enough for an int step counter.
  auto integer = [&](const Json* obj, const char* key, uint64_t max = (uint64_t(1) << 31) - 2) {
    const Json& v = field(obj, key);
    if (!v.is_uint() || v.integer > max)
      input_error("checkpoint file {}: \"{}\" must be an integer in [0, {}]", path, key, max);
    return int64_t(v.integer);
  };
  const Json& format = field(&meta, "format");
  const int64_t version = integer(&meta, "version");
  if (!format.is_string() || format.string != kCheckpointFormat || version < 1 || version > kCheckpointVersion)
    input_error("checkpoint file {} is not a meshtrain checkpoint of version 1 to {}", path, kCheckpointVersion);
  if (version >= 2 && !sealed)
    input_error("checkpoint file {} lacks its \"meta_checksum\" (version {} seals meta.json): the file is corrupt",
                path, version);
  CheckpointMeta m;
  m.state.step = integer(&meta, "step");
  m.state.optimizer_steps = integer(&meta, "optimizer_steps");
  const Json& scaler = field(&meta, "loss_scaler");
  const Json& scale = field(&scaler, "scale");
  if (!scale.is_number() || !(scale.number > 0) || !(scale.number < 1e38))
    input_error("checkpoint file {}: the loss scale must be a positive finite number", path);
  m.state.loss_scale = scale.number;
  m.state.good_in_a_row = int(integer(&scaler, "good_in_a_row"));
  m.state.skipped_steps = integer(&scaler, "skipped_steps");
  m.state.nonfinite_skipped = integer(&meta, "nonfinite_skipped_steps");
  const Json& model = field(&meta, "model");
  for (const auto& [k, v] : checkpoint_model_shape(model_cfg))
    if (integer(&model, k) != v)
      input_error("checkpoint {} belongs to another model: model.{} is {} there and {} in this config "
                  "(run.resume=none starts afresh)", dir, k, integer(&model, k), v);
  const Json& mesh = field(&meta, "mesh");
  // "cp" since context parallelism: older checkpoints were written with cp = 1.
  const int64_t cp = mesh.is_object() && mesh.get("cp") ? integer(&mesh, "cp") : 1;
  m.mesh = fmt::format("{} x {} x {}{} (dp x tp x pp{}){}", integer(&mesh, "dp"), integer(&mesh, "tp"),
                       integer(&mesh, "pp"), cp > 1 ? fmt::format(" x {}", cp) : "", cp > 1 ? " x cp" : "",
                       integer(&mesh, "zero") ? fmt::format(", ZeRO-{}", integer(&mesh, "zero")) : std::string());
  const Json& files = field(&meta, "files");
  if (!files.is_array() || files.array.empty()) input_error("checkpoint file {}: \"files\" must be a list", path);
  for (const Json& f : files.array) {
    const Json& name = field(&f, "name");
    const Json& sum = field(&f, "checksum");
    if (!name.is_string() || name.string.empty() || name.string.find('/') != std::string::npos ||
        name.string == "." || name.string == ".." || !sum.is_string())
      input_error("checkpoint file {}: bad entry in \"files\"", path);
    m.files.push_back({name.string, uint64_t(integer(&f, "bytes", ~uint64_t(0))), sum.string});
  }
  if (const Json* c = meta.get("config"); c && c->is_string()) m.config = c->string;
  return m;
}

}  // namespace mt
