// Elapsed time on the monotonic clock: the one place that turns two
// std::chrono::steady_clock points into microseconds, milliseconds, seconds
// or nanoseconds. Header-only; any thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace tandem {

using SteadyClock = std::chrono::steady_clock;

inline double MicrosBetween(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}
inline double MillisBetween(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}
inline double SecondsBetween(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

inline double MicrosSince(SteadyClock::time_point start) { return MicrosBetween(start, SteadyClock::now()); }
inline double MillisSince(SteadyClock::time_point start) { return MillisBetween(start, SteadyClock::now()); }
inline double SecondsSince(SteadyClock::time_point start) { return SecondsBetween(start, SteadyClock::now()); }
// Whole nanoseconds (truncated), for counters kept as integers.
inline int64_t NanosSince(SteadyClock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start).count();
}

}  // namespace tandem
