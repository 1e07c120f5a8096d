// The typed view of a validated deck: cfg.<section>.<key>, one field per row of schema.def, with
// the schema's defaults. Keys of an option type hold its enum (src/deck/options.hpp).
#pragma once
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

#include "deck/options.hpp"

namespace meshmoe {

namespace deck_types {
using int_t = int64_t;
using float_t = double;
using bool_t = bool;
using string_t = std::string;
using Device_t = Device;
using ModelArch_t = ModelArch;
using Activation_t = Activation;
using NormKind_t = NormKind;
using PositionKind_t = PositionKind;
using AttentionKernel_t = AttentionKernel;
using Recompute_t = Recompute;
using Precision_t = Precision;
using RouterKind_t = RouterKind;
using SecondExpertPolicy_t = SecondExpertPolicy;
using AuxLossForm_t = AuxLossForm;
using DecodeCapacity_t = DecodeCapacity;
using ExpertAxis_t = ExpertAxis;
using BalanceKind_t = BalanceKind;
using MoeGate_t = MoeGate;
using OptimizerKind_t = OptimizerKind;
using ScheduleKind_t = ScheduleKind;
using TokenizerKind_t = TokenizerKind;
using ResumeFrom_t = ResumeFrom;

// A field's default from its schema.def spelling: the value itself, or for an option the name of
// one of its values (checked at compile time).
template <class T>
  requires(!DeckOption<T> && !std::same_as<T, ResumeFrom>)
constexpr T initial(T value) {
  return value;
}
template <DeckOption E>
consteval E initial(std::string_view name) {
  const auto v = parse_option<E>(name);
  if (!v) throw "schema.def: the default of an option key is not one of its names";
  return *v;
}
template <std::same_as<ResumeFrom> T>
T initial(const std::string& text) {
  return ResumeFrom::parse(text);
}
}  // namespace deck_types

struct Config {
#define MESHMOE_SECTION(section) struct section##_t {
#define MESHMOE_KEY(section, key, type, def, constraint, doc) \
  deck_types::type##_t key = deck_types::initial<deck_types::type##_t>(def);
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
