// The test binaries run attntune without the shipped database of tuned results
// (docs/design/shipped_db.md): what a test's commands answer and how its campaigns search must
// depend on the databases the test made, not on what db/shipped/ holds this week. Set before main(),
// so every child inherits it; the tests of the shipped database (tests/unit/cli/test_shipped_db.cpp)
// name the file they mean on each command (or unset this to test the default location).
#include <cstdlib>

namespace {
[[maybe_unused]] const bool hermetic = [] { return ::setenv("ATTNTUNE_SHIPPED_DB", "", 1) == 0; }();
}  // namespace
