// Command-line parsing for the trainer: --config FILE, --set KEY=VALUE (repeatable), --export CHECKPOINT OUT_DIR,
// --help. Bad flags throw
// InputError (exit status 2).
#pragma once
#include <string>
#include <vector>

namespace mt {

struct CliArgs {
  std::string config_path;             // --config FILE (required unless help)
  std::vector<std::string> overrides;  // --set KEY=VALUE, in command-line order (the last one wins)
  bool help = false;                   // --help / -h
  std::string export_checkpoint, export_dir;  // --export CHECKPOINT OUT_DIR: write the weights, do not train
};

// Parses argv[1..argc-1]. Accepts `--config FILE`, `--config=FILE`, `--set KEY=VALUE`, `--set=KEY=VALUE`,
// `--export CHECKPOINT OUT_DIR`, `--help`, `-h`. Unknown flags, positional arguments, a flag without its value, --config given twice, a --set
// without '=' and a missing --config (unless --help) are InputErrors.
CliArgs parse_cli(int argc, const char* const* argv);
CliArgs parse_cli(const std::vector<std::string>& args);  // the arguments without the program name

// One-paragraph usage text for `--help` and for errors (help_text() in train/config.h lists the keys).
std::string cli_usage(const std::string& program = "trainer");

}  // namespace mt
