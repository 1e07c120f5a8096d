// The input deck: TOML text (toml++) -> validated Config, --set overrides, cross-key checks,
// effective deck, rank-0 read + broadcast. Every problem is collected and thrown together.
#include "deck/deck.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.hpp"
#include "core/sizes.hpp"
#include "deck/schema.hpp"
#include "deck/shape_rules.hpp"

namespace meshmoe {
namespace {

// The shortest run.max_walltime (docs/user-guide.md "Faults"): below it not even a tiny model's
// start, step and checkpoint fit; a longer one that a large model cannot use ends in exit 1 before
// its first step (run/run_checkpoints.hpp), not in a requeue loop.
constexpr double kMinWalltimeSeconds = 1.0;

using deck::KeySpec;
using deck::KeyType;
using deck::Value;

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::string describe_node(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string " + deck::toml_string(*n.value<std::string>());
    case toml::node_type::integer: return "integer " + std::to_string(*n.value<int64_t>());
    case toml::node_type::floating_point: return "float " + deck::toml_value(Value(*n.value<double>()));
    case toml::node_type::boolean: return std::string("boolean ") + (*n.value<bool>() ? "true" : "false");
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

const char* expected(KeyType t) {
  switch (t) {
    case KeyType::Int: return "expected an integer";
    case KeyType::Float: return "expected a number";
    case KeyType::Bool: return "expected a boolean (true or false)";
    case KeyType::String: return "expected a string";
  }
  return "";
}

// The value of a TOML node as the key's type, or the reason it is not one (type, then constraint).
std::variant<Value, std::string> convert(const KeySpec& k, const toml::node& n) {
  Value v;
  switch (k.type) {
    case KeyType::Int:
      if (!n.is_integer()) return std::string(expected(k.type)) + ", got " + describe_node(n);
      v = *n.value<int64_t>();
      break;
    case KeyType::Float:
      // TOML keeps 1 and 1.0 apart; a float key accepts both.
      if (n.is_integer()) v = double(*n.value<int64_t>());
      else if (n.is_floating_point()) v = *n.value<double>();
      else return std::string(expected(k.type)) + ", got " + describe_node(n);
      if (!std::isfinite(std::get<double>(v))) return "expected a finite number, got " + describe_node(n);
      break;
    case KeyType::Bool:
      if (!n.is_boolean()) return std::string(expected(k.type)) + ", got " + describe_node(n);
      v = *n.value<bool>();
      break;
    case KeyType::String:
      if (!n.is_string()) return std::string(expected(k.type)) + ", got " + describe_node(n);
      v = *n.value<std::string>();
      break;
  }
  if (std::string why = k.constraint.check(v); !why.empty()) return why;
  return v;
}

// The nearest valid key to section.key: same section preferred on ties; a key that contains the
// typed one (or the other way round) counts as close. Empty when nothing is close.
std::string suggest_key(const std::string& section, const std::string& key) {
  const KeySpec* best = nullptr;
  std::pair<size_t, int> best_score{0, 0};
  for (const auto& k : deck::schema()) {
    size_t d = deck::edit_distance(key, k.key);
    if (key.size() >= 3 && (k.key.find(key) != std::string::npos || key.find(k.key) != std::string::npos))
      d = std::min<size_t>(d, 1);
    const std::pair<size_t, int> score{d, k.section == section ? 0 : 1};
    if (!best || score < best_score) best = &k, best_score = score;
  }
  if (best && best_score.first <= std::max<size_t>(2, key.size() / 3)) return best->name();
  return "";
}

std::string suggest_section(const std::string& section) {
  std::string best;
  size_t best_d = 0;
  for (const auto& s : deck::sections()) {
    size_t d = deck::edit_distance(section, s);
    if (section.size() >= 3 && (s.find(section) != std::string::npos || section.find(s) != std::string::npos))
      d = std::min<size_t>(d, 1);
    if (best.empty() || d < best_d) best = s, best_d = d;
  }
  return best_d <= std::max<size_t>(1, section.size() / 3) ? best : "";
}

std::string did_you_mean(const std::string& s) { return s.empty() ? "" : "; did you mean " + s + "?"; }

std::string section_list() {
  std::string s;
  for (const auto& x : deck::sections()) s += (s.empty() ? "[" : ", [") + x + "]";
  return s;
}

struct Diag {
  int group;  // 0 file, 1 --set, 2 cross-key: file problems in file order come first
  uint32_t line, col;
  std::string msg;
};

class Parser {
 public:
  explicit Parser(std::string path) : path_(std::move(path)) {}

  void parse_text(const std::string& text) {
    toml::table root;
    try {
      root = toml::parse(text, path_);
    } catch (const toml::parse_error& e) {
      const auto& b = e.source().begin;
      add(0, b.line, b.column, at(b) + "TOML syntax error: " + std::string(e.description()));
      syntax_error_ = true;
      return;
    }
    for (auto&& [name, node] : root) {
      const std::string sec(name.str());
      const auto& b = name.source().begin;
      if (!node.is_table()) {
        if (deck::is_section(sec)) {
          add(0, b.line, b.column, at(b) + sec + ": expected a section [" + sec + "], got " + describe_node(node));
        } else {
          add(0, b.line, b.column,
              at(b) + sec + ": keys belong in a section (" + section_list() + ")" + did_you_mean(suggest_key("", sec)));
        }
        continue;
      }
      if (!deck::is_section(sec)) {
        const std::string s = suggest_section(sec);
        add(0, b.line, b.column,
            at(b) + "[" + sec + "]: unknown section" + (s.empty() ? "" : "; did you mean [" + s + "]?") +
                " (sections: " + section_list() + ")");
        continue;
      }
      for (auto&& [kname, value] : *node.as_table()) {
        const std::string key(kname.str());
        const auto& kb = kname.source().begin;
        const KeySpec* spec = deck::find_key(sec, key);
        if (!spec) {
          add(0, kb.line, kb.column, at(kb) + sec + "." + key + ": unknown key" + did_you_mean(suggest_key(sec, key)));
          continue;
        }
        const auto& vb = value.source().begin;
        set(*spec, convert(*spec, value), 0, vb.line, vb.column, at(vb));
      }
    }
  }

  void apply_override(const std::string& ov) {
    const std::string loc = "--set " + ov + ": ";
    const size_t eq = ov.find('=');
    const std::string name = override_key(ov);
    const size_t dot = name.find('.');
    if (eq == std::string::npos || dot == std::string::npos) {
      add(1, 0, 0, loc + "expected section.key=value (e.g. --set moe.num_experts=16)");
      return;
    }
    const std::string sec = name.substr(0, dot), key = name.substr(dot + 1);
    if (!deck::is_section(sec)) {
      const std::string s = suggest_section(sec);
      add(1, 0, 0,
          loc + "[" + sec + "]: unknown section" + (s.empty() ? "" : "; did you mean [" + s + "]?") + " (sections: " +
              section_list() + ")");
      return;
    }
    const KeySpec* spec = deck::find_key(sec, key);
    if (!spec) {
      add(1, 0, 0, loc + name + ": unknown key" + did_you_mean(suggest_key(sec, key)));
      return;
    }
    const std::string raw = trim(ov.substr(eq + 1));
    // The value is read as a TOML value (16, 1e-3, true, "x"); a string key also takes bare text.
    std::optional<toml::table> parsed;
    try {
      parsed = toml::parse("v = " + raw);
    } catch (const toml::parse_error&) {
    }
    const toml::node* node = parsed && parsed->size() == 1 ? parsed->get("v") : nullptr;
    std::variant<Value, std::string> v;
    if (node && (spec->type != KeyType::String || node->is_string())) {
      v = convert(*spec, *node);
    } else if (spec->type == KeyType::String && !raw.empty() && (raw[0] == '"' || raw[0] == '\'')) {
      v = std::string("expected a string, got malformed TOML string ") + raw;
    } else if (spec->type == KeyType::String) {
      v = convert(*spec, toml::value<std::string>(raw));
    } else {
      v = std::string(expected(spec->type)) + ", got \"" + raw + "\"";
    }
    set(*spec, v, 1, 0, 0, loc);
  }

  void cross_checks(DeckUse use);
  const std::map<std::string, std::string>& given() const { return where_; }

  std::vector<std::string> messages() {
    std::stable_sort(diags_.begin(), diags_.end(), [](const Diag& a, const Diag& b) {
      if (a.group != b.group) return a.group < b.group;
      if (a.group != 0) return false;
      return std::pair(a.line, a.col) < std::pair(b.line, b.col);
    });
    std::vector<std::string> m;
    for (auto& d : diags_) m.push_back(d.msg);
    return m;
  }

  Config cfg;

 private:
  std::string at(const toml::source_position& p) const {
    return path_ + ":" + std::to_string(p.line) + ":" + std::to_string(p.column) + ": ";
  }
  void add(int group, uint32_t line, uint32_t col, std::string msg) {
    diags_.push_back(Diag{group, line, col, std::move(msg)});
  }
  void set(const KeySpec& k, const std::variant<Value, std::string>& v, int group, uint32_t line, uint32_t col,
           const std::string& loc) {
    if (const auto* why = std::get_if<std::string>(&v)) {
      add(group, line, col, loc + k.name() + ": " + *why);
      bad_.insert(k.name());
      return;
    }
    k.set(cfg, std::get<Value>(v));
    bad_.erase(k.name());  // a valid --set repairs a bad file value for the cross-key checks
    where_[k.name()] = loc;
  }

  // A cross-key rule over `keys`; skipped when one of them already has its own error. The message
  // is placed at the first of the keys that the deck or --set gave.
  void rule(const std::vector<const char*>& keys, bool ok, const std::string& msg) {
    for (const char* k : keys)
      if (bad_.count(k)) return;
    if (ok) return;
    std::string loc = path_ + ": ";
    for (const char* k : keys)
      if (auto it = where_.find(k); it != where_.end()) {
        loc = it->second;
        break;
      }
    add(2, 0, 0, loc + msg);
  }

  std::string path_;
  bool syntax_error_ = false;  // the file's values are unknown: no cross-key verdicts on guesses
  std::vector<Diag> diags_;
  std::set<std::string> bad_;                   // keys whose value was rejected
  std::map<std::string, std::string> where_;    // key -> "file:line:col: " or "--set ...: "
};

std::string kv(const char* name, int64_t v) { return std::string(name) + " = " + std::to_string(v); }

// What is wrong with run.name as the name of a run directory, "" when nothing: it becomes
// runs/<name>, a line of deck.toml and an attribute of metrics.h5.
std::string run_name_problem(const std::string& name) {
  if (name.empty()) return "is empty (the run would write into runs/ itself)";
  if (name.size() > 200) return "is longer than 200 characters";
  if (name[0] == '.') return "starts with '.' (a hidden or parent directory)";
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (std::isalnum(c) || std::strchr("._-+=@,:%", c)) continue;
    char what[48];
    if (c == '/') std::snprintf(what, sizeof what, "a '/'");
    else if (c == ' ') std::snprintf(what, sizeof what, "a space");
    else if (c < 0x20 || c == 0x7f) std::snprintf(what, sizeof what, "a control character (0x%02x)", c);
    else if (c >= 0x80) std::snprintf(what, sizeof what, "a non-ASCII byte");
    else std::snprintf(what, sizeof what, "'%c'", c);
    return "holds " + std::string(what) + " at character " + std::to_string(i + 1);
  }
  return "";
}

void Parser::cross_checks(DeckUse use) {
  if (syntax_error_) return;
  // A decoding command reads the model, the data and the decoding keys: the rules of keys only
  // training reads (the batch, micro-batches, buckets, wall time, checkpoints) are not its concern.
  const bool training = use == DeckUse::Train;
  if (const std::string why = run_name_problem(cfg.run.name); !why.empty())
    rule({"run.name"}, false,
         "run.name " + why + ": a run name is letters, digits and ._-+=@,:% (it names the run directory runs/<name>)");
  bool out_dir_control = false;
  for (char ch : cfg.run.out_dir) out_dir_control |= static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f;
  rule({"run.out_dir"}, !out_dir_control, "run.out_dir holds a control character (a newline?)");
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  const auto& mesh = cfg.mesh;
  const auto& o = cfg.optim;
  const bool moe_layers = e.every > 0;

  // The divisibility rules of the mesh (shape_rules.hpp, shared with the shape table).
  for (const ShapeRule& r : shape_rules(cfg, mesh.pipe, mesh.data, mesh.tensor))
    if (training || !r.batch) rule(r.keys, r.ok, r.message);
  rule({"moe.every", "model.num_layers"}, e.every <= m.num_layers,
       kv("moe.every", e.every) + " is greater than " + kv("model.num_layers", m.num_layers) +
           ": no layer would be an MoE layer (moe.every = 0 makes a dense model)");
  if (moe_layers && e.every <= m.num_layers)
    rule({"moe.first_dense", "moe.every", "model.num_layers"}, (m.num_layers / e.every) * e.every > e.first_dense,
         kv("moe.first_dense", e.first_dense) + " leaves no MoE layer: with " + kv("moe.every", e.every) + " and " +
             kv("model.num_layers", m.num_layers) + " the last MoE block is block " +
             std::to_string((m.num_layers / e.every) * e.every - 1) + " (set moe.first_dense below " +
             std::to_string((m.num_layers / e.every) * e.every) + ", or moe.every = 0 for a dense model)");
  if (m.position == PositionKind::Rope && m.num_heads > 0 && m.d_model % m.num_heads == 0)
    rule({"model.position", "model.d_model", "model.num_heads"}, (m.d_model / m.num_heads) % 2 == 0,
         "model.position = \"rope\" rotates pairs of a head's dimensions: the head width " + kv("model.d_model", m.d_model) +
             " / " + kv("model.num_heads", m.num_heads) + " = " + std::to_string(m.d_model / m.num_heads) +
             " must be even");
  if (m.kv_heads > 0 && m.arch == ModelArch::EncDec)
    rule({"model.kv_heads", "model.arch"}, m.kv_heads == m.num_heads,
         kv("model.kv_heads", m.kv_heads) + " with model.arch = \"encdec\": grouped-query attention is built for the "
         "decoder-only model (the cross-attention has num_heads key/value heads); remove model.kv_heads or set it to " +
             kv("model.num_heads", m.num_heads));
  rule({"model.attention_kernel", "model.arch"},
       m.attention_kernel != AttentionKernel::Fused || m.arch != ModelArch::EncDec,
       "model.attention_kernel = \"fused\" with model.arch = \"encdec\": the cross-attention has no fused path "
       "(it would keep its [B, heads, T, T] probabilities); use model.attention_kernel = \"plain\"");
  if (moe_layers && e.router == RouterKind::TopK)
    rule({"moe.top_k", "moe.num_experts", "moe.router"}, e.top_k <= e.num_experts,
         kv("moe.top_k", e.top_k) + " is greater than " + kv("moe.num_experts", e.num_experts) +
             " (moe.router = \"topk\" sends each token to top_k different experts)");
  if (moe_layers && e.router == RouterKind::Top2)
    rule({"moe.router", "moe.num_experts"}, e.num_experts >= 2,
         "moe.router = \"top2\" needs moe.num_experts >= 2, got " + kv("moe.num_experts", e.num_experts) +
             " (use moe.router = \"top1\" for a 1-expert MoE)");
  if (moe_layers && e.router == RouterKind::ExpertChoice) {
    // Each expert takes its top-C tokens of the group (docs/user-guide.md "Expert-choice routing"): C = S would
    // send every token to every expert, no choice overflows, and the loads are equal by construction.
    const std::string ec = "moe.router = \"expert_choice\" ";
    rule({"moe.router", "moe.dropless"}, !e.dropless,
         ec + "does not combine with moe.dropless = true (every expert would take every token): set moe.dropless = false "
              "and size the experts' share with moe.capacity_factor_train");
    rule({"moe.router", "moe.no_token_left_behind"}, !e.no_token_left_behind,
         ec + "does not combine with moe.no_token_left_behind = true (no choice overflows an expert): set it false");
    rule({"moe.router", "moe.balance"}, e.balance != BalanceKind::Bias,
         ec + "does not combine with moe.balance = \"bias\" (every expert takes the same number of tokens): use "
              "moe.balance = \"aux_loss\" (expert choice adds no aux loss)");
  }
  if (moe_layers && e.gate != MoeGate::Softmax)
    rule({"moe.gate", "moe.router"}, e.router != RouterKind::ExpertChoice,
         "moe.gate = \"" + std::string(option_name(e.gate)) +
             "\" does not combine with moe.router = \"expert_choice\" (each expert ranks the tokens by their softmax "
             "probability over all experts): use moe.router = \"topk\", or moe.gate = \"softmax\"");
  if (moe_layers && e.gate == MoeGate::Sigmoid)
    rule({"moe.gate", "moe.z_loss_coef"}, e.z_loss_coef == 0.0,
         "moe.gate = \"sigmoid\" does not combine with moe.z_loss_coef = " + deck::toml_value(e.z_loss_coef) +
             " (the z-loss is the softmax router's logsumexp, ST-MoE section 3.3): set moe.z_loss_coef = 0");
  if (training && mesh.pipe > 1)
    rule({"mesh.pipe", "optim.micro_batches"}, o.micro_batches >= mesh.pipe,
         kv("mesh.pipe", mesh.pipe) + " needs optim.micro_batches >= " + std::to_string(mesh.pipe) + ", got " +
             kv("optim.micro_batches", o.micro_batches) + " (the 1F1B schedule keeps every stage busy)");
  if (training) {
    rule({"run.max_walltime"}, cfg.run.max_walltime == 0 || cfg.run.max_walltime >= kMinWalltimeSeconds,
         "run.max_walltime = " + deck::toml_value(cfg.run.max_walltime) + " s leaves no time for a step and a checkpoint: "
             "either 0 (no limit) or at least " + std::to_string(int(kMinWalltimeSeconds)) + " s");
    rule({"run.grad_bucket_mb"}, cfg.run.grad_bucket_mb == 0 || cfg.run.grad_bucket_mb >= 1e-4,
         "run.grad_bucket_mb = " + deck::toml_value(cfg.run.grad_bucket_mb) +
             " is too small: either 0 (no overlap) or in [0.0001, 65536] MiB");
    rule({"run.cuda_graphs", "optim.name"}, !cfg.run.cuda_graphs || o.name == OptimizerKind::AdamW,
         "run.cuda_graphs = true captures AdamW's update, not optim.name = \"" + std::string(option_name(o.name)) +
             "\"'s (its sums over the ranks holding a parameter's other blocks run between its launches): set "
             "optim.name = \"adamw\" or run.cuda_graphs = false");
    rule({"optim.shard_state", "run.grad_bucket_mb"}, !(o.shard_state && cfg.run.grad_bucket_mb > 0),
         "optim.shard_state = true does not combine with run.grad_bucket_mb = " + deck::toml_value(cfg.run.grad_bucket_mb) +
             " (the buckets all-reduce the gradients that sharded state reduce-scatters): set run.grad_bucket_mb = 0");
    rule({"data.temperature", "data.shuffle"}, cfg.data.shuffle || cfg.data.temperature == 1.0,
         "data.temperature = " + deck::toml_value(cfg.data.temperature) +
             " samples languages from each epoch's shuffled order: it needs data.shuffle = true (or data.temperature = 1)");
  }
  if (!cfg.run.max_memory.empty()) {
    std::string why;
    const bool ok = parse_byte_size(cfg.run.max_memory, &why).has_value();
    rule({"run.max_memory"}, ok,
         "run.max_memory = " + deck::toml_string(cfg.run.max_memory) + ": " + why);
  }
  if (!training) return;
  const auto& ev = cfg.eval;
  if (ev.bleu_every > 0) {
    rule({"eval.bleu_every", "eval.bleu_examples", "eval.examples_per_language"},
         ev.bleu_examples > 0 || ev.examples_per_language > 0,
         kv("eval.bleu_every", ev.bleu_every) +
             " translates the first eval.bleu_examples validation pairs of every language: set eval.bleu_examples "
             "(or eval.examples_per_language) > 0");
  }
  const auto& c = cfg.checkpoint;
  if (c.every > 0 && c.keep_every > 0)
    rule({"checkpoint.keep_every", "checkpoint.every"}, c.keep_every % c.every == 0,
         kv("checkpoint.keep_every", c.keep_every) + " is not a multiple of " + kv("checkpoint.every", c.every) +
             " (checkpoints are written only every checkpoint.every steps)");
}

std::string effective_toml(const Config& cfg) {
  std::string out = "# meshmoe effective deck: every key with the value in force (defaults and --set included)\n";
  std::string section;
  for (const auto& k : deck::schema()) {
    if (k.section != section) {
      section = k.section;
      out += "\n[" + section + "]\n";
    }
    out += k.key + " = " + deck::toml_value(k.get(cfg)) + "\n";
  }
  return out;
}

std::string read_deck_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path + ": cannot read the input deck: it is a directory");
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw InputError(path + ": cannot read the input deck: " + std::strerror(errno));
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f);
  const int err = errno;
  std::fclose(f);
  if (failed) throw InputError(path + ": cannot read the input deck: " + std::strerror(err));
  return text;
}

}  // namespace

