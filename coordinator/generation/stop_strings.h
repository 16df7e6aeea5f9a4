// Stop strings for streamed generation: the text a request streams must never
// contain a stop string, and must not show the start of one that a later
// token might complete. So the matcher holds back the longest tail of the
// text that is a prefix of some stop string, and releases it once the next
// token rules the stop string out (or at the end of generation).
//
// Example, stop "\n\n": pieces "Hi", "\n", "\n" stream as "Hi", "" (the
// "\n" is held), and then stop: the stream text is "Hi".
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// One request's matcher; one thread at a time.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  struct Result {
    std::string emit;      // text to stream now
    bool stopped = false;  // a stop string appeared: generation ends, its text is dropped
  };
  // Appends one token's text.
  Result Push(std::string_view piece);
  // The held-back text, when generation ends for another reason.
  std::string Flush();

  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet streamed
};

}  // namespace tandem
