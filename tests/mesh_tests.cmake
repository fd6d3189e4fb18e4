# The mesh's MPI split at 4 and 8 ranks (MPICH oversubscribes the 2 CI cores; one OpenMP thread per rank).
# Included from tests/CMakeLists.txt after the test_* executables are defined.
foreach(np 4 8)
  add_test(NAME mesh_split_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_mesh> "mesh MPI split*")
  set_tests_properties(mesh_split_np${np} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 120
                       PROCESSORS ${np})
endforeach()
