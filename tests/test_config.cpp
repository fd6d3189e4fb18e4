// Tests of the typed config: defaults, the shipped configs, every kind of bad input (type AND message), override
// precedence, dp resolution, the to_yaml round trip, --help coverage and command-line parsing.
#include <unistd.h>

#include <csignal>
#include <yaml-cpp/yaml.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "core/errors.h"
#include "kernels/cpu/onednn_gemm.h"
#include "train/cli.h"
#include "train/config.h"
#include "train/link_schedule.h"
#include "train/resume.h"
#include "train/stop_signal.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace mt;
using Catch::Matchers::Contains;

namespace {

// A fresh directory per test process for temporary YAML files, removed when the process exits.
const fs::path& temp_dir() {
  static const fs::path dir = test::scratch_dir("config");
  return dir;
}

std::string write_yaml(const std::string& name, const std::string& text) {
  fs::path p = temp_dir() / name;
  std::ofstream(p) << text;
  return p.string();
}

std::string source_file(const std::string& rel) { return std::string(MESHTRAIN_SOURCE_DIR) + "/" + rel; }

// Runs f, requires an InputError, returns its message.
std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected InputError, got another exception: " << e.what());
  }
  FAIL("expected InputError, nothing was thrown");
  return "";
}

std::string load_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  std::string path = write_yaml("bad.yaml", yaml);
  return input_error_of([&] { load_config(path, overrides); });
}

// validate() error for a default config changed by `overrides`, on `world` ranks.
std::string validate_error(const std::vector<std::string>& overrides, int world = 1) {
  return input_error_of([&] {
    Config c;
    for (const auto& o : overrides) apply_override(c, o);
    validate(c, world);
  });
}

void collect_keys(const YAML::Node& n, const std::string& prefix, std::vector<std::string>& out) {
  for (const auto& kv : n) {
    std::string k = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    if (kv.second.IsMap()) collect_keys(kv.second, k, out);
    else out.push_back(k);
  }
}

}  // namespace

TEST_CASE("defaults are the documented ones and validate on one rank") {
  Config c;
  CHECK(c.model.init_std == 0.02);
  CHECK(c.parallel.dp == 0);
  CHECK(c.parallel.tp == 1);
  CHECK(c.parallel.pp == 1);
  CHECK(c.parallel.order == "tp-dp-pp");
  CHECK(c.train.seed == 1234);
  CHECK(c.train.grad_clip == 1.0);
  CHECK(c.optim.weight_decay == 0.1);
  CHECK(c.optim.beta1 == 0.9);
  CHECK(c.optim.beta2 == 0.95);
  CHECK(c.optim.eps == 1e-8);
  CHECK(c.comm.bucket_mb == 25);
  CHECK(c.comm.overlap == true);
  CHECK(c.comm.timeout_s == 300);
  CHECK(c.run.log_every == 1);
  CHECK(c.run.resume == "auto");
  CHECK(c.device == Device::CPU);
  CHECK_NOTHROW(validate(c, 1));
}

TEST_CASE("configs/gpt.yaml loads with the documented values") {
  Config c = load_config(source_file("configs/gpt.yaml"), {});
  CHECK(c.model.n_layer == 4);
  CHECK(c.model.n_head == 4);
  CHECK(c.model.d_model == 128);
  CHECK(c.model.seq_len == 64);
  CHECK(c.model.vocab_size == 256);
  CHECK(c.train.global_batch == 16);
  CHECK(c.train.micro_batch == 8);
  CHECK(c.train.steps == 500);
  CHECK(c.train.seed == 1234);
  CHECK(c.train.grad_clip == 1.0);
  CHECK(c.optim.lr == 3e-3);
  CHECK(c.optim.min_lr == 3e-4);
  CHECK(c.optim.warmup_steps == 20);
  CHECK(c.optim.schedule == LRDecay::Cosine);
  CHECK(c.optim.weight_decay == 0.1);
  CHECK(c.precision.compute == DType::F32);
  CHECK(c.data.source == DataSource::Synthetic);
  CHECK(c.run.log_every == 10);
  CHECK(c.run.dir == "runs/gpt");
  CHECK(c.source_path == source_file("configs/gpt.yaml"));
  CHECK_NOTHROW(validate(c, 1));
  CHECK_NOTHROW(validate(c, 2));  // dp=2, micro_batch 8: one micro-batch per step
  CHECK_THROWS_AS(validate(c, 4), InputError);  // 16 % (4*8) != 0
}

TEST_CASE("configs/tiny.yaml loads with the documented values") {
  Config c = load_config(source_file("configs/tiny.yaml"), {});
  CHECK(c.model.n_layer == 2);
  CHECK(c.model.n_head == 2);
  CHECK(c.model.d_model == 32);
  CHECK(c.model.seq_len == 16);
  CHECK(c.model.vocab_size == 64);
  CHECK(c.train.global_batch == 4);
  CHECK(c.train.micro_batch == 2);
  CHECK(c.train.steps == 20);
  CHECK(c.run.dir == "runs/tiny");
  CHECK_NOTHROW(validate(c, 1));
  CHECK_NOTHROW(validate(c, 2));
}

TEST_CASE("nested, dotted and empty sections all parse") {
  std::string path = write_yaml("shapes.yaml",
                                "model.n_layer: 6\n"
                                "comm:\n  emulate: {latency_us: 5, bandwidth_gbps: 12.5}\n"
                                "comm.emulate.ranks_per_node: 2\n"
                                "run:\n"
                                "data: {path: 'a b: c.bin', source: tokens}\n");
  Config c = load_config(path, {});
  CHECK(c.model.n_layer == 6);
  CHECK(c.comm.emulate.latency_us == 5);
  CHECK(c.comm.emulate.bandwidth_gbps == 12.5);
  CHECK(c.comm.emulate.ranks_per_node == 2);
  CHECK(c.data.path == "a b: c.bin");
  CHECK(c.run.dir == "runs/shapes");
}

TEST_CASE("scalar rules: integers, numbers, booleans, strings") {
  std::string path = write_yaml("scalars.yaml",
                                "optim: {lr: 3e-4, min_lr: 0, warmup_steps: -0, eps: 1.5E-7}\n"
                                "comm: {overlap: false, bucket_mb: 4}\n"
                                "run: {profile: yes}\n"
                                "train: {seed: 18446744073709551615}\n"
                                "data: {synthetic_tokens: 5000000000}\n");
  Config c = load_config(path, {});
  CHECK(c.optim.lr == 3e-4);
  CHECK(c.optim.min_lr == 0.0);
  CHECK(c.optim.eps == 1.5e-7);
  CHECK(c.comm.overlap == false);
  CHECK(c.comm.bucket_mb == 4.0);
  CHECK(c.run.profile == true);
  CHECK(c.train.seed == 18446744073709551615ull);
  CHECK(c.data.synthetic_tokens == 5000000000ll);
}

