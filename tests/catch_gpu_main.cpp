// The GPU tests' entry point (tests/test_cuda_*.cpp): skipped (exit 77) where no GPU can be used (catch_session.h).
#include "catch_session.h"

int main(int argc, char** argv) { return run_catch_session(argc, argv, true); }
