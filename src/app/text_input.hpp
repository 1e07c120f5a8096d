// Text a command reads whole (translate --input, score --hyp/--ref): read with a size limit, so
// that a huge file or an endless one (/dev/zero, a pipe that never ends) is an input error (exit 2)
// naming it, not a process that grows until the node kills it (docs/user-guide.md "Faults").
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace meshmoe {

// The largest text input: 256 MiB (a translation corpus of a few million lines).
inline constexpr size_t kMaxTextInputBytes = size_t(256) << 20;

// The bytes of `path` ("-": stdin); InputError naming `what` and the path when it cannot be read or
// holds more than `limit` bytes.
std::string read_text_input(const std::string& path, const std::string& what, size_t limit = kMaxTextInputBytes);

// The lines of `text` as std::getline splits them (no empty last line after a final newline), each
// without a trailing '\r'.
std::vector<std::string> split_lines(const std::string& text);

}  // namespace meshmoe
