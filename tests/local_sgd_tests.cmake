# Local SGD (optim.sync_every): the outer step on 2 and 3 ranks, and the trainer end to end. Included from
# tests/CMakeLists.txt.
foreach(np 2 3)
  add_test(NAME local_sgd_outer_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_local_sgd>)
  set_tests_properties(local_sgd_outer_np${np} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 120
                       PROCESSORS ${np})
endforeach()
add_test(NAME local_sgd
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_local_sgd.py $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/test_work/local_sgd ${MPIEXEC_EXECUTABLE})
set_tests_properties(local_sgd PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 300 PROCESSORS 2)
