# Multi-rank runs of the gradient-compression tests (comm.compress; docs/compression.md). Included from
# tests/CMakeLists.txt. (catch_discover_tests already registers each test_grad_compress case for one rank.)
# 2 ranks: every method's exchange; 3 ranks: averages that fp32 rounds, and a group size that is not a power of 2.
foreach(np 2 3)
  add_test(NAME grad_compress_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_grad_compress>)
  # More ranks than cores: MPICH busy-polls, so keep each rank single-threaded.
  set_tests_properties(grad_compress_np${np} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 120
                       PROCESSORS ${np})
endforeach()
# The trainer end to end with compression on 2 replicas of 2 pipeline stages (tests/py/test_compress_runs.py).
add_test(NAME compress_runs
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_compress_runs.py $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/test_work/compress_runs ${MPIEXEC_EXECUTABLE})
set_tests_properties(compress_runs PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 300 PROCESSORS 2)