TEST_CASE("unknown keys name the full key, the file and the nearest known key") {
  std::string msg = load_error("model:\n  n_layers: 4\n");
  CHECK_THAT(msg, Contains("unknown key 'model.n_layers'"));
  CHECK_THAT(msg, Contains("bad.yaml"));
  CHECK_THAT(msg, Contains("did you mean 'model.n_layer'?"));

  msg = load_error("comm:\n  emulate:\n    latency: 4\n");
  CHECK_THAT(msg, Contains("'comm.emulate.latency'"));
  CHECK_THAT(msg, Contains("did you mean 'comm.emulate.latency_us'?"));

  msg = load_error("modle:\n  n_layer: 4\n");
  CHECK_THAT(msg, Contains("unknown key 'modle'"));
  CHECK_THAT(msg, Contains("did you mean 'model'?"));

  msg = load_error("devise: cpu\n");
  CHECK_THAT(msg, Contains("did you mean 'device'?"));

  msg = load_error("model: {n_layer: 4}\n", {"optim.learning_rate=1"});
  CHECK_THAT(msg, Contains("unknown key 'optim.learning_rate'"));
  CHECK_THAT(msg, Contains("--set optim.learning_rate=1"));
  CHECK_THAT(msg, Contains("did you mean 'optim.lr'?"));  // by meaning: by spelling it is optim.min_lr

  msg = load_error("train:\n  batch_size: 8\n");
  CHECK_THAT(msg, Contains("did you mean 'train.global_batch'?"));
  msg = load_error("model:\n  Hidden_Size: 64\n");
  CHECK_THAT(msg, Contains("did you mean 'model.d_model'?"));
  // Every synonym names a key that exists.
  const std::vector<std::string> keys = config_keys();
  for (const auto& [name, key] : config_key_synonyms()) {
    INFO(name << " -> " << key);
    CHECK(std::find(keys.begin(), keys.end(), key) != keys.end());
  }
}

TEST_CASE("a section where a scalar is expected, and the reverse, are errors") {
  std::string msg = load_error("model: 4\n");
  CHECK_THAT(msg, Contains("model is a section"));
  CHECK_THAT(msg, Contains("n_layer"));

  msg = load_error("model:\n  n_layer: {a: 1}\n");
  CHECK_THAT(msg, Contains("model.n_layer: expected an integer, got a section"));

  msg = load_error("data:\n  path: [a, b]\n");
  CHECK_THAT(msg, Contains("data.path: expected a string, got a list"));

  msg = input_error_of([] {
    Config c;
    apply_override(c, "comm.emulate=3");
  });
  CHECK_THAT(msg, Contains("'comm.emulate' is a section"));
}

TEST_CASE("wrong types name the key, the value and the expected type") {
  std::string msg = load_error("model:\n  n_layer: four\n");
  CHECK_THAT(msg, Contains("model.n_layer: expected an integer, got 'four'"));
  CHECK_THAT(msg, Contains("line 2"));

  CHECK_THAT(load_error("model: {n_layer: 3.5}\n"), Contains("model.n_layer: expected an integer, got '3.5'"));
  CHECK_THAT(load_error("model: {n_layer: 1e3}\n"), Contains("got '1e3'"));
  CHECK_THAT(load_error("model: {n_layer: 3000000000}\n"), Contains("out of the 32-bit integer range"));
  CHECK_THAT(load_error("model: {n_layer: -3000000000}\n"), Contains("model.n_layer"));
  CHECK_THAT(load_error("model: {n_layer: }\n"), Contains("model.n_layer: expected an integer, got nothing"));
  CHECK_THAT(load_error("train: {seed: -1}\n"), Contains("train.seed"));
  CHECK_THAT(load_error("optim: {lr: fast}\n"), Contains("optim.lr: expected a number, got 'fast'"));
  CHECK_THAT(load_error("optim: {lr: .inf}\n"), Contains("optim.lr"));
  CHECK_THAT(load_error("comm: {overlap: maybe}\n"), Contains("comm.overlap: expected a boolean"));
  CHECK_THAT(load_error("comm: {overlap: 1}\n"), Contains("got '1'"));
}

TEST_CASE("file problems name the file") {
  std::string missing = (temp_dir() / "nope.yaml").string();
  CHECK_THAT(input_error_of([&] { load_config(missing, {}); }), Contains(missing));
  CHECK_THAT(input_error_of([&] { load_config(temp_dir().string(), {}); }), Contains("is a directory"));

  std::string msg = load_error("model:\n  n_layer: [4\n");
  CHECK_THAT(msg, Contains("bad.yaml"));
  CHECK_THAT(msg, Contains("not valid YAML"));
  CHECK_THAT(msg, Contains("line"));
  CHECK_THAT(msg, Contains("column"));

  CHECK_THAT(load_error("- a\n- b\n"), Contains("the top level must be a map"));
  CHECK_THAT(load_error("just a string\n"), Contains("the top level must be a map"));
  CHECK_THAT(load_error("# only a comment\n"), Contains("bad.yaml"));

  if (::geteuid() != 0) {  // root reads anything, so the permission check cannot fail there
    std::string path = write_yaml("unreadable.yaml", "model: {n_layer: 2}\n");
    fs::permissions(path, fs::perms::none);
    CHECK_THAT(input_error_of([&] { load_config(path, {}); }), Contains("cannot read config file"));
    fs::permissions(path, fs::perms::owner_all);
  }
}

TEST_CASE("overrides apply after the file, in order, with YAML scalar rules") {
  std::string path = write_yaml("over.yaml", "optim: {lr: 1e-3, min_lr: 1e-5}\ncomm: {overlap: true}\n");
  Config c = load_config(path, {"optim.lr=3e-4", "comm.overlap=false", "parallel.tp=2", "parallel.tp=4",
                                "run.dir='my runs/x'", "data.val_path=", "precision.loss_scale=1024"});
  CHECK(c.optim.lr == 3e-4);
  CHECK(c.optim.min_lr == 1e-5);
  CHECK(c.comm.overlap == false);
  CHECK(c.parallel.tp == 4);  // the last one wins
  CHECK(c.run.dir == "my runs/x");
  CHECK(c.data.val_path.empty());
  CHECK(c.precision.loss_scale == "1024");

  CHECK_THAT(load_error("model: {}\n", {"model.n_layer=four"}),
             Contains("model.n_layer: expected an integer, got 'four'"));
  CHECK_THAT(load_error("model: {}\n", {"model.n_layer"}), Contains("--set expects KEY=VALUE"));
  CHECK_THAT(load_error("model: {}\n", {"=3"}), Contains("--set expects KEY=VALUE"));
  CHECK_THAT(load_error("model: {}\n", {"model.n_layer=[1"}), Contains("model.n_layer"));
  // Overrides are validated with the file: a bad value from --set is caught by load_config.
  CHECK_THAT(load_error("model: {}\n", {"optim.lr=0"}), Contains("optim.lr must be > 0"));
}

TEST_CASE("run.dir defaults to runs/<config stem> unless given") {
  CHECK(load_config(write_yaml("my_exp.v2.yaml", "model: {}\n"), {}).run.dir == "runs/my_exp.v2");
  CHECK(load_config(write_yaml("d.yaml", "run: {dir: out/here}\n"), {}).run.dir == "out/here");
  CHECK(load_config(write_yaml("d.yaml", "model: {}\n"), {"run.dir=elsewhere"}).run.dir == "elsewhere");
}

TEST_CASE("dp=0 resolves to world/(tp*pp)") {
  Config c;
  c.parallel.tp = 2;
  c.parallel.pp = 2;
  CHECK(resolved_dp(c, 4) == 1);
  CHECK(resolved_dp(c, 8) == 2);
  CHECK_THAT(input_error_of([&] { resolved_dp(c, 6); }), Contains("tp*pp=2*2=4 does not divide the 6 ranks"));
  c.parallel.dp = 3;
  CHECK(resolved_dp(c, 8) == 3);  // explicit dp is returned as given; validate checks the product
  CHECK_THAT(input_error_of([&] { validate(c, 8); }), Contains("dp*tp*pp=3*2*2=12"));
  CHECK_THAT(input_error_of([&] { validate(c, 8); }), Contains("(8)"));

  Config d;
  d.train.global_batch = 16;
  d.train.micro_batch = 2;
  CHECK_NOTHROW(validate(d, 8));  // dp=8: one micro-batch of 2 per rank
  CHECK_THROWS_AS(validate(d, 3), InputError);
}

