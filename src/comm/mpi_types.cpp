// MPI datatypes and user reductions for 16-bit tensors (mpi_types.h).
#include "comm/mpi_types.h"

#include <mutex>

#include "core/check.h"

namespace mt {
namespace {

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FromF(ToF(a[i]) + ToF(b[i]));
}
template <float (*ToF)(uint16_t)>
void max16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    if (ToF(a[i]) > ToF(b[i])) b[i] = a[i];
}

struct MpiTypes {
  MPI_Datatype t16 = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL, bf16_max = MPI_OP_NULL, fp16_sum = MPI_OP_NULL, fp16_max = MPI_OP_NULL;
};
MpiTypes g_types;
// Frees the datatype and operations at the start of MPI_Finalize (an attribute of MPI_COMM_SELF).
int free_types(MPI_Comm, int, void*, void*) {
  MPI_Type_free(&g_types.t16);
  MPI_Op_free(&g_types.bf16_sum);
  MPI_Op_free(&g_types.bf16_max);
  MPI_Op_free(&g_types.fp16_sum);
  MPI_Op_free(&g_types.fp16_max);
  return MPI_SUCCESS;
}
const MpiTypes& mpi_types() {
  static std::once_flag once;
  std::call_once(once, [] {
    MpiTypes& t = g_types;
    int key = MPI_KEYVAL_INVALID;
    MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_types, &key, nullptr));
    MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr));
    MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.t16));
    MPI_CHECK(MPI_Type_commit(&t.t16));
    MPI_CHECK(MPI_Op_create(&sum16<bf16_to_float, float_to_bf16>, 1, &t.bf16_sum));
    MPI_CHECK(MPI_Op_create(&max16<bf16_to_float>, 1, &t.bf16_max));
    MPI_CHECK(MPI_Op_create(&sum16<fp16_to_float, float_to_fp16>, 1, &t.fp16_sum));
    MPI_CHECK(MPI_Op_create(&max16<fp16_to_float>, 1, &t.fp16_max));
  });
  return g_types;
}

}  // namespace

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT;
    case DType::BF16:
    case DType::F16: return mpi_types().t16;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(DType d, ReduceOp op) {
  const bool max = op == ReduceOp::Max;
  switch (d) {
    case DType::F32: return max ? MPI_MAX : MPI_SUM;
    case DType::BF16: return max ? mpi_types().bf16_max : mpi_types().bf16_sum;
    case DType::F16: return max ? mpi_types().fp16_max : mpi_types().fp16_sum;
    default: break;
  }
  CHECK(false, "reductions take fp32, bf16 or fp16 tensors, got {}", dtype_name(d));
  return MPI_OP_NULL;
}

}  // namespace mt
