// Byte counts that cannot wrap: a checked 64-bit integer for size arithmetic (the memory plan) and
// the parser of human byte sizes ("512M", "24G") shared by the deck (run.max_memory) and the
// command line; the "[3, 5]" form of a shape in messages.
#pragma once
#include <cctype>
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshmoe {

// Thrown by Checked when a result does not fit in int64_t. Callers that know which inputs were
// involved turn it into an InputError naming them.
class SizeOverflow : public std::overflow_error {
 public:
  SizeOverflow() : std::overflow_error("integer overflow in a size computation") {}
};

// A signed 64-bit integer whose +, -, * and conversions from wider unsigned values throw
// SizeOverflow instead of wrapping. No implicit conversion out: value() or an explicit double().
class Checked {
 public:
  constexpr Checked() = default;
  template <std::integral T>
  constexpr Checked(T v) {  // NOLINT(google-explicit-constructor): integers mix freely into sums
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t))
      if (v > uint64_t(std::numeric_limits<int64_t>::max())) throw SizeOverflow();
    v_ = int64_t(v);
  }
  constexpr int64_t value() const { return v_; }
  explicit constexpr operator double() const { return double(v_); }

  friend Checked operator+(Checked a, Checked b) {
    Checked r;
    if (__builtin_add_overflow(a.v_, b.v_, &r.v_)) throw SizeOverflow();
    return r;
  }
  friend Checked operator-(Checked a, Checked b) {
    Checked r;
    if (__builtin_sub_overflow(a.v_, b.v_, &r.v_)) throw SizeOverflow();
    return r;
  }
  friend Checked operator*(Checked a, Checked b) {
    Checked r;
    if (__builtin_mul_overflow(a.v_, b.v_, &r.v_)) throw SizeOverflow();
    return r;
  }
  friend Checked operator/(Checked a, Checked b) { return Checked(a.v_ / b.v_); }  // b != 0: the caller's job
  friend Checked operator%(Checked a, Checked b) { return Checked(a.v_ % b.v_); }
  Checked& operator+=(Checked b) { return *this = *this + b; }
  Checked& operator-=(Checked b) { return *this = *this - b; }
  Checked& operator*=(Checked b) { return *this = *this * b; }
  friend constexpr auto operator<=>(Checked a, Checked b) = default;
  friend constexpr bool operator==(Checked a, Checked b) = default;

 private:
  int64_t v_ = 0;
};

inline std::string to_string(Checked c) { return std::to_string(c.value()); }

// "24G" -> 25769803776: a whole number with an optional suffix K, M, G, T (also KiB, KB, ... and B;
// case-insensitive; powers of 1024). Empty optional for anything else, zero, or more than 2^62
// bytes; then *why (when given) says what is wrong.
inline std::optional<int64_t> parse_byte_size(const std::string& text, std::string* why = nullptr) {
  auto fail = [&](const std::string& w) -> std::optional<int64_t> {
    if (why) *why = w;
    return std::nullopt;
  };
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  const std::string s = text.substr(b, e - b);
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0) return fail("expected a whole number of bytes with an optional K, M, G or T suffix (e.g. 512M, 24G)");
  std::string suffix;
  for (size_t i = digits; i < s.size(); ++i) suffix += char(std::tolower(static_cast<unsigned char>(s[i])));
  while (!suffix.empty() && suffix.front() == ' ') suffix.erase(0, 1);
  int shift = -1;
  const char* const units[] = {"", "k", "m", "g", "t"};
  for (int u = 0; u < 5; ++u) {
    const std::string x = units[u];
    if (suffix == x || (!x.empty() && (suffix == x + "b" || suffix == x + "ib")) || (x.empty() && suffix == "b"))
      shift = 10 * u;
  }
  if (shift < 0) return fail("unknown suffix '" + suffix + "': use K, M, G or T (powers of 1024)");
  if (digits > 18) return fail("too large");
  const int64_t v = std::stoll(s.substr(0, digits));
  if (v == 0) return fail("must be positive");
  if (v > (int64_t(1) << (62 - shift))) return fail("too large (at most 4 EiB)");
  return v << shift;
}

// "[3, 5]"
inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace meshmoe
