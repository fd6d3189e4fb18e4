# GPU runs of the whole trainer (tests/py/test_cuda_parity.py): the GPU path against the CPU path, and 2 ranks
# sharing one GPU (dp2, tp2, pp2 over comm.backend=mpi) against the single-rank GPU run. Reported as skipped
# (exit 77) where the build has no CUDA backend or no GPU is usable. Included from tests/CMakeLists.txt.
add_test(NAME cuda_parity
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_cuda_parity.py ${CMAKE_BINARY_DIR} ${MT_WORK}/cuda_parity)
set_tests_properties(cuda_parity PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 900 SKIP_RETURN_CODE 77)
# Checkpoints written from and resumed into GPU state, across the GPU and the CPU (tests/py/test_cuda_checkpoints.py).
add_test(NAME cuda_checkpoints
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_cuda_checkpoints.py ${CMAKE_BINARY_DIR} ${MT_WORK}/cuda_checkpoints)
set_tests_properties(cuda_checkpoints PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 900 SKIP_RETURN_CODE 77)
# Local SGD on the GPU (plain average and the outer Nesterov step) against the CPU (tests/py/test_cuda_local_sgd.py).
add_test(NAME cuda_local_sgd
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_cuda_local_sgd.py ${CMAKE_BINARY_DIR} ${MT_WORK}/cuda_local_sgd)
set_tests_properties(cuda_local_sgd PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 900 SKIP_RETURN_CODE 77)
# comm.hierarchical with device tensors (staged by the MPI transport) against the flat run and the CPU
# (tests/py/test_cuda_hierarchical.py).
add_test(NAME cuda_hierarchical
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_cuda_hierarchical.py ${CMAKE_BINARY_DIR} ${MT_WORK}/cuda_hierarchical)
set_tests_properties(cuda_hierarchical PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 900 SKIP_RETURN_CODE 77)
# comm.compress int8, topk and powersgd with GPU gradients (the compressors on a host copy) against the CPU
# (tests/py/test_cuda_compress.py).
add_test(NAME cuda_compress
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_cuda_compress.py ${CMAKE_BINARY_DIR} ${MT_WORK}/cuda_compress)
set_tests_properties(cuda_compress PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 900 SKIP_RETURN_CODE 77)