TEST_CASE("validate names the numbers that disagree") {
  for (const char* k : {"train.steps", "model.seq_len", "model.n_layer", "model.n_head", "model.d_model",
                        "model.vocab_size", "train.global_batch", "train.micro_batch"}) {
    CHECK_THAT(validate_error({std::string(k) + "=0"}), Contains(std::string(k) + " must be > 0, got 0"));
    CHECK_THAT(validate_error({std::string(k) + "=-3"}), Contains(k));
  }
  CHECK_THAT(validate_error({"optim.lr=0"}), Contains("optim.lr must be > 0"));
  CHECK_THAT(validate_error({"optim.min_lr=-1e-5"}), Contains("optim.min_lr must be >= 0"));
  CHECK_THAT(validate_error({"optim.lr=1e-3", "optim.min_lr=1e-2"}), Contains("optim.min_lr=0.01 is larger than optim.lr=0.001"));
  CHECK_THAT(validate_error({"optim.warmup_steps=-1"}), Contains("optim.warmup_steps"));
  CHECK_THAT(validate_error({"model.d_model=100", "model.n_head=3"}),
             Contains("model.d_model=100 is not divisible by model.n_head=3"));
  CHECK_THAT(validate_error({"train.global_batch=10", "train.micro_batch=1"}, 4),
             Contains("train.global_batch=10 is not divisible by dp*micro_batch=4*1=4"));
  CHECK_THAT(validate_error({"parallel.dp=2"}, 3), Contains("dp*tp*pp=2*1*1=2 does not equal the number of ranks (3)"));
  CHECK_THAT(validate_error({"parallel.tp=3", "model.n_head=4", "model.d_model=96"}, 3),
             Contains("model.n_head=4 is not divisible by parallel.tp=3"));
  // n_head % tp == 0 implies the MLP width divides, so the MLP check answers (first) only when both fail.
  CHECK_THAT(validate_error({"parallel.tp=3", "model.n_head=4", "model.d_model=128"}, 3),
             Contains("the MLP width 4*model.d_model=4*128=512 is not divisible by parallel.tp=3"));
  CHECK_THAT(validate_error({"parallel.pp=3", "model.n_layer=4"}, 3),
             Contains("model.n_layer=4 is not divisible by parallel.pp*virtual_stages=3*1=3"));
  CHECK_THAT(validate_error({"parallel.pp=2", "parallel.virtual_stages=3", "parallel.schedule=interleaved",
                             "model.n_layer=8"}, 2),
             Contains("model.n_layer=8 is not divisible by parallel.pp*virtual_stages=2*3=6"));
  CHECK_THAT(validate_error({"parallel.virtual_stages=2"}), Contains("needs parallel.schedule=interleaved"));

  CHECK_THAT(validate_error({"precision.compute=fp8"}), Contains("precision.compute='fp8' is not one of: fp32, bf16, fp16"));
  CHECK_THAT(validate_error({"precision.grad_reduce=fp16"}), Contains("fp32, bf16"));
  CHECK_THAT(validate_error({"precision.loss_scale=big"}), Contains("precision.loss_scale='big'"));
  CHECK_THAT(validate_error({"precision.loss_scale=-4"}), Contains("positive number"));
  CHECK_THAT(validate_error({"device=tpu"}), Contains("device='tpu' is not one of: cpu, cuda"));
  CHECK_THAT(validate_error({"parallel.schedule=1f2b"}), Contains("1f1b, gpipe, interleaved, zb1"));
  CHECK_THAT(validate_error({"optim.schedule=step"}), Contains("cosine, linear, constant"));
  CHECK_THAT(validate_error({"data.source=web"}), Contains("synthetic, tokens, text"));
  CHECK_THAT(validate_error({"data.order=random"}), Contains("sequential, shuffle"));
  CHECK_THAT(validate_error({"comm.backend=gloo"}), Contains("auto, shm, mpi, nccl"));
  CHECK_THAT(validate_error({"comm.backend=nccl"}), Contains("needs device=cuda"));
  CHECK_THAT(validate_error({"device=cuda", "comm.backend=shm"}), Contains("host tensors only"));
  // What the GPU cannot run is refused by name rather than run wrongly.
  CHECK_THAT(validate_error({"device=cuda", "comm.hierarchical=true", "comm.backend=nccl"}),
             Contains("comm.hierarchical with comm.backend=nccl is not available"));
  Config gpu_ok;  // checkpoints and resuming run on the GPU (state downloaded and uploaded)
  for (const char* o : {"device=cuda", "comm.compress=bf16", "comm.backend=nccl", "optim.zero=1",
                        "run.checkpoint_every=10", "run.resume=ckpt/step_10"})
    apply_override(gpu_ok, o);
  CHECK_NOTHROW(validate(gpu_ok, 1));
  Config gpu_local;  // local SGD, with its outer Nesterov step, on the GPU
  for (const char* o :
       {"device=cuda", "optim.sync_every=4", "optim.outer=nesterov", "parallel.dp=2", "train.micro_batch=4"})
    apply_override(gpu_local, o);
  CHECK_NOTHROW(validate(gpu_local, 2));
  for (const char* m : {"int8", "topk", "powersgd"}) {  // the compressors, on host copies of GPU gradients
    Config gpu_compress;
    for (const std::string& o : {std::string("device=cuda"), std::string("train.micro_batch=4"), std::string("comm.compress=") + m})
      apply_override(gpu_compress, o);
    CHECK_NOTHROW(validate(gpu_compress, 2));
  }
  for (const char* order : {"tp-dp", "tp-dp-dp", "tp-dp-pp-", "tp,dp,pp", "dp-pp-xx"})
    CHECK_THAT(validate_error({std::string("parallel.order=") + order}), Contains("parallel.order"));
  for (const char* order : {"tp-dp-pp", "pp-dp-tp", "dp-tp-pp"}) {
    Config c;
    c.parallel.order = order;
    CHECK_NOTHROW(validate(c, 1));
  }
  CHECK_THAT(validate_error({"data.source=tokens"}), Contains("data.source=tokens needs data.path"));
  CHECK_THAT(validate_error({"data.source=text"}), Contains("data.path"));
  CHECK_THAT(validate_error({"optim.beta1=1"}), Contains("optim.beta1 must be in [0, 1)"));
  CHECK_THAT(validate_error({"optim.beta2=-0.1"}), Contains("optim.beta2"));
  CHECK_THAT(validate_error({"optim.eps=0"}), Contains("optim.eps must be > 0"));
  CHECK_THAT(validate_error({"optim.weight_decay=-1"}), Contains("optim.weight_decay"));
  CHECK_THAT(validate_error({"train.grad_clip=-1"}), Contains("train.grad_clip"));
  CHECK_THAT(validate_error({"run.log_every=0"}), Contains("run.log_every must be >= 1"));
  CHECK_THAT(validate_error({"comm.bucket_mb=0"}), Contains("comm.bucket_mb must be > 0"));
  CHECK_THAT(validate_error({"model.init_std=0"}), Contains("model.init_std must be > 0"));
  CHECK_THAT(validate_error({"optim.zero=4"}), Contains("optim.zero must be 0, 1, 2 or 3"));
  CHECK_THAT(validate_error({"optim.zero=-1"}), Contains("optim.zero must be 0, 1, 2 or 3"));
  CHECK_THAT(validate_error({"optim.zero=3", "optim.zero_reduce=step"}),
             Contains("optim.zero_reduce=step needs optim.zero=2") && Contains("optim.zero=3"));
  for (const char* rc : {"train.recompute=light", "train.recompute=full"})
    CHECK_THAT(validate_error({"optim.zero=3", "optim.zero_unit=sublayer", rc}),
               Contains("optim.zero_unit=sublayer") && Contains(rc) && Contains("optim.zero=3"));
  CHECK_THAT(validate_error({"optim.zero=3", "optim.zero_unit=sublayer", "parallel.pp=2", "parallel.schedule=zb1"}, 2),
             Contains("optim.zero_unit=sublayer") && Contains("parallel.schedule=zb1") && Contains("optim.zero=3"));
  CHECK_THAT(validate_error({"train.threads=-1"}), Contains("train.threads"));
  CHECK_THAT(validate_error({"data.val_fraction=1"}), Contains("data.val_fraction must be in [0, 1)"));
  CHECK_THAT(validate_error({"parallel.tp=0"}), Contains("parallel.tp must be >= 1"));
  CHECK_THAT(validate_error({"run.resume="}), Contains("run.resume"));
  CHECK_THAT(validate_error({"data.synthetic_tokens=10"}), Contains("data.synthetic_tokens=10"));
  CHECK_THAT(validate_error({"optim.name=lion"}), Contains("optim.name"));
  CHECK_THAT(validate_error({"optim.sync_every=-1"}), Contains("optim.sync_every must be >= 0"));
  CHECK_THAT(validate_error({"optim.outer=adam"}), Contains("optim.outer"));
  CHECK_THAT(validate_error({"optim.outer_lr=0"}), Contains("optim.outer_lr must be > 0"));
  CHECK_THAT(validate_error({"optim.momentum=1"}), Contains("optim.momentum must be in [0, 1)"));
  CHECK_THAT(validate_error({"optim.sync_every=2", "optim.zero=1"}), Contains("needs optim.zero=0"));
  CHECK_THAT(validate_error({"optim.sync_every=2", "comm.compress=int8"}), Contains("comm.compress=none"));
  {
    Config local;  // checkpoints under local SGD: written at the averages
    for (const char* o : {"optim.sync_every=2", "run.checkpoint_every=5", "train.micro_batch=4"})
      apply_override(local, o);
    CHECK_NOTHROW(validate(local, 2));
  }
  CHECK_THAT(validate_error({"comm.compress=fp8"}), Contains("comm.compress"));
  CHECK_THAT(validate_error({"comm.topk_fraction=0"}), Contains("comm.topk_fraction must be in (0, 1]"));
  CHECK_THAT(validate_error({"comm.powersgd_rank=0"}), Contains("comm.powersgd_rank must be >= 1"));
  CHECK_THAT(validate_error({"comm.compress=topk", "optim.zero=1"}), Contains("needs optim.zero=0"));
  CHECK_THAT(validate_error({"comm.compress=int8", "precision.grad_reduce=bf16"}),
             Contains("needs precision.grad_reduce=fp32"));
  // comm.adapt: limits that contradict each other, and what it cannot adapt.
  CHECK_THAT(validate_error({"comm.adapt=true", "comm.adapt_bucket_mb_min=8", "comm.adapt_bucket_mb_max=2"}, 2),
             Contains("comm.adapt_bucket_mb_min=8 is larger than comm.adapt_bucket_mb_max=2"));
  CHECK_THAT(validate_error({"comm.adapt_compress=none,fp8"}), Contains("comm.adapt_compress: 'fp8' is not"));
  CHECK_THAT(validate_error({"comm.compress=int8", "comm.adapt_compress=none,bf16"}),
             Contains("leaves out comm.compress=int8"));
  CHECK_THAT(validate_error({"comm.adapt=true", "optim.zero=1"}, 2), Contains("set optim.zero=0"));
  CHECK_THAT(validate_error({"comm.adapt=true", "comm.overlap=false"}, 2), Contains("set comm.overlap=true"));
  CHECK_THAT(validate_error({"comm.adapt=true"}, 1), Contains("comm.adapt needs data parallelism"));
  CHECK_THAT(validate_error({"comm.adapt=true", "comm.adapt_every=0"}, 2), Contains("comm.adapt_every must be >= 1"));
  // Llama's kv heads over tp: one count must divide the other.
  CHECK_THAT(validate_error({"model.arch=llama", "model.d_model=48", "model.n_head=6", "model.n_kv_head=3",
                             "parallel.tp=2"}, 2),
             Contains("model.n_kv_head=3 and parallel.tp=2: one must divide the other"));
  // Under local SGD it adapts the period: limits that contradict each other or the period the run starts from.
  CHECK_THAT(validate_error({"comm.adapt_sync_every_min=0"}), Contains("comm.adapt_sync_every_min must be >= 1"));
  CHECK_THAT(validate_error({"comm.adapt_sync_every_min=8", "comm.adapt_sync_every_max=4"}),
             Contains("comm.adapt_sync_every_min=8 is larger than comm.adapt_sync_every_max=4"));
  CHECK_THAT(validate_error({"comm.adapt=true", "optim.sync_every=20", "comm.adapt_sync_every_max=16"}, 2),
             Contains("leave out optim.sync_every=20"));
  {
    Config local;  // no buckets to overlap: comm.overlap does not matter
    for (const char* a : {"comm.adapt=true", "optim.sync_every=2", "comm.overlap=false", "train.global_batch=16"})
      apply_override(local, a);
    CHECK_NOTHROW(validate(local, 2));
  }
  // A link that changes during the run.
  CHECK_THAT(validate_error({"comm.emulate.schedule=10:5:1"}), Contains("needs an emulated link"));
  CHECK_THAT(validate_error({"comm.emulate.latency_us=5", "comm.emulate.schedule=10:5"}),
             Contains("'10:5' is not STEP:LATENCY_US:BANDWIDTH_GBPS"));
  CHECK_THAT(validate_error({"comm.emulate.latency_us=5", "comm.emulate.schedule='10:5:1, 10:2:1'"}),
             Contains("step 10 follows step 10"));
  CHECK_THAT(validate_error({"comm.emulate.latency_us=5", "comm.emulate.schedule=0:5:1"}),
             Contains("the step must be >= 1"));
  CHECK_THAT(validate_error({"comm.emulate.latency_us=5", "comm.emulate.schedule=3:-5:1"}),
             Contains("the step must be >= 1, latency and bandwidth >= 0"));
  {
    const std::vector<LinkChange> s = parse_link_schedule(" 200:50:0.1, 400:20:1 ");
    REQUIRE(s.size() == 2);
    CHECK((s[0].step == 200 && s[0].latency_us == 50 && s[0].bandwidth_gbps == 0.1));
    CHECK((s[1].step == 400 && s[1].latency_us == 20 && s[1].bandwidth_gbps == 1));
    CHECK(parse_link_schedule("").empty());
  }
  // Stragglers and staleness (docs/staleness.md).
  CHECK_THAT(validate_error({"train.straggler.slowdown=0.5"}), Contains("train.straggler.slowdown must be >= 1"));
  CHECK_THAT(validate_error({"train.straggler.delay_ms=-1"}), Contains("train.straggler.delay_ms must be >= 0"));
  CHECK_THAT(validate_error({"train.straggler.delay_sigma=4"}), Contains("train.straggler.delay_sigma"));
  CHECK_THAT(validate_error({"train.straggler.ranks=[-1]"}), Contains("train.straggler.ranks: rank -1 is negative"));
  CHECK_THAT(validate_error({"train.straggler.ranks=[1, 1]"}), Contains("rank 1 is listed twice"));
  CHECK_THAT(validate_error({"train.straggler.ranks=[4]"}, 4), Contains("train.straggler.ranks: rank 4 is outside"));
  {
    Config ok;
    apply_override(ok, "train.straggler.ranks=[3]");
    apply_override(ok, "train.micro_batch=2");
    CHECK_NOTHROW(validate(ok, 4));
  }
  CHECK_THAT(validate_error({"optim.staleness=-1"}), Contains("optim.staleness must be >= 0"));
  CHECK_THAT(validate_error({"optim.staleness_policy=oldest"}), Contains("optim.staleness_policy"));
  CHECK_THAT(validate_error({"optim.staleness=2", "optim.zero=1"}), Contains("needs optim.zero=0"));
  CHECK_THAT(validate_error({"optim.staleness=2", "parallel.tp=2"}, 2), Contains("data parallelism only"));
  CHECK_THAT(validate_error({"optim.staleness=2", "parallel.pp=2"}, 2), Contains("data parallelism only"));
  CHECK_THAT(validate_error({"optim.staleness=2", "optim.sync_every=4"}), Contains("choose one"));
  CHECK_THAT(validate_error({"optim.staleness=2", "comm.compress=int8"}), Contains("comm.compress=none"));
  CHECK_THAT(validate_error({"optim.staleness=2", "precision.compute=fp16"}), Contains("use bf16 or fp32"));
  CHECK_THAT(validate_error({"optim.staleness=2", "device=cuda"}), Contains("device=cpu only"));

  // Accepted values.
  for (const char* ok : {"run.resume=none", "run.resume=auto", "run.resume=runs/x/checkpoints/step_00000010",
                         "precision.loss_scale=65536", "precision.loss_scale=2.5e4", "precision.loss_scale=dynamic", "precision.compute=bf16",
                         "data.val_fraction=0", "optim.zero=1", "optim.min_lr=0", "train.grad_clip=0",
                         "comm.compress=bf16", "optim.sync_every=1", "optim.name=sgd", "optim.staleness=3",
                         "optim.staleness_policy=fixed", "train.straggler.slowdown=2",
                         "train.straggler.delay_sigma=3"}) {
    Config c;
    apply_override(c, ok);
    CHECK_NOTHROW(validate(c, 1));
  }
}

