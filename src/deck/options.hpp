// Deck keys whose value is one of a fixed set of names (schema.def rows of an option type): the
// enum each becomes in Config, and its one enum <-> name table. The names are the deck's spelling:
// what a deck file and --set hold, what the effective deck echoes and checkpoints store, and the
// schema's allowed values (deck-doc, docs/deck-reference.md, "must be one of" messages). Parsed once,
// where the deck is read (src/deck/deck.cpp); the code after that compares enums.
// Header-only, including only tensor/compute_kinds.hpp: the CUDA code includes it
// (model/activation_bodies.hpp).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tensor/compute_kinds.hpp"  // Device, Precision: the tensor layer's types

namespace meshmoe {

enum class ModelArch { Decoder, EncDec };                   // model.arch (model/transformer.hpp)
enum class Activation { Relu, Gelu, Geglu, Swiglu };        // model.activation (model/activation.hpp)
enum class NormKind { LayerNorm, RmsNorm };                 // model.norm (model/layernorm.hpp)
enum class PositionKind { Learned, Rope };                  // model.position (model/embedding.hpp, model/rope.hpp)
enum class AttentionKernel { Plain, Fused };                // model.attention_kernel (model/fused_attention.hpp)
enum class Recompute {                                      // model.recompute
  None,   // every in-flight micro-batch's saved activations (parked in an ActivationStash)
  Block,  // only its stage input; the forward runs again before the backward
};
enum class RouterKind { Top1, Top2, TopK, ExpertChoice };   // moe.router
enum class SecondExpertPolicy { Random, Always, Threshold };  // moe.second_expert
enum class AuxLossForm { Switch, Gshard };                  // moe.aux_loss_form
enum class DecodeCapacity { Dropless, Eval };               // moe.decode_capacity (model/moe/moe_options.hpp)
enum class ExpertAxis { Data, Tensor };                     // moe.expert_axis (model/placement.hpp)
enum class BalanceKind { AuxLoss, Bias };                   // moe.balance (model/moe/router.hpp)
enum class MoeGate { Softmax, SoftmaxTopk, SoftmaxUnnormalised, Sigmoid };  // moe.gate (model/moe/router_equations.hpp)
enum class OptimizerKind { AdamW, Adafactor };              // optim.name
enum class ScheduleKind { Constant, Rsqrt, Cosine };        // optim.schedule (train/schedule.hpp)
enum class TokenizerKind { Bytes, Spm };                    // data.tokenizer (data/tokenizer.hpp)

template <class E>
struct OptionNames;  // table: {value, name} for every value, in the order deck-doc lists them

#define MESHMOE_OPTION_NAMES(E, ...) \
  template <>                        \
  struct OptionNames<E> {            \
    static constexpr std::pair<E, std::string_view> table[] = {__VA_ARGS__}; \
  };
MESHMOE_OPTION_NAMES(Device, {Device::Cpu, "cpu"}, {Device::Cuda, "cuda"})
MESHMOE_OPTION_NAMES(ModelArch, {ModelArch::Decoder, "decoder"}, {ModelArch::EncDec, "encdec"})
MESHMOE_OPTION_NAMES(Activation, {Activation::Relu, "relu"}, {Activation::Gelu, "gelu"}, {Activation::Geglu, "geglu"},
                     {Activation::Swiglu, "swiglu"})
MESHMOE_OPTION_NAMES(NormKind, {NormKind::LayerNorm, "layernorm"}, {NormKind::RmsNorm, "rmsnorm"})
MESHMOE_OPTION_NAMES(PositionKind, {PositionKind::Learned, "learned"}, {PositionKind::Rope, "rope"})
MESHMOE_OPTION_NAMES(AttentionKernel, {AttentionKernel::Plain, "plain"}, {AttentionKernel::Fused, "fused"})
MESHMOE_OPTION_NAMES(Precision, {Precision::Fp32, "fp32"}, {Precision::Bf16, "bf16"})
MESHMOE_OPTION_NAMES(Recompute, {Recompute::None, "none"}, {Recompute::Block, "block"})
MESHMOE_OPTION_NAMES(RouterKind, {RouterKind::Top1, "top1"}, {RouterKind::Top2, "top2"}, {RouterKind::TopK, "topk"},
                     {RouterKind::ExpertChoice, "expert_choice"})
MESHMOE_OPTION_NAMES(SecondExpertPolicy, {SecondExpertPolicy::Random, "random"}, {SecondExpertPolicy::Always, "always"},
                     {SecondExpertPolicy::Threshold, "threshold"})
MESHMOE_OPTION_NAMES(AuxLossForm, {AuxLossForm::Switch, "switch"}, {AuxLossForm::Gshard, "gshard"})
MESHMOE_OPTION_NAMES(DecodeCapacity, {DecodeCapacity::Dropless, "dropless"}, {DecodeCapacity::Eval, "eval"})
MESHMOE_OPTION_NAMES(ExpertAxis, {ExpertAxis::Data, "data"}, {ExpertAxis::Tensor, "tensor"})
MESHMOE_OPTION_NAMES(BalanceKind, {BalanceKind::AuxLoss, "aux_loss"}, {BalanceKind::Bias, "bias"})
MESHMOE_OPTION_NAMES(MoeGate, {MoeGate::Softmax, "softmax"}, {MoeGate::SoftmaxTopk, "softmax_topk"},
                     {MoeGate::SoftmaxUnnormalised, "softmax_unnormalised"}, {MoeGate::Sigmoid, "sigmoid"})
MESHMOE_OPTION_NAMES(OptimizerKind, {OptimizerKind::AdamW, "adamw"}, {OptimizerKind::Adafactor, "adafactor"})
MESHMOE_OPTION_NAMES(ScheduleKind, {ScheduleKind::Constant, "constant"}, {ScheduleKind::Rsqrt, "rsqrt"},
                     {ScheduleKind::Cosine, "cosine"})
MESHMOE_OPTION_NAMES(TokenizerKind, {TokenizerKind::Bytes, "bytes"}, {TokenizerKind::Spm, "spm"})
#undef MESHMOE_OPTION_NAMES

template <class E>
concept DeckOption = requires { OptionNames<E>::table; };

// The deck's name of a value.
template <DeckOption E>
constexpr std::string_view option_name(E value) {
  for (const auto& [v, name] : OptionNames<E>::table)
    if (v == value) return name;
  return "?";
}

// The value a name spells; none when it is not one of the option's names.
template <DeckOption E>
constexpr std::optional<E> parse_option(std::string_view name) {
  for (const auto& [v, n] : OptionNames<E>::table)
    if (n == name) return v;
  return std::nullopt;
}

// The names in the schema's constraint form "a|b|c".
template <DeckOption E>
std::string option_choices() {
  std::string s;
  for (const auto& [v, name] : OptionNames<E>::table) {
    if (!s.empty()) s += '|';
    s += name;
  }
  return s;
}

// run.resume: the run directory's newest checkpoint ("auto"), none ("never"), or a checkpoint path.
struct ResumeFrom {
  enum class Kind { Auto, Never, Path } kind = Kind::Auto;
  std::string path;  // Kind::Path

  static ResumeFrom parse(const std::string& text) {
    if (text == "auto") return {Kind::Auto, {}};
    if (text == "never") return {Kind::Never, {}};
    return {Kind::Path, text};
  }
  std::string name() const { return kind == Kind::Auto ? "auto" : kind == Kind::Never ? "never" : path; }
  bool operator==(const ResumeFrom&) const = default;
};

}  // namespace meshmoe
