// MPI datatypes and reductions for the tensor dtypes: 16-bit types (bf16, fp16) travel as a contiguous 2-byte
// datatype with user reductions that add (or compare) in fp32 and round to nearest even, so half the bytes of
// fp32 are on the wire. Created on first use, freed at the start of MPI_Finalize.
#pragma once
#include <mpi.h>

#include "comm/communicator.h"
#include "core/dtype.h"

namespace mt {

MPI_Datatype mpi_type(DType d);
// CHECK-fails unless d is fp32, bf16 or fp16.
MPI_Op mpi_op(DType d, ReduceOp op);

}  // namespace mt
