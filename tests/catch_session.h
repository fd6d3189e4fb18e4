// The unit tests' Catch2 session (catch_session.cpp), compiled once and shared by the two entry points:
// catch_mpi_main.cpp (every test) and catch_gpu_main.cpp (tests/test_cuda_*.cpp).
#pragma once

// Runs the Catch2 session between MPI's initialisation (MPI_THREAD_MULTIPLE, for the communicators' threads, even
// for one rank, as in the trainer) and MPI_Finalize. need_gpu: where no GPU can be used, exit with 77, which ctest
// reports as skipped (SKIP_RETURN_CODE); otherwise each rank takes the GPU of its node-local rank.
int run_catch_session(int argc, char** argv, bool need_gpu);
