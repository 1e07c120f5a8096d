// The deck schema as data: one KeySpec per row of schema.def, with typed access to the matching
// Config field, the parsed constraint, and the TOML spelling of values. Used by the parser,
// --set, effective_toml and deck-doc.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "deck/config.hpp"

namespace meshmoe::deck {

enum class KeyType { Int, Float, Bool, String };

// Alternatives in KeyType order.
using Value = std::variant<int64_t, double, bool, std::string>;

// "" (any), "a|b|c" (choices, strings only), or a numeric range: ">=x", ">x", "<=x", "<x",
// "[a,b]", "[a,b)", "(a,b]", "(a,b)".
struct Constraint {
  enum class Kind { Any, Choices, Range } kind = Kind::Any;
  std::vector<std::string> choices;
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;

  static Constraint parse(const std::string& text);  // throws std::logic_error on a bad schema row
  // Empty when v satisfies it, else the reason, e.g. "must be >= 1, got 0".
  std::string check(const Value& v) const;
  // Human form for the reference: ">= 1", "[0, 1)", "`relu`, `gelu`" ...
  std::string describe(bool markdown) const;
};

struct KeySpec {
  std::string section, key;
  KeyType type;
  Constraint constraint;
  std::string doc;
  Value (*get)(const Config&);
  void (*set)(Config&, const Value&);

  std::string name() const { return section + "." + key; }
  Value default_value() const { return get(Config{}); }
};

// Every key in schema order.
const std::vector<KeySpec>& schema();
// Section names in schema order.
const std::vector<std::string>& sections();
const KeySpec* find_key(const std::string& section, const std::string& key);
bool is_section(const std::string& section);

const char* type_name(KeyType t);     // "integer", "float", "boolean", "string"
std::string toml_value(const Value& v);  // valid TOML: 8, 1.25, 1e-5, true, "x"
std::string toml_string(const std::string& s);  // a quoted, escaped TOML basic string

// Levenshtein distance, used for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace meshmoe::deck
