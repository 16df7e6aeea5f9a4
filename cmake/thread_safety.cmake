# Clang's thread-safety analysis over the whole build: every member marked
# ABSL_GUARDED_BY(mu) must be touched with mu held, every function marked
# ABSL_EXCLUSIVE_LOCKS_REQUIRED / ABSL_LOCKS_EXCLUDED called accordingly, and
# a violation fails the build. It sees absl::Mutex (annotated as a
# capability), not std::mutex, which is why shared state is guarded by
# absl::Mutex. GCC has no such analysis (the annotations expand to nothing
# there), so it gets no flags.
#
# Included from the top-level CMakeLists.txt before the subdirectories.
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety>
                      $<$<COMPILE_LANGUAGE:CXX>:-Werror=thread-safety-analysis>)
endif()
