// The NCCL backend of Communicator (device memory). Built only with CUDA (MESHTRAIN_WITH_CUDA=1; the
// implementation is src/comm/nccl/nccl_communicator.cpp). This header needs no CUDA header: a stream is passed
// as the runtime's opaque CUstream_st*, which is what cudaStream_t is.
//
// Ordering: every operation is issued on one communication stream per communicator, after the compute stream's
// work issued so far (an event recorded on the compute stream, waited on by the communication stream), so
// operations run in issue order and overlap compute issued later. Work::wait() makes the compute stream wait
// for the operation (cudaStreamWaitEvent: no host synchronisation); nccl_wait_host() blocks the host instead.
// barrier() blocks the host. A watchdog thread ends the job (MPI_Abort) when an operation that could run has
// not finished within opts.timeout_s. Network emulation (opts' latency/bandwidth) is not applied by NCCL.
// An operation keeps its tensors alive until it has completed on the device. NCCL needs one GPU per rank: ranks
// that share a GPU use the MPI backend, which stages device tensors through host memory.
// See docs/mesh.md for the design, including uneven reduce_scatter/all_gather shards.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.h"

struct CUstream_st;  // cudaStream_t == CUstream_st*

namespace mt {

// Collective over `comm` (group rank 0 creates the NCCL unique id and broadcasts it over `comm`). The calling
// thread's current CUDA device (cudaSetDevice, done by the caller beforehand) is the communicator's device.
// `compute_stream` is the stream the caller computes on (nullptr = the legacy default stream); operations
// start after the work issued to it and Work::wait() orders it after them. `comm` is only used during
// construction and for the job abort; the caller keeps ownership.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name, const CommOptions& opts,
                                                     CUstream_st* compute_stream);

// Blocks the calling host thread until the operation of `w` (a handle from an NCCL communicator) is complete,
// aborting the job after the communicator's timeout. The time is counted in total_wait_us().
void nccl_wait_host(const WorkPtr& w);

}  // namespace mt