std::string override_key(const std::string& override_text) {
  return trim(override_text.substr(0, override_text.find('=')));
}

Deck parse_deck(const std::string& text, const std::string& path, const std::vector<std::string>& overrides,
                DeckUse use) {
  Parser p(path);
  p.parse_text(text);
  for (const auto& ov : overrides) p.apply_override(ov);
  p.cross_checks(use);
  if (auto msgs = p.messages(); !msgs.empty()) throw InputError(std::move(msgs));
  Deck d;
  d.cfg = p.cfg;
  d.path = path;
  d.effective_toml = effective_toml(d.cfg);
  d.given = p.given();
  return d;
}

Deck load_deck(const std::string& path, const std::vector<std::string>& overrides, MPI_Comm comm, DeckUse use) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // header: {ok, payload bytes}; payload: the deck text, or the messages separated by '\0'.
  long long header[2] = {0, 0};
  std::string payload;
  Deck deck;
  if (rank == 0) {
    try {
      payload = read_deck_file(path);
      deck = parse_deck(payload, path, overrides, use);
      header[0] = 1;
    } catch (const InputError& e) {
      payload.clear();
      for (const auto& m : e.messages()) payload += m + '\0';
    } catch (const std::exception& e) {
      payload = path + ": " + e.what() + '\0';
    }
    if (header[0] && payload.size() > size_t(1) << 30) {
      header[0] = 0;
      payload = path + ": the input deck is larger than 1 GiB" + '\0';
    }
    header[1] = (long long)payload.size();
  }
  MPI_Bcast(header, 2, MPI_LONG_LONG, 0, comm);
  payload.resize(size_t(header[1]));
  MPI_Bcast(payload.data(), int(header[1]), MPI_CHAR, 0, comm);
  if (!header[0]) {
    std::vector<std::string> msgs;
    std::string cur;
    for (char ch : payload) {
      if (ch == '\0') msgs.push_back(std::move(cur)), cur.clear();
      else cur += ch;
    }
    if (!cur.empty()) msgs.push_back(cur);
    throw InputError(std::move(msgs));
  }
  // Every rank parses the same text the same way; rank 0 already has.
  if (rank != 0) deck = parse_deck(payload, path, overrides, use);
  return deck;
}

