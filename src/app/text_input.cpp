#include "app/text_input.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.hpp"

namespace meshmoe {

std::string read_text_input(const std::string& path, const std::string& what, size_t limit) {
  const bool stdin_input = path == "-";
  std::unique_ptr<FILE, int (*)(FILE*)> owned(stdin_input ? nullptr : std::fopen(path.c_str(), "rb"), std::fclose);
  FILE* in = stdin_input ? stdin : owned.get();
  if (!in) throw InputError(what + " " + path + ": cannot read (" + std::strerror(errno) + ")");
  std::string text;
  char chunk[1 << 16];
  for (size_t got; (got = std::fread(chunk, 1, sizeof chunk, in)) > 0;) {
    if (text.size() + got > limit)
      throw InputError(what + " " + path + ": more than " + std::to_string(limit >> 20) +
                       " MiB, the limit of a text input; split it into several calls");
    text.append(chunk, got);
  }
  if (std::ferror(in)) throw InputError(what + " " + path + ": read error (" + std::strerror(errno) + ")");
  return text;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    at = end + 1;
  }
  return lines;
}

}  // namespace meshmoe
