// The shared-memory transport: a Communicator over ranks that share one machine's memory, which moves data through
// an MPI-3 shared-memory window with plain copies and never spins. Each rank's communication thread sleeps on a
// futex word in the window (its bell) whenever it waits (for a late peer, for a free slot, for a message); a peer
// that changes what it waits for rings it. So waiting costs no CPU, and once every rank has arrived a collective
// runs at memory speed. See docs/comm.md, "The shared-memory transport".
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace mt {

struct ShmSizes {
  int64_t half_bytes = 1 << 20;   // collectives move data in rounds of up to this many bytes per rank
  int64_t slot_bytes = 256 << 10;  // send/recv move data in chunks of up to this many bytes
  int slots = 4;                   // chunks in flight per (sender, receiver) pair
};

// Whether every rank of `comm` shares memory with every other (collective over comm; the same answer on all).
bool shares_memory(MPI_Comm comm);

// Collective over `comm`, which must share memory (shares_memory). Host tensors only. `name` as for the MPI
// transport. `sizes` only matter for speed (tests shrink them to exercise the chunking).
std::unique_ptr<Communicator> make_shm_transport(MPI_Comm comm, const std::string& name, const CommOptions& opts,
                                                 const ShmSizes& sizes = {});

}  // namespace mt
