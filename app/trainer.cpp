// build/trainer: `mpirun -np N build/trainer --config FILE [--set KEY=VALUE]...` (or without mpirun, one rank).
// Exit status: 0 success; 2 a bad config, flag or input file; 1 a failure while running.
#include <mpi.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>

#include "comm/comm_util.h"
#include "comm/mpi_init.h"
#include "core/errors.h"
#include "train/checkpoint.h"
#include "train/cli.h"
#include "train/config.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  mt::init_mpi(&argc, &argv);  // even for one rank: the same code path as a mesh
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
  if (rank != 0) spdlog::set_level(spdlog::level::warn);

  int status = 0;
  bool others_may_wait = false;
  try {
    mt::CliArgs args = mt::parse_cli(argc, argv);
    if (args.help) {
      if (rank == 0) std::fputs((mt::cli_usage(argv[0]) + "\n" + mt::help_text()).c_str(), stdout);
    } else {
      mt::Config cfg = mt::load_config(args.config_path, args.overrides);
      if (!args.export_checkpoint.empty()) {
        if (rank == 0) mt::export_checkpoint(args.export_checkpoint, args.export_dir, cfg);
      } else {
        mt::validate(cfg, world);
        mt::run_training(cfg);
      }
    }
  } catch (const mt::InputError& e) {
    // Bad input reaches here on every rank together (the config is the same everywhere; set-up errors are
    // agreed on by all ranks), so the ranks finalize in step: rank 0 says what is wrong.
    if (rank == 0) spdlog::error("{}", e.what());
    status = 2;
  } catch (const mt::StoppedTogether& e) {
    if (rank == 0) spdlog::error("stopped: {}", e.what());  // every rank is here together, as for InputError
    status = 1;
  } catch (const std::exception& e) {
    spdlog::error("failed: {}", e.what());
    status = 1;
    others_may_wait = true;  // the other ranks may be waiting on this one
  }
  if (others_may_wait && world > 1) mt::abort_job(status);
  return mt::finalize_mpi(status);
}
