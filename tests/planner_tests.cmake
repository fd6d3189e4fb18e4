# The planner (build/planner, issue 9): its memory model against the trainer's measured peak memory on 1, 2 and 4
# ranks, its JSON and table, and bad input (exit status 2). The enumeration, the byte mirrors and the timeline
# are unit tests in test_planner.cpp (registered by the glob in CMakeLists.txt). Included from tests/CMakeLists.txt.
add_test(NAME planner_end_to_end
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_planner.py $<TARGET_FILE:planner> $<TARGET_FILE:trainer>
                 ${MPIEXEC_EXECUTABLE} ${CMAKE_SOURCE_DIR} ${MT_WORK}/planner)
set_tests_properties(planner_end_to_end PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 300 PROCESSORS 2)

# train.recompute: the same losses and gradients as without, and smaller records (tests/py/test_recompute.py).
add_test(NAME recompute
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_recompute.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/recompute)
set_tests_properties(recompute PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 600 PROCESSORS 2)
