// The MPI transport of Communicator (host memory; device memory staged through pinned buffers in CUDA builds):
// its operations run in issue order on a communication thread of its own (queued_communicator.h), so collectives
// progress while compute runs. Requires MPI_THREAD_MULTIPLE (mt::init_mpi). Destroy every communicator before
// MPI_Finalize. Most code wants make_communicator (make_communicator.h), which picks the transport and adds the
// network emulation.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace mt {

// `comm` is duplicated (MPI_Comm_dup, collective over comm); the caller keeps ownership of its own handle.
// `name` names the communicator in events, traces and watchdog messages ("dp", "tp", "pp", "world").
// Uses opts.timeout_s and opts.blocking_waits; no emulation.
std::unique_ptr<Communicator> make_mpi_transport(MPI_Comm comm, const std::string& name, const CommOptions& opts);

}  // namespace mt
