# Research tools: scripts/sweep.py over a small grid through mpiexec (its CSVs against each point's
# metrics.jsonl, a failing point recorded without stopping the sweep) and scripts/plot.py's figures as PNG files.
if(NOT DEFINED MT_WORK)
  set(MT_WORK ${CMAKE_BINARY_DIR}/test_work)
endif()

add_test(NAME sweep_plot
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_sweep_plot.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/sweep_plot)
set_tests_properties(sweep_plot PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 120 PROCESSORS 2)
