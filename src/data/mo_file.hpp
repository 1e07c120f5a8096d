// Reader of GNU gettext binary message catalogs (.mo), written from the format description in the
// gettext manual ("The Format of GNU MO Files"):
//   offset  0  magic 0x950412de (read in either byte order; the order of the magic is the file's)
//          4  revision (major in the high 16 bits: 0 or 1)
//          8  N, number of strings
//         12  O, offset of the table of original strings: N x (length, offset) u32 pairs
//         16  T, offset of the table of translated strings, same layout
// Every offset and length is bounds-checked; a file that fails any check is reported as corrupt,
// never read past its end.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace meshmoe {

struct MoEntry {
  std::string msgid;   // English, without context, singular form of a plural entry
  std::string msgstr;  // first translation (msgstr[0] of a plural entry)
};

struct MoCatalog {
  std::vector<MoEntry> entries;  // in file order (sorted by msgctxt\x04msgid, as msgfmt writes it)
  std::string error;             // non-empty: the file is corrupt and `entries` is empty
  bool ok() const { return error.empty(); }
};

// Parses the bytes of a .mo file. Plural entries (msgid NUL msgid_plural; msgstr[0] NUL msgstr[1]
// ...) give their singular msgid and first translation; a context (msgctxt EOT msgid) is stripped;
// the header entry (empty msgid) is skipped.
MoCatalog parse_mo(std::string_view bytes);
// Reads and parses a file; on failure `error` names the file and the problem.
MoCatalog read_mo_file(const std::string& path);

}  // namespace meshmoe
