#include "data/mo_file.hpp"

#include <cstdint>
#include <fstream>
#include <sstream>

namespace meshmoe {
namespace {

constexpr uint32_t kMagic = 0x950412deu, kMagicSwapped = 0xde120495u;

uint32_t load_u32(std::string_view b, uint64_t at, bool swap) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data()) + at;
  const uint32_t le = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  const uint32_t be = uint32_t(p[3]) | uint32_t(p[2]) << 8 | uint32_t(p[1]) << 16 | uint32_t(p[0]) << 24;
  return swap ? be : le;
}

MoCatalog failure(std::string why) {
  MoCatalog c;
  c.error = std::move(why);
  return c;
}

}  // namespace

MoCatalog parse_mo(std::string_view b) {
  if (b.size() < 20) return failure("too short for a .mo header (" + std::to_string(b.size()) + " bytes)");
  // The magic written in the file's own byte order tells us that order.
  const uint32_t magic_le = load_u32(b, 0, false);
  bool swap;
  if (magic_le == kMagic) swap = false;
  else if (magic_le == kMagicSwapped) swap = true;
  else return failure("not a .mo file (bad magic number)");
  const uint32_t revision = load_u32(b, 4, swap);
  if ((revision >> 16) > 1) return failure("unsupported .mo major revision " + std::to_string(revision >> 16));
  const uint64_t n = load_u32(b, 8, swap), orig = load_u32(b, 12, swap), trans = load_u32(b, 16, swap);
  const uint64_t size = b.size();
  if (orig + 8 * n > size || trans + 8 * n > size) return failure("string tables extend past the end of the file (truncated?)");

  auto string_at = [&](uint64_t table, uint64_t i, std::string_view& out) {
    const uint64_t len = load_u32(b, table + 8 * i, swap), off = load_u32(b, table + 8 * i + 4, swap);
    if (off + len > size) return false;
    out = b.substr(off, len);
    return true;
  };

  MoCatalog cat;
  cat.entries.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    std::string_view id, str;
    if (!string_at(orig, i, id) || !string_at(trans, i, str))
      return failure("string " + std::to_string(i) + " lies past the end of the file (truncated?)");
    // msgctxt EOT msgid: keep the msgid.
    if (const auto eot = id.find('\x04'); eot != std::string_view::npos) id = id.substr(eot + 1);
    // msgid NUL msgid_plural and msgstr[0] NUL msgstr[1] ...: keep the first of each.
    id = id.substr(0, id.find('\0'));
    str = str.substr(0, str.find('\0'));
    if (id.empty()) continue;  // the header entry (PO metadata)
    cat.entries.push_back(MoEntry{std::string(id), std::string(str)});
  }
  return cat;
}

MoCatalog read_mo_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return failure(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return failure(path + ": read error");
  MoCatalog c = parse_mo(ss.view());
  if (!c.ok()) c.error = path + ": " + c.error;
  return c;
}

}  // namespace meshmoe
