// The typed view of a validated deck: cfg.<section>.<key>, one field per row of schema.def, with
// the schema's defaults.
#pragma once
#include <cstdint>
#include <string>

namespace meshmoe {

namespace deck_types {
using int_t = int64_t;
using float_t = double;
using bool_t = bool;
using string_t = std::string;
}  // namespace deck_types

struct Config {
#define MESHMOE_SECTION(section) struct section##_t {
#define MESHMOE_KEY(section, key, type, def, constraint, doc) deck_types::type##_t key = def;
#define MESHMOE_SECTION_END(section) \
  bool operator==(const section##_t&) const = default; \
  }                                                   \
  section;
#include "deck/schema.def"
#undef MESHMOE_SECTION
#undef MESHMOE_KEY
#undef MESHMOE_SECTION_END
  bool operator==(const Config&) const = default;
};

}  // namespace meshmoe
