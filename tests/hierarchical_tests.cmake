# Multi-rank runs of the hierarchical all-reduce tests (comm.hierarchical). Included from tests/CMakeLists.txt;
# catch_discover_tests already registers each test_hierarchical case for one rank. 2 ranks: one node or two of
# one rank; 3: uneven layouts throw, k = 3 or m = 3; 4: two nodes of two, the case the feature is for.
foreach(np 2 3 4)
  add_test(NAME test_hierarchical_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_hierarchical>)
  # More ranks than cores: keep each rank single-threaded.
  set_tests_properties(test_hierarchical_np${np} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 120
                       PROCESSORS ${np})
endforeach()

# The trainer with comm.hierarchical: identical to the flat all-reduce, faster on two tiers, uneven nodes refused.
add_test(NAME hierarchical_trainer
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_hierarchical_trainer.py $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/test_work/hierarchical_trainer ${MPIEXEC_EXECUTABLE})
set_tests_properties(hierarchical_trainer PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 180 PROCESSORS 4)
