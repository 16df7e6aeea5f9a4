// The walls of docs/ARCHITECTURE.md, checked against the code: the
// "layering" block there names every folder ("room") of common/, cpu_worker/,
// gpu_worker/, coordinator/ and client/ and the rooms each may include; this
// test reads that block and every source file's #include lines and fails
//   - on an include the block does not allow (naming file, line and rule),
//   - on a source file in a folder the block does not name,
//   - on an allowed import that no file uses (the picture must stay true).
// So the picture in the docs and the code cannot drift apart, and a wall
// crossed in a new file fails here even though the global include path
// would let it compile.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = TANDEM_SOURCE_DIR;
constexpr char kBlockMarker[] = "<!-- layering: checked by tests/layering_test.cc -->";
const char* const kCheckedTops[] = {"common", "cpu_worker", "gpu_worker", "coordinator", "client"};

// room -> the rooms it may include, from ARCHITECTURE.md's block.
using Rules = std::map<std::string, std::set<std::string>>;

Rules ReadRules(std::string* error) {
  std::ifstream in(kSource / "docs" / "ARCHITECTURE.md");
  std::string line;
  bool marker = false, inside = false;
  Rules rules;
  while (std::getline(in, line)) {
    if (!marker) {
      marker = absl::StrContains(line, kBlockMarker);
      continue;
    }
    if (!inside) {
      inside = absl::StartsWith(line, "```");
      continue;
    }
    if (absl::StartsWith(line, "```")) return rules;
    std::vector<std::string> sides = absl::StrSplit(line, "->");
    if (sides.size() != 2) {
      *error = absl::StrCat("ARCHITECTURE.md layering line is not \"room -> rooms\": ", line);
      return {};
    }
    const std::string room(absl::StripAsciiWhitespace(sides[0]));
    std::set<std::string>& allowed = rules[room];
    for (absl::string_view dep : absl::StrSplit(sides[1], ' ', absl::SkipEmpty())) allowed.insert(std::string(dep));
  }
  *error = marker ? "ARCHITECTURE.md's layering block is not closed" : "ARCHITECTURE.md has no layering block";
  return {};
}

// The room a path belongs to: the longest room that is a prefix of it.
std::string RoomOf(const std::string& path, const Rules& rules) {
  std::string best;
  for (const auto& [room, allowed] : rules) {
    if ((path == room || absl::StartsWith(path, room + "/")) && room.size() > best.size()) best = room;
  }
  return best;
}

bool IsSource(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".h" || ext == ".cc" || ext == ".cu" || ext == ".cuh";
}

struct Include {
  std::string file;
  int line = 0;
  std::string target;
};

std::vector<Include> IncludesUnder(const std::string& top) {
  std::vector<Include> out;
  for (const auto& entry : fs::recursive_directory_iterator(kSource / top)) {
    if (!entry.is_regular_file() || !IsSource(entry.path())) continue;
    const std::string file = fs::relative(entry.path(), kSource).string();
    std::ifstream in(entry.path());
    std::string text;
    int number = 0;
    while (std::getline(in, text)) {
      ++number;
      absl::string_view rest = absl::StripLeadingAsciiWhitespace(text);
      if (!absl::ConsumePrefix(&rest, "#include \"")) continue;
      out.push_back({file, number, std::string(rest.substr(0, rest.find('"')))});
    }
    if (number == 0) out.push_back({file, 0, ""});  // an empty file still belongs to a room
  }
  return out;
}

TEST(LayeringTest, EveryIncludeCrossesOnlyTheWallsArchitectureMdAllows) {
  std::string error;
  const Rules rules = ReadRules(&error);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_FALSE(rules.empty());
  std::vector<std::string> violations;
  std::set<std::pair<std::string, std::string>> used;
  std::set<std::string> unplaced;
  for (const char* top : kCheckedTops) {
    for (const Include& inc : IncludesUnder(top)) {
      const std::string from = RoomOf(inc.file, rules);
      if (from.empty()) {
        unplaced.insert(fs::path(inc.file).parent_path().string());
        continue;
      }
      if (inc.target.empty()) continue;
      std::string to = absl::StartsWith(inc.target, "tandem/v1/") ? "protos" : RoomOf(inc.target, rules);
      if (to.empty() || to == from) continue;  // the same room, or outside the checked tree (generated headers)
      used.insert({from, to});
      if (!rules.at(from).count(to)) {
        violations.push_back(absl::StrCat(inc.file, ":", inc.line, ": ", from, " includes ", inc.target, " (", to,
                                          "), which ARCHITECTURE.md does not allow ", from, " to import"));
      }
    }
  }
  EXPECT_TRUE(unplaced.empty()) << "folders with sources that ARCHITECTURE.md's layering block does not name: "
                                << absl::StrJoin(unplaced, ", ");
  EXPECT_TRUE(violations.empty()) << absl::StrJoin(violations, "\n");
  std::vector<std::string> unused;
  for (const auto& [room, allowed] : rules) {
    for (const std::string& to : allowed) {
      if (!used.count({room, to})) unused.push_back(absl::StrCat(room, " -> ", to));
    }
  }
  EXPECT_TRUE(unused.empty()) << "imports ARCHITECTURE.md allows but no file uses (remove them from the picture): "
                              << absl::StrJoin(unused, ", ");
}

// With no globs, a source file no CMakeLists.txt names is never compiled: it
// must be named by the CMakeLists.txt of its folder or of a folder above it
// (a stub only when the CUDA file it stands for has a sibling entry).
TEST(LayeringTest, EverySourceFileIsBuilt) {
  std::vector<std::string> orphans;
  for (const char* top : kCheckedTops) {
    for (const auto& entry : fs::recursive_directory_iterator(kSource / top)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cc" && ext != ".cu")) continue;
      const std::string name = entry.path().filename().string();
      bool named = false;
      for (fs::path dir = entry.path().parent_path(); !named && dir.string().size() >= kSource.string().size();
           dir = dir.parent_path()) {
        std::ifstream in(dir / "CMakeLists.txt");
        std::stringstream text;
        text << in.rdbuf();
        named = absl::StrContains(text.str(), name);
        if (dir == kSource) break;
      }
      if (!named) orphans.push_back(fs::relative(entry.path(), kSource).string());
    }
  }
  EXPECT_TRUE(orphans.empty()) << "sources no CMakeLists.txt names (never built): " << absl::StrJoin(orphans, ", ");
}

TEST(LayeringTest, TheRulesHaveNoCycle) {
  std::string error;
  const Rules rules = ReadRules(&error);
  ASSERT_TRUE(error.empty()) << error;
  // Depth-first search for a back edge.
  std::map<std::string, int> state;  // 1 on the stack, 2 done
  std::vector<std::string> path;
  std::string cycle;
  std::function<void(const std::string&)> visit = [&](const std::string& room) {
    state[room] = 1;
    path.push_back(room);
    auto it = rules.find(room);
    if (it != rules.end()) {
      for (const std::string& to : it->second) {
        if (!cycle.empty()) break;
        if (state[to] == 1) cycle = absl::StrCat(absl::StrJoin(path, " -> "), " -> ", to);
        if (state[to] == 0) visit(to);
      }
    }
    path.pop_back();
    state[room] = 2;
  };
  for (const auto& [room, allowed] : rules) {
    if (state[room] == 0) visit(room);
  }
  EXPECT_TRUE(cycle.empty()) << "the layering has a cycle: " << cycle;
}

}  // namespace
}  // namespace tandem