TEST_CASE("to_yaml round-trips every key") {
  Config c;
  // A non-default value for every kind of field, including strings that need quoting.
  const std::vector<std::string> changes = {
      "model.n_layer=12", "model.n_head=6", "model.d_model=96", "model.seq_len=33", "model.vocab_size=50257",
      "model.init_std=0.0123456789012345", "model.init_from='w: #1.safetensors'", "parallel.dp=2", "parallel.tp=3",
      "parallel.pp=2", "parallel.sequence_parallel=true", "parallel.order=pp-tp-dp", "parallel.schedule=interleaved", "parallel.virtual_stages=3",
      "parallel.reshard_after_forward=false",
      "parallel.stage_layers=[1, 2, 3, 1, 4, 1]",
      "train.global_batch=24", "train.micro_batch=3", "train.steps=7", "train.seed=18446744073709551615",
      "train.grad_clip=0", "train.eval_every=5", "train.eval_batches=2", "train.threads=3", "train.pin_threads=false", "train.cpu_matmul=eigen",
      "train.skip_nonfinite=true",
      "train.straggler.ranks=[1, 2]", "train.straggler.slowdown=1.5", "train.straggler.delay_ms=3.5",
      "train.straggler.delay_sigma=0.5", "train.recompute=selective",
      "optim.lr=3e-4",
      "optim.min_lr=1e-300", "optim.warmup_steps=0", "optim.schedule=linear", "optim.weight_decay=0",
      "optim.beta1=0.8", "optim.beta2=0.999", "optim.eps=1e-12", "optim.zero=1", "optim.zero_reduce=step",
      "optim.zero_unit=sublayer", "optim.name=sgd",
      "optim.momentum=0.5", "optim.outer=nesterov", "optim.outer_lr=0.5",
      "optim.outer_momentum=0.8", "precision.compute=bf16",
      "precision.grad_reduce=bf16", "precision.loss_scale=1024", "data.source=tokens", "data.path='true'",
      "data.val_path='123'", "data.order=shuffle", "data.synthetic_tokens=9000000000", "data.val_fraction=0.25",
      "comm.bucket_mb=0.5", "comm.overlap=false", "comm.compress=bf16",
      "comm.topk_fraction=0.05", "comm.powersgd_rank=2", "comm.hierarchical=true", "comm.wait=block",
      "comm.thread_priority=normal", "comm.timeout_s=12.5",
      "comm.emulate.latency_us=2", "comm.emulate.bandwidth_gbps=100", "comm.emulate.ranks_per_node=4",
      "comm.emulate.inter_latency_us=10", "comm.emulate.inter_bandwidth_gbps=12.5",
      "comm.emulate.schedule='5:1.5:20, 9:3:10'", "run.dir=\" lead space\"",
      "run.log_every=3", "run.checkpoint_every=100", "run.keep_checkpoints=7", "run.check_copies_every=9",
      "run.resume=none", "run.profile=true",
      "run.dump_grads=g.safetensors", "run.stop_signals='usr2, SIGHUP'", "run.flight_recorder=false",
      "run.flight_recorder_ops=100"};
  for (const auto& a : changes) apply_override(c, a);
  // Local SGD excludes ZeRO-1 and compression, so its key round-trips in a second config.
  Config local = c;
  for (const char* a : {"optim.sync_every=4", "optim.zero=0", "comm.compress=none", "run.checkpoint_every=0",
                        "comm.adapt_sync_every_min=2", "comm.adapt_sync_every_max=8"})
    apply_override(local, a);
  // device=cuda with comm.backend=nccl excludes comm.hierarchical: a third config.
  Config gpu;
  for (const char* a : {"device=cuda", "comm.backend=nccl", "comm.adapt=true", "comm.adapt_bucket_mb_min=0.5",
                        "comm.adapt_bucket_mb_max=8", "comm.adapt_compress='none, bf16'", "comm.adapt_every=3"})
    apply_override(gpu, a);
  // Llama's keys apply to model.arch=llama only: a fifth config (with context parallelism, which needs model.seq_len
  // divisible by 2 cp).
  Config llama;
  for (const char* a : {"model.arch=llama", "model.n_kv_head=2", "model.ffn_hidden=96", "model.multiple_of=32",
                        "model.norm_eps=1e-6", "model.rope_theta=500000", "model.tie_embeddings=true", "parallel.cp=2"})
    apply_override(llama, a);
  CHECK(load_config(write_yaml("llama.yaml", to_yaml(llama)), {}).model.rope_theta == 500000);
  // Staleness needs a data-parallel-only mesh without ZeRO-1: a fourth config.
  Config stale;
  for (const char* a : {"optim.staleness=2", "optim.staleness_policy=fixed"}) apply_override(stale, a);
  CHECK(load_config(write_yaml("stale.yaml", to_yaml(stale)), {}).optim.staleness == 2);
  CHECK(config_value(load_config(write_yaml("stale2.yaml", to_yaml(stale)), {}), "optim.staleness_policy") == "fixed");
  // Every key is changed from its default, so the round trip below is not passing by accident.
  Config defaults;
  for (const std::string& k : config_keys()) {
    INFO(k);
    CHECK((config_value(c, k) != config_value(defaults, k) || config_value(local, k) != config_value(defaults, k) ||
           config_value(gpu, k) != config_value(defaults, k) || config_value(stale, k) != config_value(defaults, k) ||
           config_value(llama, k) != config_value(defaults, k)));
  }
  CHECK(load_config(write_yaml("local.yaml", to_yaml(local)), {}).optim.sync_every == 4);
  const Config gpu_back = load_config(write_yaml("gpu.yaml", to_yaml(gpu)), {});
  CHECK(gpu_back.device == Device::CUDA);
  CHECK(gpu_back.comm.backend == CommBackend::Nccl);
  CHECK(c.data.path == "true");
  CHECK(c.run.dir == " lead space");

  const std::string yaml = to_yaml(c);
  Config back = load_config(write_yaml("round.yaml", yaml), {});
  for (const std::string& k : config_keys()) {
    INFO(k);
    CHECK(config_value(back, k) == config_value(c, k));
  }
  CHECK(back.optim.lr == c.optim.lr);  // bit-exact doubles
  CHECK(back.model.init_std == c.model.init_std);
  CHECK(back.optim.min_lr == c.optim.min_lr);
  CHECK(back.model.init_from == "w: #1.safetensors");
  CHECK(back.data.val_path == "123");
  CHECK(back.train.seed == 18446744073709551615ull);
  CHECK(back.parallel.stage_layers == std::vector<int>{1, 2, 3, 1, 4, 1});
  CHECK_THAT(yaml, Contains("stage_layers: [1, 2, 3, 1, 4, 1]"));
  CHECK(to_yaml(back) == yaml);

  // to_yaml writes every key exactly once.
  std::vector<std::string> emitted;
  collect_keys(YAML::Load(yaml), "", emitted);
  CHECK(emitted == config_keys());
}