void check_world_size(const Config& cfg, int world_size) {
  const auto& m = cfg.mesh;
  const int64_t need = m.pipe * m.data * m.tensor;
  if (need == world_size) return;
  throw InputError("mesh pipe*data*tensor = " + std::to_string(m.pipe) + "x" + std::to_string(m.data) + "x" +
                   std::to_string(m.tensor) + " = " + std::to_string(need) + " rank" + (need == 1 ? "" : "s") +
                   ", but the job has " + std::to_string(world_size) + " rank" + (world_size == 1 ? "" : "s") +
                   " (mpirun -np / srun --ntasks); launch " + std::to_string(need) +
                   " ranks or change [mesh] (e.g. --set mesh.data=...)");
}

std::string deck_reference_markdown() {
  // A table cell: '|' would end the cell, '<' could open an HTML tag (runs/<name>), '*' emphasis.
  auto cell = [](const std::string& s) {
    std::string out;
    for (char ch : s) {
      if (ch == '|' || ch == '<' || ch == '*') out += '\\';
      out += ch;
    }
    return out;
  };
  std::ostringstream md;
  md << "An input deck is a TOML file with one table per section below; a key left out takes its default, "
        "and an unknown key, a wrong type or a value out of range is an error that names the file, line and "
        "key. `--set section.key=value` overrides any key from the command line (repeatable). An integer is "
        "accepted for a float key. Every run stores its effective deck (all keys) as deck.toml in its run directory.\n";
  std::string section;
  for (const auto& k : deck::schema()) {
    if (k.section != section) {
      section = k.section;
      md << "\n### [" << section << "]\n\n";
      md << "| key | type | default | allowed | meaning |\n";
      md << "| --- | --- | --- | --- | --- |\n";
    }
    md << "| `" << k.key << "` | " << deck::type_name(k.type) << " | `" << cell(deck::toml_value(k.default_value()))
       << "` | " << cell(k.constraint.describe(true)) << " | " << cell(k.doc) << " |\n";
  }
  return md.str();
}

}  // namespace meshmoe
