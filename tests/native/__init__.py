"""The C++ side: the standalone C++ tests (cpp/) and the fuzzers (fuzz/), built by
CMakeLists.txt under the sanitizers (cpp_build.py), and the multi-process
Python suites against an ASan/UBSan build of the core."""
