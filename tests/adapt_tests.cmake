# comm.adapt: the trainer feeds the controller, applies its decisions and reports them (the controller itself is
# tested in test_comm_adapt.cpp). Included from tests/CMakeLists.txt.
add_test(NAME adapt
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_adapt.py $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/test_work/adapt ${MPIEXEC_EXECUTABLE})
set_tests_properties(adapt PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 300 PROCESSORS 2)
