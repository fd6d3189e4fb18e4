// Checkpoint files: writing, finding, verifying and reading them back on any mesh (see checkpoint.h).
#include "train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "core/checksum.h"
#include "core/durable_file.h"
#include "core/errors.h"
#include "core/input_file.h"
#include "core/json.h"
#include "model/gpt.h"
#include "model/safetensors.h"
#include "model/tp_shard.h"
#include "train/model_config.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

std::vector<char> read_bytes(const std::string& path) {
  require_regular_file(path, "checkpoint file");
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) input_error("checkpoint file {} cannot be read", path);
  const std::streamoff size = f.tellg();
  if (size < 0) input_error("checkpoint file {} is not a regular file", path);
  std::vector<char> bytes(static_cast<size_t>(size));
  f.seekg(0);
  if (!f.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    input_error("checkpoint file {} cannot be read", path);
  return bytes;
}

// Calls f(local, global, count) for the pieces of the local elements [first, first + n) of `s` that are
// contiguous in the full tensor (one per tensor-parallel run), clipped to the full (unpadded) tensor.
template <typename F>
void for_each_span(const ParamSpec& s, int64_t first, int64_t n, F&& f) {
  const int64_t len = s.run_length(), full = s.full_numel();
  for (int64_t l = first; l < first + n;) {
    const int64_t q = l / len, in_run = l - q * len, count = std::min(len - in_run, first + n - l);
    const int64_t g = s.run_global_begin(q) + in_run;
    if (g < full) f(l, g, std::min(count, full - g));
    l += count;
  }
}

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string rank_file_name(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

// "dim parts part groups|global shape|full shape", the shard layout a reader needs to place local elements.
std::string shard_descriptor(const ParamSpec& s) {
  std::string d = fmt::format("{} {} {} {}|", s.shard.dim, s.shard.parts, s.shard.part, s.shard.groups);
  for (int i = 0; i < s.global_shape.n; ++i) d += fmt::format("{}{}", i ? " " : "", s.global_shape[i]);
  d += '|';
  for (int i = 0; i < s.full_shape.n; ++i) d += fmt::format("{}{}", i ? " " : "", s.full_shape[i]);
  return d;
}

ParamSpec parse_descriptor(const std::string& file, const std::string& name, const std::string& d) {
  auto fail = [&]() -> ParamSpec { input_error("checkpoint file {}: bad shard layout '{}' for {}", file, d, name); };
  std::vector<std::string> parts;
  std::stringstream ss(d);
  for (std::string p; std::getline(ss, p, '|');) parts.push_back(p);
  if (parts.size() != 3) return fail();
  Shard sh;
  std::istringstream head(parts[0]);
  if (!(head >> sh.dim >> sh.parts >> sh.part >> sh.groups)) return fail();
  auto shape = [&](const std::string& text, Shape& out) {
    std::istringstream in(text);
    for (int64_t x; in >> x;) {
      if (out.n == Shape::kMaxDims || x < 1) return false;
      out.d[out.n++] = x;
    }
    return out.n > 0;
  };
  Shape global, full;
  if (!shape(parts[1], global) || !shape(parts[2], full) || sh.parts < 1 || sh.part < 0 || sh.part >= sh.parts ||
      sh.groups < 1 || sh.dim < -1 || sh.dim >= global.n || full.n != global.n || full[0] > global[0] ||
      (sh.dim >= 0 && global[sh.dim] % (int64_t(sh.groups) * sh.parts) != 0))
    return fail();
  for (int i = 1; i < global.n; ++i)
    if (global[i] != full[i]) return fail();
  ParamTable t;
  t.add(name, global, full, false, sh);
  return t[0];
}

// Crash-test hook: MESHTRAIN_CRASH_IN_CHECKPOINT=STEP kills the last rank in the middle of writing that step's
// checkpoint (a partial temporary file on disk, as a crash leaves it).
void maybe_crash(int64_t step, int rank, int world, const std::string& dir) {
  const char* v = std::getenv("MESHTRAIN_CRASH_IN_CHECKPOINT");
  if (!v || std::atoll(v) != step || rank != world - 1) return;
  std::ofstream(dir + "/" + rank_file_name(rank) + ".tmp") << "partial";
  spdlog::warn("MESHTRAIN_CRASH_IN_CHECKPOINT: rank {} kills itself while writing {}", rank, dir);
  ::raise(SIGKILL);
}

void prune(const std::string& root, int keep, int64_t newest) {
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step_", 0) != 0) continue;
    const int64_t step = std::atoll(n.c_str() + 5);
    if (fs::exists(e.path() / "COMPLETE")) complete.emplace_back(step, e.path());
    else if (step < newest) fs::remove_all(e.path());  // an interrupted write older than a complete checkpoint
  }
  std::sort(complete.rbegin(), complete.rend());
  // COMPLETE goes first: a prune interrupted part-way leaves an incomplete directory (skipped, then removed by
  // the next prune), never one that claims to be complete with files missing.
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < complete.size(); ++i) {
    fs::remove(complete[i].second / "COMPLETE");
    fs::remove_all(complete[i].second);
  }
}

