// Command-line parsing for the trainer (see cli.h). Key names and values are checked later by the config
// loader; here only the shape of the command line is checked.
#include "train/cli.h"

#include "core/errors.h"

namespace mt {

CliArgs parse_cli(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_cli(args);
}

CliArgs parse_cli(const std::vector<std::string>& args) {
  CliArgs out;
  bool have_config = false;
  auto add_set = [&](const std::string& a) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos || eq == 0)
      input_error("--set expects KEY=VALUE (e.g. --set optim.lr=3e-4), got '{}'", a);
    out.overrides.push_back(a);
  };
  auto set_config = [&](const std::string& path) {
    if (have_config) input_error("--config given twice ('{}' and '{}'); give one config file", out.config_path, path);
    if (path.empty()) input_error("--config needs a FILE, got an empty path");
    out.config_path = path, have_config = true;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    // The value of a flag is the next argument, unless it is missing or is itself a flag.
    auto next = [&](const char* flag, const char* what) -> const std::string& {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)
        input_error("{} needs a value ({}){}", flag, what,
                    i + 1 < args.size() ? fmt::format(", got the flag '{}'", args[i + 1]) : std::string());
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      out.help = true;
    } else if (a == "--config") {
      set_config(next("--config", "FILE"));
    } else if (a.rfind("--config=", 0) == 0) {
      set_config(a.substr(9));
    } else if (a == "--export") {
      if (!out.export_checkpoint.empty()) input_error("--export given twice");
      out.export_checkpoint = next("--export", "CHECKPOINT OUT_DIR");
      out.export_dir = next("--export", "CHECKPOINT OUT_DIR: the output directory is missing");
    } else if (a == "--set") {
      add_set(next("--set", "KEY=VALUE"));
    } else if (a.rfind("--set=", 0) == 0) {
      add_set(a.substr(6));
    } else if (a == "--sample" || a == "--generate") {
      input_error("unknown flag '{}': sampling from a trained model is an app of its own, build/sample --run RUN_DIR "
                  "--prompt TEXT (build/sample --help)", a);
    } else if (!a.empty() && a[0] == '-') {
      input_error("unknown flag '{}'\n{}", a, cli_usage());
    } else {
      input_error("unexpected argument '{}' (give the config with --config FILE)\n{}", a, cli_usage());
    }
  }
  if (!out.help && !have_config) input_error("missing --config FILE\n{}", cli_usage());
  return out;
}

std::string cli_usage(const std::string& program) {
  return fmt::format(
      "usage: [mpirun -np N] {} --config FILE [--set KEY=VALUE]...\n"
      "       {} --config FILE --export CHECKPOINT OUT_DIR\n"
      "       {} --help\n"
      "  --config FILE      YAML config (see configs/gpt.yaml)\n"
      "  --set KEY=VALUE    override one dotted key (e.g. --set optim.lr=1e-3); repeatable, the last one wins\n"
      "  --export CKPT DIR  write CKPT's weights (a checkpoint directory of any mesh) as DIR/model.safetensors and\n"
      "                     a Hugging Face config.json; the config gives the model, nothing is trained\n"
      "  --help, -h         print this and every config key with its default and meaning\n",
      program, program, program);
}

}  // namespace mt