TEST_CASE("every enum key round-trips each of its names, and refuses others naming the key and the choices") {
  // The spellings users' files and scripts rely on; as a number, the field each key sets.
  struct EnumKey {
    std::string key;
    std::vector<std::string> names;
    std::function<int(const Config&)> value;
  };
  const std::vector<EnumKey> keys = {
      {"model.arch", {"gpt2", "llama"}, [](const Config& c) { return int(c.model.arch); }},
      {"parallel.schedule", {"1f1b", "gpipe", "interleaved", "zb1"},
       [](const Config& c) { return int(c.parallel.schedule); }},
      {"parallel.reshard_after_forward", {"auto", "true", "false"},
       [](const Config& c) { return int(c.parallel.reshard_after_forward); }},
      {"train.cpu_matmul", {"auto", "eigen", "onednn"}, [](const Config& c) { return int(c.train.cpu_matmul); }},
      {"train.recompute", {"none", "light", "selective", "full"},
       [](const Config& c) { return int(c.train.recompute); }},
      {"optim.schedule", {"cosine", "linear", "constant"}, [](const Config& c) { return int(c.optim.schedule); }},
      {"optim.zero_reduce", {"micro_batch", "step"}, [](const Config& c) { return int(c.optim.zero_reduce); }},
      {"optim.zero_unit", {"block", "sublayer"}, [](const Config& c) { return int(c.optim.zero_unit); }},
      {"optim.name", {"adamw", "sgd"}, [](const Config& c) { return int(c.optim.name); }},
      {"optim.outer", {"none", "nesterov"}, [](const Config& c) { return int(c.optim.outer); }},
      {"optim.staleness_policy", {"newest", "fixed"}, [](const Config& c) { return int(c.optim.staleness_policy); }},
      {"precision.compute", {"fp32", "bf16", "fp16"}, [](const Config& c) { return int(c.precision.compute); }},
      {"precision.grad_reduce", {"fp32", "bf16"}, [](const Config& c) { return int(c.precision.grad_reduce); }},
      {"data.source", {"synthetic", "tokens", "text"}, [](const Config& c) { return int(c.data.source); }},
      {"data.order", {"sequential", "shuffle"}, [](const Config& c) { return int(c.data.order); }},
      {"comm.backend", {"auto", "shm", "mpi", "nccl"}, [](const Config& c) { return int(c.comm.backend); }},
      {"comm.compress", {"none", "bf16", "int8", "topk", "powersgd"},
       [](const Config& c) { return int(c.comm.compress); }},
      {"comm.wait", {"auto", "poll", "block"}, [](const Config& c) { return int(c.comm.wait); }},
      {"comm.thread_priority", {"auto", "realtime", "normal"},
       [](const Config& c) { return int(c.comm.thread_priority); }},
      {"device", {"cpu", "cuda"}, [](const Config& c) { return int(c.device); }},
  };
  // What some values need besides, so that load_config's validation passes.
  const std::map<std::string, std::vector<std::string>> needs = {
      {"parallel.schedule=interleaved", {"parallel.pp=2"}},
      {"data.source=tokens", {"data.path=t.bin"}},
      {"data.source=text", {"data.path=t.txt"}},
      {"comm.backend=nccl", {"device=cuda"}},
  };
  std::vector<std::string> enum_keys;
  for (const std::string& k : config_keys())
    if (!config_choices(k).empty()) enum_keys.push_back(k);
  std::vector<std::string> listed;
  for (const EnumKey& e : keys) listed.push_back(e.key);
  CHECK(enum_keys == listed);  // every enum key is in the list above, in the table's order
  CHECK(config_choices("parallel.order").empty());

  for (const EnumKey& e : keys) {
    CHECK(config_choices(e.key) == e.names);
    std::set<int> values;
    for (const std::string& name : e.names) {
      const std::string set = e.key + "=" + name;
      INFO(set);
      Config c;
      apply_override(c, set);
      CHECK(config_value(c, e.key) == name);
      values.insert(e.value(c));
      if (needs.count(set))
        for (const std::string& o : needs.at(set)) apply_override(c, o);
      if (set == "train.cpu_matmul=onednn" && !kernels::cpu::onednn::available()) {
        // A build without oneDNN (the GPU machine's, say) parses the name and refuses it at validation.
        CHECK_THAT(load_error(to_yaml(c)), Contains("train.cpu_matmul=onednn: this build has no oneDNN"));
        continue;
      }
      const Config back = load_config(write_yaml("enum.yaml", to_yaml(c)), {});
      CHECK(e.value(back) == e.value(c));
      CHECK(config_value(back, e.key) == name);
    }
    CHECK(values.size() == e.names.size());  // each name its own value

    std::string list;
    for (const std::string& n : e.names) list += (list.empty() ? "" : ", ") + n;
    CHECK_THAT(validate_error({e.key + "=bogus"}), Contains(e.key + "='bogus' is not one of: " + list));
    CHECK_THAT(load_error(e.key + ": Bogus\n"), Contains(e.key + "='Bogus' is not one of: " + list));
  }
  CHECK_THAT(validate_error({"precision.grad_reduce=fp16"}),
             Contains("precision.grad_reduce='fp16' is not one of: fp32, bf16"));
  // A DType the precision keys do not take, set in code, fails validation with the same message.
  Config wide;
  wide.precision.compute = DType::F64;
  CHECK_THAT(input_error_of([&] { validate(wide, 1); }), Contains("precision.compute='fp64' is not one of: fp32"));
  wide = Config{};
  wide.precision.grad_reduce = DType::F16;
  CHECK_THAT(input_error_of([&] { validate(wide, 1); }),
             Contains("precision.grad_reduce='fp16' is not one of: fp32, bf16"));
  // The parse function of an enum (core/enum_names.h) reads the same table.
  PipelineSchedule s = PipelineSchedule::OneFOneB;
  CHECK((parse_name("zb1", s) && s == PipelineSchedule::ZB1));
  CHECK_FALSE(parse_name("ZB1", s));
  CHECK(s == PipelineSchedule::ZB1);  // unchanged by a name the table lacks
  // The names are text, as before: quoted in config.yaml and --help.
  CHECK_THAT(to_yaml(Config{}), Contains("schedule: \"1f1b\""));
  CHECK_THAT(help_text(), Contains("\"cosine\""));
  CHECK_THAT(load_error("parallel: {schedule: [1f1b]}\n"),
             Contains("parallel.schedule: expected a string, got a list"));
}