// A failed write, seen by every rank at once: rank 0 removes the incomplete step directory (a full disk would
// otherwise keep the space the partial files hold), then every rank stops with `what` (exit 1, no abort).
[[noreturn]] void fail_together(const std::string& dir, int rank, const std::string& what) {
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec) spdlog::error("[rank 0] could not remove the incomplete checkpoint {}: {}", dir, ec.message());
  }
  throw StoppedTogether(what);
}

}  // namespace

std::string write_checkpoint(const std::string& root, const Config& cfg, const TrainState& st,
                             const CheckpointShard& shard, Communicator& world, int keep) {
  const std::string dir = root + "/" + step_dir_name(st.step);
  if (shard.rank == 0) {
    fs::remove_all(dir);  // a stale directory of the same step (an earlier run with resume: none)
    fs::create_directories(dir);
  }
  world.barrier();
  maybe_crash(st.step, shard.rank, shard.world, dir);

  // This rank's file; any failure is reported to every rank instead of leaving them waiting.
  std::string error;
  uint64_t size = 0, sum = 0;
  try {
    const ParamTable& t = *shard.table;
    std::vector<SafetensorOut> out;
    std::map<std::string, std::string> meta = shard.metadata;
    meta["rank"] = std::to_string(shard.rank);
    for (const CheckpointPiece& piece : shard.pieces) {
      int p = 0;
      while (p + 1 < t.size() && t[p + 1].offset <= piece.offset) ++p;
      const ParamSpec& s = t[p];
      CHECK(piece.offset >= s.offset && piece.offset + piece.numel <= s.offset + s.numel(),
            "checkpoint piece [{}, +{}) crosses {}", piece.offset, piece.numel, s.name);
      meta[s.name] = shard_descriptor(s);
      for (const CheckpointField& f : piece.fields)
        out.push_back({fmt::format("{}/{}/{}", f.kind, s.name, piece.offset - s.offset), DType::F32, {piece.numel},
                       f.data});
    }
    for (const CheckpointTensor& t : shard.tensors) out.push_back({t.name, DType::F32, {t.numel}, t.data});
    size = write_safetensors(dir + "/" + rank_file_name(shard.rank), out, meta, &sum);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Every rank's (ok, size, checksum) to every rank, as 32-bit words.
  Tensor mine = Tensor::zeros({5}, DType::I32), all = Tensor::zeros({5 * int64_t(shard.world)}, DType::I32);
  const uint32_t words[5] = {error.empty() ? 1u : 0u, uint32_t(size), uint32_t(size >> 32), uint32_t(sum),
                             uint32_t(sum >> 32)};
  std::memcpy(mine.data(), words, sizeof(words));
  world.all_gather(mine, all);
  const uint32_t* w = static_cast<const uint32_t*>(all.data());
  for (int r = 0; r < shard.world; ++r)
    if (!w[5 * r]) {
      if (r == shard.rank) spdlog::error("[rank {}] writing its checkpoint file failed: {}", r, error);
      fail_together(dir, shard.rank, fmt::format("writing checkpoint {} failed on rank {}", dir, r));
    }

  if (shard.rank == 0) try {
    std::string files;
    for (int r = 0; r < shard.world; ++r) {
      const uint64_t sz = uint64_t(w[5 * r + 1]) | uint64_t(w[5 * r + 2]) << 32;
      const uint64_t ck = uint64_t(w[5 * r + 3]) | uint64_t(w[5 * r + 4]) << 32;
      files += fmt::format("{}    {{\"name\": {}, \"bytes\": {}, \"checksum\": \"{}\"}}", r ? ",\n" : "",
                           json_quote(rank_file_name(r)), sz, hex(ck));
    }
    std::string model, params, stages;
    for (const auto& [k, v] : checkpoint_model_shape(cfg.model)) model += fmt::format("{}\"{}\": {}", model.empty() ? "" : ", ", k, v);
    // Every parameter's global name and full shape (the single-rank model), and how the mesh cut it: the stage
    // blocks here, each rank file's shard layouts in its own metadata.
    const ParamTable table = gpt_param_table(gpt_config(cfg.model));
    for (const ParamSpec& s : table.specs()) {
      std::string shape;
      for (int i = 0; i < s.full_shape.n; ++i) shape += fmt::format("{}{}", i ? ", " : "", s.full_shape[i]);
      params += fmt::format("{}    {{\"name\": {}, \"shape\": [{}]}}", params.empty() ? "" : ",\n", json_quote(s.name), shape);
    }
    for (int n : layers_per_stage(cfg)) stages += fmt::format("{}{}", stages.empty() ? "" : ", ", n);
    const std::string text = fmt::format(
        "{{\n  \"format\": \"{}\",\n  \"version\": {},\n  \"step\": {},\n  \"optimizer_steps\": {},\n"
        "  \"loss_scaler\": {{\"scale\": {:.17g}, \"good_in_a_row\": {}, \"skipped_steps\": {}}},\n"
        "  \"nonfinite_skipped_steps\": {},\n"
        "  \"data\": {{\"next_step\": {}, \"seed\": {}, \"order\": {}}},\n"
        "  \"rng\": {{\"seed\": {}}},\n  \"model\": {{{}}},\n"
        "  \"mesh\": {{\"world\": {}, \"dp\": {}, \"tp\": {}, \"pp\": {}, \"cp\": {}, \"virtual_stages\": {}, \"zero\": {}, "
        "\"order\": {}, \"stage_layers\": [{}]}},\n"
        "  \"precision\": {},\n  \"params\": [\n{}\n  ],\n  \"files\": [\n{}\n  ],\n  \"config\": {}\n}}\n",
        kCheckpointFormat, kCheckpointVersion, st.step, st.optimizer_steps, st.loss_scale, st.good_in_a_row, st.skipped_steps,
        st.nonfinite_skipped,
        st.step + 1, cfg.train.seed, json_quote(name_of(cfg.data.order)), cfg.train.seed, model, shard.world,
        shard.world / (cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp), cfg.parallel.tp, cfg.parallel.pp,
        cfg.parallel.cp, cfg.parallel.virtual_stages, cfg.optim.zero, json_quote(cfg.parallel.order), stages,
        json_quote(dtype_name(cfg.precision.compute)), params, files, json_quote(to_yaml(cfg)));
    write_text_durably(dir + "/meta.json", seal_checkpoint_meta(text));
    write_text_durably(dir + "/COMPLETE", std::to_string(st.step) + "\n");
    // The new checkpoint is complete: a prune that fails leaves old directories behind, never fails the write.
    try {
      prune(root, keep, st.step);
    } catch (const std::exception& e) {
      spdlog::warn("[rank 0] pruning old checkpoints under {} failed: {} (they stay; the next prune retries)", root,
                   e.what());
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Rank 0's verdict on meta.json and COMPLETE to every rank; on return the checkpoint is complete for every rank.
  Tensor ok = Tensor::zeros({1}, DType::F32);
  static_cast<float*>(ok.data())[0] = error.empty() ? 1.f : 0.f;
  world.broadcast(ok, 0);
  if (static_cast<const float*>(ok.data())[0] != 1.f) {
    if (shard.rank == 0) spdlog::error("[rank 0] writing the checkpoint's meta.json or COMPLETE failed: {}", error);
    fail_together(dir, shard.rank, fmt::format("writing checkpoint {} failed on rank 0", dir));
  }
  return dir;
}

std::vector<std::string> complete_checkpoints(const std::string& root, std::vector<std::string>* skipped) {
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> complete, incomplete;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step_", 0) != 0) continue;
    const int64_t step = std::atoll(n.c_str() + 5);
    (fs::exists(e.path() / "COMPLETE") ? complete : incomplete).emplace_back(step, e.path().string());
  }
  std::sort(complete.rbegin(), complete.rend());
  std::vector<std::string> out;
  for (const auto& c : complete) out.push_back(c.second);
  if (skipped)
    for (const auto& [step, path] : incomplete)
      if (complete.empty() || step > complete.front().first)
        skipped->push_back(fmt::format("{} (step {}) has no COMPLETE marker: its write was interrupted", path, step));
  return out;
}

std::string latest_checkpoint(const std::string& root) {
  const std::vector<std::string> all = complete_checkpoints(root, nullptr);
  return all.empty() ? "" : all.front();
}

namespace {

// The configuration values that change what a checkpoint's state means without changing any tensor's shape, each
// compared against the checkpoint's resolved config (meta.json "config"). The shape keys are compared by
// parse_checkpoint_meta, and every tensor's shape by load_checkpoint.
void check_resume_keys(const std::string& yaml, const Config& cfg, const std::string& dir) {
  if (yaml.empty()) return;  // a checkpoint without its config: only the shape is known
  YAML::Node c;
  try {
    c = YAML::Load(yaml);
  } catch (const std::exception& e) {
    input_error("checkpoint {}: the config recorded in its meta.json does not parse: {}", dir, e.what());
  }
  auto refuse = [&](const std::string& key, const std::string& there, const std::string& here, const char* why) {
    throw CheckpointMismatch(fmt::format(
        "checkpoint {} was written with {}={} and this config has {}={}: {} (set {} back to {} to continue it, "
        "or run.resume=none to start afresh)", dir, key, there, key, here, why, key, there));
  };
  auto scalar = [&](const char* section, const char* key) -> std::string {
    const YAML::Node s = c[section];
    if (!s || !s.IsMap() || !s[key] || !s[key].IsScalar()) return "";
    return s[key].Scalar();
  };
  const std::string arch = scalar("model", "arch").empty() ? "gpt2" : scalar("model", "arch");
  if (arch != name_of(cfg.model.arch))
    refuse("model.arch", arch, name_of(cfg.model.arch), "the parameters belong to another architecture");
  if (cfg.model.arch == ModelArch::Llama) {
    const std::string tie = scalar("model", "tie_embeddings");
    const bool tied = tie == "true";
    if (!tie.empty() && tied != cfg.model.tie_embeddings)
      refuse("model.tie_embeddings", tie, cfg.model.tie_embeddings ? "true" : "false",
             tied ? "the head would start from untrained weights"
                  : "the checkpoint's trained head (lm_head.weight) would be thrown away");
    auto real = [&](const char* key, double have, const char* why) {
      const std::string v = scalar("model", key);
      if (v.empty()) return;
      double there = 0;
      try {
        there = std::stod(v);
      } catch (const std::exception&) {
        input_error("checkpoint {}: model.{} in its recorded config is not a number: '{}'", dir, key, v);
      }
      if (there != have) refuse(std::string("model.") + key, fmt::format("{:g}", there), fmt::format("{:g}", have), why);
    };
    real("rope_theta", cfg.model.rope_theta, "the trained weights expect the other rotary frequencies");
    real("norm_eps", cfg.model.norm_eps, "the trained weights expect the other RMSNorm epsilon");
  }
  const std::string opt = scalar("optim", "name").empty() ? "adamw" : scalar("optim", "name");
  if (opt != name_of(cfg.optim.name))
    refuse("optim.name", opt, name_of(cfg.optim.name),
           "the checkpoint's optimizer state is another optimizer's (its moments would be misread)");
}

}  // namespace

CheckpointInfo read_checkpoint(const std::string& dir, const Config& cfg) {
  if (!fs::is_directory(dir)) input_error("checkpoint {} is not a directory", dir);
  if (!fs::exists(fs::path(dir) / "COMPLETE"))
    input_error("checkpoint {} is incomplete (no COMPLETE marker: its write was interrupted)", dir);
  const std::string meta_path = dir + "/meta.json";
  const std::vector<char> text = read_bytes(meta_path);
  const CheckpointMeta meta = parse_checkpoint_meta(std::string_view(text.data(), text.size()), meta_path, dir, cfg.model);
  check_resume_keys(meta.config, cfg, dir);
  CheckpointInfo info;
  info.dir = dir;
  info.state = meta.state;
  info.mesh = meta.mesh;
  info.config = meta.config;
  for (const CheckpointFileEntry& f : meta.files) {
    const std::string path = dir + "/" + f.name;
    if (!fs::exists(path)) input_error("checkpoint file {} is missing", path);
    require_regular_file(path, "checkpoint file");
    FileBytes data;
    try {
      data = FileBytes::map(path);
    } catch (const std::runtime_error& e) {
      input_error("checkpoint file {} cannot be read ({})", path, e.what());
    }
    if (data.size() != f.bytes)
      input_error("checkpoint file {} is truncated or altered: {} bytes, meta.json says {}", path, data.size(), f.bytes);
    Checksum64 ck;
    ck.update(data.data(), data.size());
    if (hex(ck.value()) != f.checksum) input_error("checkpoint file {} fails its checksum (the file is corrupt)", path);
    info.files.push_back(SafetensorsFile::from_bytes(path, std::move(data)));
  }
  return info;
}

namespace {

// A tensor name "<kind>/<param>/<first>" split at its last two slashes (kinds may hold slashes themselves); false
// for any other name.
bool split_tensor_name(const std::string& t, std::string& kind, std::string& param, int64_t& first) {
  const size_t b = t.rfind('/');
  if (b == std::string::npos || b == 0) return false;
  const size_t a = t.rfind('/', b - 1);
  if (a == std::string::npos) return false;
  kind = t.substr(0, a), param = t.substr(a + 1, b - a - 1), first = std::atoll(t.c_str() + b + 1);
  return true;
}

}  // namespace

bool checkpoint_has(const CheckpointInfo& info, const std::string& kind) {
  std::string k, param;
  int64_t first = 0;
  for (const SafetensorsFile& f : info.files)
    for (const SafetensorInfo& t : f.tensors())
      if (split_tensor_name(t.name, k, param, first) && k == kind) return true;
  return false;
}

const std::string* checkpoint_metadata(const CheckpointInfo& info, const std::string& key,
                                       const SafetensorsFile** file) {
  for (const SafetensorsFile& f : info.files) {
    const auto it = f.metadata().find(key);
    if (it == f.metadata().end()) continue;
    if (file) *file = &f;
    return &it->second;
  }
  return nullptr;
}

void load_checkpoint_fields(const CheckpointInfo& info, const ParamTable& table, const std::vector<std::string>& kinds,
                            const ParamFieldsSink& sink) {
  // Every record of the checkpoint, by field and parameter: its file, first local element, length and shard layout.
  struct Record {
    const SafetensorsFile* file;
    const SafetensorInfo* tensor;
    int64_t first, n;
    ParamSpec spec;
  };
  const size_t nk = kinds.size();
  std::vector<std::map<std::string, std::vector<Record>>> records(nk);
  for (const SafetensorsFile& f : info.files)
    for (const SafetensorInfo& t : f.tensors()) {
      std::string kind, name;
      int64_t first = 0;
      if (!split_tensor_name(t.name, kind, name, first)) continue;
      const size_t k = size_t(std::find(kinds.begin(), kinds.end(), kind) - kinds.begin());
      if (k == nk) continue;
      const auto desc = f.metadata().find(name);
      if (desc == f.metadata().end()) input_error("checkpoint file {}: no shard layout for {}", f.path(), name);
      Record r{&f, &t, first, SafetensorsFile::numel(t), parse_descriptor(f.path(), name, desc->second)};
      if (t.dtype != "F32") input_error("checkpoint file {}: {} is not F32", f.path(), t.name);
      if (r.first < 0 || r.first + r.n > r.spec.numel())
        input_error("checkpoint file {}: {} lies outside the parameter's shard", f.path(), t.name);
      records[k][name].push_back(r);
    }

  // Per parameter: its full tensors assembled from every record, then this table's shard taken from them. The
  // buffers only grow (fresh pages cost more than the copies on a VM).
  std::vector<std::vector<float>> whole(nk), local(nk);
  std::vector<const float*> values(nk);
  std::vector<uint8_t> have;
  for (int p = 0; p < table.size(); ++p) {
    const ParamSpec& s = table[p];
    const int64_t full = s.full_numel();
    for (size_t k = 0; k < nk; ++k) {
      const auto it = records[k].find(s.name);
      if (it == records[k].end()) input_error("checkpoint {} has no {} values for {}", info.dir, kinds[k], s.name);
      if (int64_t(whole[k].size()) < full) whole[k].resize(full);
      have.assign(full, 0);
      for (const Record& r : it->second) {
        if (r.spec.full_shape != s.full_shape)
          input_error("checkpoint file {}: {} has shape {} there, {} in this model", r.file->path(), s.name,
                      r.spec.full_shape.str(), s.full_shape.str());
        const unsigned char* src = r.file->data(*r.tensor);
        for_each_span(r.spec, r.first, r.n, [&](int64_t l, int64_t g, int64_t count) {
          std::memcpy(whole[k].data() + g, src + sizeof(float) * (l - r.first), sizeof(float) * count);
          std::memset(have.data() + g, 1, count);
        });
      }
      local[k].assign(s.numel(), 0.f);  // vocabulary padding stays 0
      for_each_span(s, 0, s.numel(), [&](int64_t l, int64_t g, int64_t count) {
        if (std::find(have.begin() + g, have.begin() + g + count, 0) != have.begin() + g + count)
          input_error("checkpoint {} lacks {} elements of {}", info.dir, kinds[k], s.name);
        std::memcpy(local[k].data() + l, whole[k].data() + g, sizeof(float) * count);
      });
      values[k] = local[k].data();
    }
    sink(p, values);
  }
}

void load_checkpoint(const CheckpointInfo& info, const ParamTable& table, const ParamStateSink& sink) {
  load_checkpoint_fields(info, table, {kMasterKind, kExpAvgKind, kExpAvgSqKind},
                         [&](int p, const std::vector<const float*>& v) { sink(p, v[0], v[1], v[2]); });
}

void export_checkpoint(const std::string& dir, const std::string& out_dir, const Config& cfg) {
  const CheckpointInfo info = read_checkpoint(dir, cfg);
  const GPTConfig g = gpt_config(cfg.model);
  const ParamTable whole = gpt_param_table(g);  // one rank, the whole model
  Tensor master = Tensor::zeros({whole.total_numel()}, DType::F32);
  load_checkpoint(info, whole, [&](int p, const float* w, const float*, const float*) {
    std::memcpy(master.data_as<float>() + whole[p].offset, w, sizeof(float) * whole[p].numel());
  });
  std::vector<std::vector<float>> tensors = assemble_full(whole, {master.data_as<float>()});
  fs::create_directories(out_dir);
  write_full_safetensors(out_dir + "/model.safetensors", whole, tensors);
  write_hf_config(out_dir + "/config.json", g);
  spdlog::info("exported {} (step {}, written on {}) to {}/model.safetensors and config.json", dir,
               info.state.step, info.mesh, out_dir);
}

}  // namespace mt
