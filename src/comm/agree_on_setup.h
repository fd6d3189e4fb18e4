// Bad input that only some ranks may see (a file one host cannot read) made into an error every rank sees: the
// ranks then stop in step with exit status 2 and finalize, rather than leave peers waiting in a collective or
// abort the job (MPI_Abort can end the job before the launcher has passed on the message that says why).
#pragma once
#include <mpi.h>

#include <string>

#include "core/errors.h"

namespace mt {

// Bad input found by every rank together (see agree_on_setup): the ranks exit with status 2 in step.
struct SetupError : InputError {
  using InputError::InputError;
};

// Throws SetupError on every rank when any rank's set-up failed (`error` non-empty on that rank). Every rank of
// `world` must call it at the same point, before any collective that a failed rank would not reach. A failed rank
// other than 0 logs its own message; rank 0's is left to its caller.
void agree_on_setup(const std::string& error, MPI_Comm world);

// Runs `step`, set-up that may throw InputError on some ranks only (it reads files), and agrees on its outcome over
// `world` as agree_on_setup does. Without a world (MPI_COMM_NULL: one process without MPI) it only runs it.
template <typename Step>
void agreed_setup(Step&& step, MPI_Comm world) {
  if (world == MPI_COMM_NULL) return step();
  std::string error;
  try {
    step();
  } catch (const InputError& e) {
    error = e.what();
  }
  agree_on_setup(error, world);
}

}  // namespace mt
