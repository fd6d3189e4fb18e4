// Pieces the MPI and hierarchical backends share: the division that turns a Sum into an Avg, and the watchdog's
// message, and ending the job without losing its last words.
#pragma once
#include <cstdint>
#include <string>

#include "comm/comm_options.h"
#include "core/tensor.h"

namespace mt {

// x /= p elementwise; 16-bit types divide in fp32 and round once.
void divide_by_group_size(const Tensor& t, int p);

// Prints which wait outlived comm.timeout_s (rank, operation, sequence number, communicator) and ends the job.
[[noreturn]] void watchdog_abort(int world_rank, CommKind kind, uint64_t seq, const std::string& comm,
                                 double waited_s, double timeout_s);

// Prints `line` for this rank, has every rank write its flight recorder dump (when recording is on), names the dumps
// and the analyzer's command, and ends the job with status 1: the watchdog's and a detected desync's end.
[[noreturn]] void abort_job_with_dumps(int world_rank, const std::string& line);

// MPI_Abort after flushing this rank's output and giving MPICH's launcher a moment to forward it: the launcher
// can tear the job down before its proxy has passed on a rank's last lines (CI once lost the watchdog's line).
[[noreturn]] void abort_job(int status);

// Whether MPI_Finalize has run, for a destructor about to free an MPI object (`what`: a communicator, a window). After
// it nothing can be freed, and the object leaks: objects holding MPI handles must go before finalize_mpi, so this says
// so on stderr, where tests look for it (build/sample once finalized with its communicators alive).
bool finalized_before_free(const std::string& what);

}  // namespace mt
