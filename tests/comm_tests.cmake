# Multi-rank runs of the communication tests and the watchdog test. Included from tests/CMakeLists.txt.
# (catch_discover_tests already registers each test_comm case for one rank.)
foreach(np 2 4)
  add_test(NAME test_comm_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_comm>)
  # More ranks than cores: MPICH busy-polls, so keep each rank single-threaded.
  set_tests_properties(test_comm_np${np} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 120 PROCESSORS ${np})
endforeach()

# The watchdog: in a 4-rank job rank 3 stops itself (SIGSTOP) before a collective; the job must end within
# timeout_s plus a few seconds, with the watchdog's message and a non-zero status.
add_executable(watchdog_probe ${CMAKE_CURRENT_SOURCE_DIR}/watchdog_probe.cpp)
target_link_libraries(watchdog_probe PRIVATE meshtrain)
add_test(NAME comm_watchdog
         COMMAND ${MT_PY} ${CMAKE_CURRENT_SOURCE_DIR}/py/test_watchdog.py ${MPIEXEC_EXECUTABLE}
                 ${MPIEXEC_NUMPROC_FLAG} $<TARGET_FILE:watchdog_probe>)
set_tests_properties(comm_watchdog PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 60 PROCESSORS 4)

# The bf16 gradient-bucket reduction with rank-valued gradients on 2 and 3 ranks (3: an average that bf16 rounds).
foreach(np 2 3)
  add_test(NAME mixed_precision_reducer_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_mixed_precision> "[reducer]")
  set_tests_properties(mixed_precision_reducer_np${np} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 120
                       PROCESSORS ${np})
endforeach()

# ZeRO-2's sharded gradients with rank-valued gradients on 2 and 3 ranks (3: averages that fp32 rounds).
foreach(np 2 3)
  add_test(NAME zero_sharded_grads_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_zero> "[sharded]")
  set_tests_properties(zero_sharded_grads_np${np} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 120
                       PROCESSORS ${np})
endforeach()

# Communicators on device tensors (tests/test_cuda_comm.cpp) on 2 and 4 ranks: all ranks share the machine's
# GPU(s) through the MPI backend's pinned staging; the NCCL case runs only with a GPU per rank. Without a usable
# GPU (or without the CUDA backend) every rank exits 77: skipped.
foreach(np 2 4)
  add_test(NAME test_cuda_comm_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_cuda_comm>)
  set_tests_properties(test_cuda_comm_np${np} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 300
                       PROCESSORS ${np} SKIP_RETURN_CODE 77)
endforeach()
