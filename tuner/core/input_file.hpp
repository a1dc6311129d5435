// Reading the files a user hands attntune (search spaces, plan files, a model's config.json): one
// reader with one set of limits, so that no input file can hang a command or exhaust its memory.
// Only regular files are read (a FIFO nobody writes, /dev/zero or /dev/urandom would block or
// never end), opened without blocking and read up to a size limit.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace attntune {

// Input files are small: the shipped spaces are a few KiB, a model's config.json a few dozen.
inline constexpr std::size_t kMaxInputFileBytes = std::size_t{4} << 20;  // 4 MiB
// Nesting of JSON arrays and objects (and YAML collections, core/yaml_input.hpp) in an input file.
inline constexpr int kMaxInputNesting = 64;

// The whole of `path`; `what` says what it should be ("a search-space YAML file"). InputError
// "PATH: ..." when it is missing, a directory, not a regular file (a FIFO, a device, a socket),
// larger than `max_bytes`, or unreadable.
std::string read_input_file(const std::string& path, std::string_view what,
                            std::size_t max_bytes = kMaxInputFileBytes);

// InputError "FILE:LINE:COLUMN: ..." when JSON `text` nests arrays and objects deeper than
// `max_depth` (brackets inside strings do not count). Run before parsing: the code that walks a
// parsed document recurses.
void check_json_nesting(std::string_view text, const std::string& file, int max_depth = kMaxInputNesting);

}  // namespace attntune
