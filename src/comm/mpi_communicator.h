// The MPI backend of Communicator (host memory). Each communicator duplicates its MPI communicator and runs its
// operations, in issue order, on one communication thread of its own, so collectives progress while compute
// runs. Requires MPI_THREAD_MULTIPLE (mt::init_mpi). Destroy every communicator before MPI_Finalize.
// In CUDA builds it also takes device tensors (all of an operation's tensors on one device): they are staged
// through pinned host buffers after the compute stream's work issued before the operation, and wait() returns
// once the result is back in device memory (the host blocks, as for host tensors). docs/comm.md, "Device tensors".
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace mt {

// `comm` is duplicated (MPI_Comm_dup, collective over comm); the caller keeps ownership of its own handle.
// `name` names the communicator in events, traces and watchdog messages ("dp", "tp", "pp", "world").
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name, const CommOptions& opts);

}  // namespace mt
