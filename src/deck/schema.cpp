// The schema table built from schema.def, constraint parsing and checking, TOML value spelling.
#include "deck/schema.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <type_traits>

#include "core/quoted.hpp"

namespace meshmoe::deck {
namespace {

template <class T>
constexpr KeyType key_type_of() {
  if constexpr (std::is_same_v<T, int64_t>) return KeyType::Int;
  else if constexpr (std::is_same_v<T, double>) return KeyType::Float;
  else if constexpr (std::is_same_v<T, bool>) return KeyType::Bool;
  else return KeyType::String;
}

// A field's value in the schema's Value form (an option or run.resume as its deck spelling), and back.
template <class T>
Value to_value(const T& field) {
  if constexpr (DeckOption<T>) return std::string(option_name(field));
  else if constexpr (std::is_same_v<T, ResumeFrom>) return field.name();
  else return field;
}
template <class T>
T from_value(const Value& v, const char* key) {
  if constexpr (DeckOption<T>) {
    const auto e = parse_option<T>(std::get<std::string>(v));
    if (!e) throw std::logic_error(std::string(key) + " = \"" + std::get<std::string>(v) + "\" was not validated");
    return *e;
  } else if constexpr (std::is_same_v<T, ResumeFrom>) {
    return ResumeFrom::parse(std::get<std::string>(v));
  } else {
    return std::get<T>(v);
  }
}

// The constraint of a schema.def row; an option's are its names (the row's column stays empty).
template <class T>
Constraint constraint_of(const std::string& text, const char* key) {
  if constexpr (DeckOption<T>) {
    if (!text.empty()) throw std::logic_error(std::string("schema.def: ") + key + ": an option key takes its choices from src/deck/options.hpp");
    return Constraint::parse(option_choices<T>());
  } else {
    return Constraint::parse(text);
  }
}

std::vector<KeySpec> build_schema() {
  std::vector<KeySpec> s;
#define MESHMOE_SECTION(section)
#define MESHMOE_SECTION_END(section)
#define MESHMOE_KEY(section, key, type, def, constraint, doc)                                             \
  s.push_back(KeySpec{#section, #key, key_type_of<deck_types::type##_t>(),                                 \
                      constraint_of<deck_types::type##_t>(constraint, #section "." #key), doc,            \
                      [](const Config& c) -> Value { return to_value(c.section.key); },                   \
                      [](Config& c, const Value& v) {                                                     \
                        c.section.key = from_value<deck_types::type##_t>(v, #section "." #key);           \
                      }});
#include "deck/schema.def"
#undef MESHMOE_SECTION
#undef MESHMOE_KEY
#undef MESHMOE_SECTION_END
  for (const auto& k : s) {
    const bool numeric = k.type == KeyType::Int || k.type == KeyType::Float;
    if (k.constraint.kind == Constraint::Kind::Range && !numeric)
      throw std::logic_error("schema.def: " + k.name() + ": a range constraint needs a numeric key");
    if (k.constraint.kind == Constraint::Kind::Choices && k.type != KeyType::String)
      throw std::logic_error("schema.def: " + k.name() + ": choices need a string key");
  }
  return s;
}

double parse_bound(const std::string& t, const std::string& whole) {
  double v = 0;
  const auto* b = t.data();
  const auto* e = t.data() + t.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p != e) throw std::logic_error("schema.def: bad constraint \"" + whole + "\"");
  return v;
}

std::string fmt_num(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(int64_t(v));
  return toml_value(Value(v));
}

}  // namespace

Constraint Constraint::parse(const std::string& text) {
  Constraint c;
  if (text.empty()) return c;
  if (text.find('|') != std::string::npos) {
    c.kind = Kind::Choices;
    size_t start = 0;
    while (true) {
      const size_t bar = text.find('|', start);
      c.choices.push_back(text.substr(start, bar - start));
      if (bar == std::string::npos) break;
      start = bar + 1;
    }
    return c;
  }
  c.kind = Kind::Range;
  if (text[0] == '[' || text[0] == '(') {
    const size_t comma = text.find(',');
    const char close = text.back();
    if (comma == std::string::npos || (close != ']' && close != ')'))
      throw std::logic_error("schema.def: bad constraint \"" + text + "\"");
    c.lo = parse_bound(text.substr(1, comma - 1), text);
    c.hi = parse_bound(text.substr(comma + 1, text.size() - comma - 2), text);
    c.lo_open = text[0] == '(';
    c.hi_open = close == ')';
  } else if (text.rfind(">=", 0) == 0) {
    c.lo = parse_bound(text.substr(2), text);
  } else if (text.rfind("<=", 0) == 0) {
    c.hi = parse_bound(text.substr(2), text);
  } else if (text[0] == '>') {
    c.lo = parse_bound(text.substr(1), text);
    c.lo_open = true;
  } else if (text[0] == '<') {
    c.hi = parse_bound(text.substr(1), text);
    c.hi_open = true;
  } else {
    // A single word is a one-choice list.
    c.kind = Kind::Choices;
    c.choices = {text};
  }
  return c;
}

