// The program the tests' precompiled header is built with
// (tests/CMakeLists.txt, tandem_test_pch): an executable, so that the header
// is compiled with the tests' own flags (-fPIE, not a library's -fPIC, which
// would make every test refuse it). It does nothing.
int main() { return 0; }