TEST_CASE("parallel.stage_layers: flow and block lists, --set, and [] or null for the even split") {
  Config c = load_config(write_yaml("flow.yaml", "model: {n_layer: 5}\nparallel: {pp: 2, stage_layers: [3, 2]}\n"), {});
  CHECK(c.parallel.stage_layers == std::vector<int>{3, 2});
  CHECK(config_value(c, "parallel.stage_layers") == "[3, 2]");
  CHECK(config_value(Config{}, "parallel.stage_layers") == "[]");

  c = load_config(
      write_yaml("block.yaml", "model: {n_layer: 5}\nparallel:\n  pp: 2\n  stage_layers:\n    - +2\n    - 3\n"), {});
  CHECK(c.parallel.stage_layers == std::vector<int>{2, 3});

  c = load_config(write_yaml("set.yaml", "parallel: {pp: 2}\n"), {"parallel.stage_layers=[1,3]"});
  CHECK(c.parallel.stage_layers == std::vector<int>{1, 3});
  for (const char* empty : {"parallel.stage_layers=[]", "parallel.stage_layers=", "parallel.stage_layers=null",
                            "parallel.stage_layers=~"}) {
    INFO(empty);
    Config d = c;
    apply_override(d, empty);
    CHECK(d.parallel.stage_layers.empty());
  }
  // A rejected list leaves the previous value alone (no half-applied list).
  CHECK_THROWS_AS(apply_override(c, "parallel.stage_layers=[2, x]"), InputError);
  CHECK(c.parallel.stage_layers == std::vector<int>{1, 3});
}

