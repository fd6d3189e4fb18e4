# Stragglers and stale-synchronous data parallelism (optim.staleness): the gradient ring on 2-4 ranks, and the
# trainer end to end. Included from tests/CMakeLists.txt.
foreach(np 2 3 4)
  add_test(NAME stale_gradients_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_stale_gradients>)
  set_tests_properties(stale_gradients_np${np} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 120
                       PROCESSORS 2)
endforeach()
add_test(NAME staleness
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_staleness.py $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/test_work/staleness ${MPIEXEC_EXECUTABLE})
set_tests_properties(staleness PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 300 PROCESSORS 2)
