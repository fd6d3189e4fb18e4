# Ring attention (context parallelism) on cp = 2 and cp = 4 ranks: tests/test_ring_attention.cpp. Included from
# tests/CMakeLists.txt after the test_* executables are defined; catch_discover_tests already runs every case on one
# rank (cp = 1). Two ranks run the [ring] cases (parity and the finite-difference check of the whole op); four ranks
# only the parity case, to keep the suite's time: MPICH oversubscribes the 2 CI cores, one OpenMP thread per rank.
foreach(np_tags "2;[ring]" "4;[parity]")
  list(GET np_tags 0 np)
  list(GET np_tags 1 tags)
  add_test(NAME ring_attention_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_ring_attention> "${tags}")
  set_tests_properties(ring_attention_np${np} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 60
                       PROCESSORS ${np})
endforeach()