TEST_CASE("parallel.stage_layers: a non-list or a non-integer entry names the key and the value") {
  auto set_error = [](const std::string& value) {
    return input_error_of([&] {
      Config c;
      apply_override(c, "parallel.stage_layers=" + value);
    });
  };
  CHECK_THAT(set_error("2"), Contains("parallel.stage_layers: expected a list of integers (e.g. [2, 2]), got '2'"));
  CHECK_THAT(set_error("{a: 1}"),
             Contains("parallel.stage_layers: expected a list of integers (e.g. [2, 2]), got a section"));
  CHECK_THAT(set_error("[2, two]"), Contains("got 'two' as entry 2 (--set parallel.stage_layers=[2, two])"));
  CHECK_THAT(set_error("[2.5, 1]"), Contains("got '2.5' as entry 1"));
  CHECK_THAT(set_error("[1e3]"), Contains("got '1e3' as entry 1"));
  CHECK_THAT(set_error("[[1], 2]"), Contains("got a list as entry 1"));
  CHECK_THAT(set_error("[1, ~]"), Contains("got nothing (null) as entry 2"));
  CHECK_THAT(set_error("[3000000000]"), Contains("as entry 1 (out of the 32-bit integer range)"));
  CHECK_THAT(set_error("[1, 2"), Contains("parallel.stage_layers: cannot parse '[1, 2'"));

  std::string msg = load_error("parallel:\n  pp: 2\n  stage_layers:\n    - 2\n    - half\n");
  CHECK_THAT(msg, Contains("parallel.stage_layers: expected a list of integers (e.g. [2, 2]), got 'half' as entry 2"));
  CHECK_THAT(msg, Contains("bad.yaml line 4"));
  CHECK_THAT(load_error("parallel: {stage_layers: 4}\n"),
             Contains("parallel.stage_layers: expected a list of integers"));
}

TEST_CASE("layers_per_stage: even split, explicit split, interleaved chunks") {
  Config c;  // n_layer 4, pp 1
  CHECK(layers_per_stage(c) == std::vector<int>{4});
  c.parallel.pp = 2;
  CHECK(layers_per_stage(c) == std::vector<int>{2, 2});
  c.parallel.stage_layers = {3, 1};
  CHECK(layers_per_stage(c) == std::vector<int>{3, 1});

  // Interleaved: virtual stage s = chunk*pp + rank, so rank 0 holds entries 0 and 2, rank 1 entries 1 and 3.
  Config v;
  v.model.n_layer = 8;
  v.parallel.pp = 2;
  v.parallel.virtual_stages = 2;
  v.parallel.schedule = PipelineSchedule::Interleaved;
  CHECK(layers_per_stage(v) == std::vector<int>{2, 2, 2, 2});
  v.model.n_layer = 6;
  v.parallel.stage_layers = {2, 1, 1, 2};
  CHECK(layers_per_stage(v) == std::vector<int>{2, 1, 1, 2});

  // An invalid split throws the validation message instead of returning a wrong one.
  Config bad;
  bad.model.n_layer = 3;
  bad.parallel.pp = 2;
  CHECK_THAT(input_error_of([&] { layers_per_stage(bad); }), Contains("model.n_layer=3 is not divisible"));
  bad.parallel.stage_layers = {2, 2};
  CHECK_THAT(input_error_of([&] { layers_per_stage(bad); }), Contains("sums to 4 layers, but model.n_layer=3"));
  bad.parallel.pp = 0;
  CHECK_THROWS_AS(layers_per_stage(bad), InputError);  // never a division by zero
}

