# GPU runs of the whole trainer, one script each (tests/py/test_cuda_NAME.py, ctest cuda_NAME):
#   parity        the GPU path against the CPU path, and 2 ranks sharing one GPU (dp2, tp2, pp2 over
#                 comm.backend=mpi) against the single-rank GPU run;
#   checkpoints   checkpoints written from and resumed into GPU state, across the GPU and the CPU;
#   local_sgd     local SGD (plain average and the outer Nesterov step) against the CPU;
#   hierarchical  comm.hierarchical with device tensors (staged by the MPI transport) against the flat run and
#                 the CPU;
#   compress      comm.compress int8, topk and powersgd with GPU gradients (the compressors on a host copy)
#                 against the CPU;
#   strategies    context parallelism (cp2, dp2 x cp2 with ZeRO-3) against the single-rank GPU run, and the flight
#                 recorder's dumps and desync check with device tensors.
# Reported as skipped (exit 77) where the build has no CUDA backend or no GPU is usable. Included from
# tests/CMakeLists.txt.
foreach(name parity checkpoints local_sgd hierarchical compress strategies)
  add_test(NAME cuda_${name}
           COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_cuda_${name}.py ${CMAKE_BINARY_DIR} ${MT_WORK}/cuda_${name})
  set_tests_properties(cuda_${name} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 900 SKIP_RETURN_CODE 77)
endforeach()