std::string Constraint::check(const Value& v) const {
  switch (kind) {
    case Kind::Any:
      return "";
    case Kind::Choices: {
      const auto& s = std::get<std::string>(v);
      if (std::find(choices.begin(), choices.end(), s) != choices.end()) return "";
      std::string msg = "must be one of " + describe(false) + ", got " + toml_string(s);
      // Suggest the nearest choice when it is close (a typo, not a different word).
      const std::string* best = nullptr;
      size_t best_d = 0;
      for (const auto& c : choices) {
        const size_t d = edit_distance(s, c);
        if (!best || d < best_d) best = &c, best_d = d;
      }
      if (best && best_d <= std::max<size_t>(1, best->size() / 3)) msg += "; did you mean \"" + *best + "\"?";
      return msg;
    }
    case Kind::Range: {
      const double x = std::holds_alternative<int64_t>(v) ? double(std::get<int64_t>(v)) : std::get<double>(v);
      const bool ok_lo = !lo || (lo_open ? x > *lo : x >= *lo);
      const bool ok_hi = !hi || (hi_open ? x < *hi : x <= *hi);
      if (ok_lo && ok_hi) return "";
      return "out of range: must be " + std::string(lo && hi ? "in " : "") + describe(false) + ", got " + toml_value(v);
    }
  }
  return "";
}

std::string Constraint::describe(bool markdown) const {
  switch (kind) {
    case Kind::Any:
      return "";
    case Kind::Choices: {
      std::string s;
      for (const auto& c : choices) {
        if (!s.empty()) s += ", ";
        s += markdown ? "`" + c + "`" : c;
      }
      return s;
    }
    case Kind::Range:
      if (lo && hi)
        return std::string(lo_open ? "(" : "[") + fmt_num(*lo) + ", " + fmt_num(*hi) + (hi_open ? ")" : "]");
      if (lo) return std::string(lo_open ? "> " : ">= ") + fmt_num(*lo);
      if (hi) return std::string(hi_open ? "< " : "<= ") + fmt_num(*hi);
  }
  return "";
}

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> s = build_schema();
  return s;
}

const std::vector<std::string>& sections() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& k : schema())
      if (n.empty() || n.back() != k.section) n.push_back(k.section);
    return n;
  }();
  return names;
}

const KeySpec* find_key(const std::string& section, const std::string& key) {
  for (const auto& k : schema())
    if (k.section == section && k.key == key) return &k;
  return nullptr;
}

bool is_section(const std::string& section) {
  const auto& s = sections();
  return std::find(s.begin(), s.end(), section) != s.end();
}

const char* type_name(KeyType t) {
  switch (t) {
    case KeyType::Int: return "integer";
    case KeyType::Float: return "float";
    case KeyType::Bool: return "boolean";
    case KeyType::String: return "string";
  }
  return "?";
}

std::string toml_string(const std::string& s) { return quoted(s); }

std::string toml_value(const Value& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v)) return toml_string(*s);
  const double d = std::get<double>(v);
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest text that reads back to the same double; TOML wants a '.' or an exponent.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, end);
  if (const size_t e = s.find('e'); e != std::string::npos) {
    // 1e-05 -> 1e-5 (both valid TOML; the short form reads better)
    size_t digits = e + 1;
    if (digits < s.size() && (s[digits] == '-' || s[digits] == '+')) ++digits;
    if (s[e + 1] == '+') s.erase(e + 1, 1), --digits;
    while (digits + 1 < s.size() && s[digits] == '0') s.erase(digits, 1);
  } else if (s.find('.') == std::string::npos) {
    s += ".0";
  }
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace meshmoe::deck
