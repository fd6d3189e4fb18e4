// The one way the trainer, tools and tests make a host communicator: the transport opts.transport names (Auto:
// shared memory when the group's ranks share one machine's memory, MPI otherwise), wrapped in the network
// emulation when any comm.emulate link term is set. Collective over `comm`, which is duplicated (the caller keeps
// its handle). Destroy every communicator before MPI_Finalize.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace mt {

std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, const std::string& name, const CommOptions& opts);

// Wraps `c` in the emulation when opts emulate a network (nodes from opts.ranks_per_node); otherwise returns it.
// Collective over `comm`, the group of `c`.
std::unique_ptr<Communicator> maybe_emulate(std::unique_ptr<Communicator> c, MPI_Comm comm, const CommOptions& opts);

// MPI_COMM_WORLD ranks of the ranks of `comm`, in group order.
std::vector<int> world_ranks(MPI_Comm comm);

}  // namespace mt
