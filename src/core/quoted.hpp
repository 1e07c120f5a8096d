// A string in double quotes with '"', '\\', newline, tab and carriage return escaped, and every other
// control character (and DEL) as \u00XX: at once a JSON string and a TOML basic string, so the
// safetensors header (io/safetensors.cpp) and the deck's TOML output (deck/schema.cpp) share it.
#pragma once
#include <cstdio>
#include <string>

namespace meshmoe {

inline std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += char(ch);
        }
    }
  }
  return out + "\"";
}

}  // namespace meshmoe
