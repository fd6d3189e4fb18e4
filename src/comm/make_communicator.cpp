// Transport choice and emulation wrapping (make_communicator.h).
#include "comm/make_communicator.h"

#include "comm/emulated_communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/shm_communicator.h"
#include "core/check.h"
#include "core/errors.h"

namespace mt {

std::vector<int> world_ranks(MPI_Comm comm) {
  int size = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  std::vector<int> mine(size), world(size);
  for (int i = 0; i < size; ++i) mine[i] = i;
  MPI_Group g, gw;
  MPI_CHECK(MPI_Comm_group(comm, &g));
  MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &gw));
  MPI_CHECK(MPI_Group_translate_ranks(g, size, mine.data(), gw, world.data()));
  MPI_CHECK(MPI_Group_free(&g));
  MPI_CHECK(MPI_Group_free(&gw));
  return world;
}

std::unique_ptr<Communicator> maybe_emulate(std::unique_ptr<Communicator> c, MPI_Comm comm, const CommOptions& opts) {
  if (!opts.emulating()) return c;
  return wrap_emulation(std::move(c), emulated_nodes(world_ranks(comm), opts.ranks_per_node), opts);
}

std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, const std::string& name, const CommOptions& opts) {
  using T = CommOptions::Transport;
  bool shm = opts.transport == T::Shm;
  if (opts.transport == T::Auto) shm = shares_memory(comm);
  if (opts.transport == T::Shm && !shares_memory(comm))
    input_error("comm.backend=shm: the ranks of communicator '{}' do not all share one machine's memory (use auto "
                "or mpi)", name);
  return maybe_emulate(shm ? make_shm_transport(comm, name, opts) : make_mpi_transport(comm, name, opts), comm, opts);
}

}  // namespace mt