TEST_CASE("pipeline split and schedule refusals name the keys and the numbers") {
  CHECK_THAT(validate_error({"parallel.pp=2", "model.n_layer=3"}, 2),
             Contains("model.n_layer=3 is not divisible by parallel.pp*virtual_stages=2*1=2 (set "
                      "parallel.stage_layers for an uneven split)"));
  CHECK_THAT(validate_error({"parallel.pp=2", "model.n_layer=4", "parallel.stage_layers=[3, 2]"}, 2),
             Contains("parallel.stage_layers=[3, 2] sums to 5 layers, but model.n_layer=4"));
  CHECK_THAT(validate_error({"parallel.pp=2", "model.n_layer=4", "parallel.stage_layers=[2, 1, 1]"}, 2),
             Contains("parallel.stage_layers=[2, 1, 1] needs one entry per virtual stage, "
                      "parallel.pp*virtual_stages=2*1=2, but has 3"));
  CHECK_THAT(validate_error({"parallel.pp=2", "model.n_layer=4", "parallel.stage_layers=[4, 0]"}, 2),
             Contains("parallel.stage_layers=[4, 0]: entry 2 is 0, but every virtual stage needs at least one"));
  CHECK_THAT(validate_error({"parallel.pp=2", "model.n_layer=4", "parallel.stage_layers=[5, -1]"}, 2),
             Contains("entry 2 is -1"));  // sums to n_layer, so only the entry check can answer
  // pp > n_layer answers before the divisibility and stage_layers checks, with or without stage_layers.
  for (const char* extra : {"parallel.stage_layers=", "parallel.stage_layers=[1, 1, 1, 1, 1, 1, 1, 1]"})
    CHECK_THAT(validate_error({"parallel.pp=8", "model.n_layer=4", extra}, 8),
               Contains("parallel.pp=8 is larger than model.n_layer=4: every pipeline stage needs at least one "
                        "transformer block"));
  CHECK_THAT(validate_error({"parallel.pp=2", "parallel.virtual_stages=3", "parallel.schedule=interleaved",
                             "model.n_layer=4"}, 2),
             Contains("parallel.pp*virtual_stages=2*3=6 virtual stages are more than model.n_layer=4"));
  CHECK_THAT(validate_error({"parallel.schedule=interleaved"}),
             Contains("parallel.schedule=interleaved needs parallel.pp >= 2, got 1"));
  CHECK_THAT(validate_error({"parallel.virtual_stages=2"}), Contains("needs parallel.schedule=interleaved"));

  // Interleaved needs m = global_batch / (dp*micro_batch) to be a multiple of pp; m depends on the rank count.
  const std::vector<std::string> interleaved = {"parallel.pp=2", "parallel.virtual_stages=2",
                                                "parallel.schedule=interleaved", "model.n_layer=4",
                                                "train.micro_batch=2"};
  auto with = [&](std::vector<std::string> v, const std::string& more) { v.push_back(more); return v; };
  CHECK_THAT(validate_error(with(interleaved, "train.global_batch=6"), 2),
             Contains("parallel.schedule=interleaved needs the micro-batches per step, m = train.global_batch / "
                      "(parallel.dp*train.micro_batch) = 6 / (1*2) = 3, to be a multiple of parallel.pp=2"));
  CHECK_THAT(validate_error(with(interleaved, "train.global_batch=12"), 4), Contains("= 12 / (2*2) = 3"));

  // Accepted splits.
  for (const std::vector<std::string>& ok :
       {with(interleaved, "train.global_batch=8"), with(interleaved, "parallel.stage_layers=[1, 1, 1, 1]"),
        std::vector<std::string>{"parallel.pp=2", "model.n_layer=3", "parallel.stage_layers=[2, 1]"},
        std::vector<std::string>{"parallel.pp=4", "model.n_layer=4", "parallel.schedule=gpipe"}}) {
    Config c;
    for (const auto& o : ok) apply_override(c, o);
    INFO(c.parallel.pp);
    CHECK_NOTHROW(validate(c, c.parallel.pp));
  }
}

TEST_CASE("help_text lists every key to_yaml writes, with its default") {
  std::vector<std::string> emitted;
  collect_keys(YAML::Load(to_yaml(Config{})), "", emitted);
  REQUIRE(emitted.size() >= 50);
  const std::string help = help_text();
  for (const std::string& k : emitted) {
    INFO(k);
    CHECK_THAT(help, Contains("  " + k + " "));
  }
  CHECK_THAT(help, Contains("model:"));
  CHECK_THAT(help, Contains("comm:"));
  CHECK_THAT(help, Contains("\"tp-dp-pp\""));
  CHECK_THAT(help, Contains("1e-08"));
}

TEST_CASE("command line: --config, --set, --help") {
  CliArgs a = parse_cli({"--config", "c.yaml", "--set", "optim.lr=3e-4", "--set=parallel.tp=2", "--set", "a.b=x=y"});
  CHECK(a.config_path == "c.yaml");
  CHECK(a.overrides == std::vector<std::string>{"optim.lr=3e-4", "parallel.tp=2", "a.b=x=y"});
  CHECK_FALSE(a.help);

  CHECK(parse_cli({"--config=c.yaml"}).config_path == "c.yaml");
  CHECK(parse_cli({"--help"}).help);
  CHECK(parse_cli({"-h"}).help);
  CHECK(parse_cli({"--config", "c.yaml", "--help"}).help);

  const char* argv[] = {"trainer", "--config", "x.yaml", "--set", "train.steps=3"};
  CliArgs b = parse_cli(5, argv);
  CHECK(b.config_path == "x.yaml");
  CHECK(b.overrides == std::vector<std::string>{"train.steps=3"});

  CHECK_THAT(input_error_of([] { parse_cli(std::vector<std::string>{}); }), Contains("missing --config"));
  CHECK_THAT(input_error_of([] { parse_cli({"--config"}); }), Contains("--config needs a value"));
  CHECK_THAT(input_error_of([] { parse_cli({"--config", "--set", "a=1"}); }), Contains("--config needs a value"));
  CHECK_THAT(input_error_of([] { parse_cli({"--config", "c.yaml", "--set"}); }), Contains("--set needs a value"));
  CHECK_THAT(input_error_of([] { parse_cli({"--config", "c.yaml", "--set", "optim.lr"}); }),
             Contains("--set expects KEY=VALUE"));
  CHECK_THAT(input_error_of([] { parse_cli({"--config", "c.yaml", "--verbose"}); }), Contains("unknown flag '--verbose'"));
  CHECK_THAT(input_error_of([] { parse_cli({"--config", "c.yaml", "--sample"}); }), Contains("build/sample --run"));
  CHECK_THAT(input_error_of([] { parse_cli({"--config", "c.yaml", "extra"}); }), Contains("unexpected argument 'extra'"));
  CHECK_THAT(input_error_of([] { parse_cli({"--config", "a.yaml", "--config", "b.yaml"}); }), Contains("twice"));
  CHECK_THAT(input_error_of([] { parse_cli({"--config="}); }), Contains("--config needs a FILE"));
  CHECK_THAT(cli_usage(), Contains("--set KEY=VALUE"));
}

TEST_CASE("run.stop_signals: names with or without SIG in any case and bad names refused") {
  std::vector<int> s;
  std::string bad;
  CHECK(parse_stop_signals(" TERM, sigusr1 ,Usr1", s, bad));
  CHECK(s == std::vector<int>{SIGTERM, SIGUSR1});
  CHECK(parse_stop_signals("", s, bad));
  CHECK(s.empty());
  CHECK_FALSE(parse_stop_signals("TERM,KILL", s, bad));
  CHECK(bad == "KILL");
  CHECK_FALSE(parse_stop_signals("TERM,,USR1", s, bad));
  CHECK(signal_name(SIGUSR1) == "SIGUSR1");
}

TEST_CASE("resume: the state checkpoints do not hold is named when a run resumes") {
  Config c;
  CHECK(resume_restarts(c).empty());
  for (const char* m : {"bf16", "int8", "topk", "powersgd"}) {  // error feedback is in checkpoints
    apply_override(c, std::string("comm.compress=") + m);
    CHECK(resume_restarts(c).empty());
  }
  // comm.adapt: its controller measures afresh from the checkpoint's setting.
  apply_override(c, "comm.adapt=true");
  apply_override(c, "comm.adapt_compress=none,powersgd");
  const auto w = resume_restarts(c);
  REQUIRE(w.size() == 1);
  CHECK_THAT(w[0], Contains("comm.adapt") && Contains("bucket size and compression") && Contains("measures afresh"));
  // Under local SGD the controller picks the period: a resumed run starts from the checkpoint's and measures again.
  Config local;
  for (const char* a : {"comm.adapt=true", "optim.sync_every=4"}) apply_override(local, a);
  const auto l = resume_restarts(local);
  REQUIRE(l.size() == 1);
  CHECK_THAT(l[0], Contains("local SGD period") && Contains("measures afresh"));
}
