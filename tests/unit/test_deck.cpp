// The input deck: defaults, types, constraints, --set, round trip, suggestions, all errors at once,
// cross-key checks, the bad-deck corpus (tests/decks/bad, expectations in `# expect:` lines),
// load_deck's broadcast, check_world_size and the markdown reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.hpp"
#include "deck/deck.hpp"
#include "deck/deck_changes.hpp"
#include "deck/schema.hpp"
#include "../test_util.hpp"

namespace fs = std::filesystem;
using namespace meshmoe;

namespace {

// All messages of the InputError that parsing throws, joined by newlines; "" when it parses.
std::string deck_errors(const std::string& text, const std::vector<std::string>& overrides = {},
                        const std::string& path = "deck.toml") {
  try {
    parse_deck(text, path, overrides);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

size_t count_of(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// tests/decks from the repository root (where make check runs) or relative to this source file.
fs::path decks_dir() {
  for (fs::path p : {fs::path("tests/decks"), fs::path(__FILE__).parent_path().parent_path() / "decks"})
    if (fs::is_directory(p)) return p;
  return {};
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<fs::path> decks_in(const std::string& sub) {
  std::vector<fs::path> v;
  const fs::path dir = decks_dir() / sub;
  if (!fs::is_directory(dir)) return v;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".toml") v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("deck: an empty deck takes every schema default", "[deck]") {
  const Deck d = parse_deck("", "empty.toml");
  CHECK(d.cfg == Config{});
  CHECK(d.path == "empty.toml");
  // A few defaults spelled out, so a changed schema.def shows up here.
  CHECK(d.cfg.run.name == "meshmoe");
  CHECK(d.cfg.mesh.data == 1);
  CHECK(d.cfg.moe.num_experts == 8);
  CHECK(d.cfg.moe.router == RouterKind::Top2);
  CHECK(d.cfg.optim.lr == 1e-3);
  CHECK(d.cfg.model.tied_embeddings == true);
  CHECK(d.cfg.model.layernorm_eps == 1e-5);
}

TEST_CASE("deck: every schema default satisfies its own constraint and the cross-key checks", "[deck]") {
  const auto& s = deck::schema();
  REQUIRE(s.size() > 50);
  for (const auto& k : s) {
    INFO(k.name());
    CHECK(k.constraint.check(k.default_value()).empty());
    CHECK(!k.doc.empty());
  }
  CHECK(deck::sections() == std::vector<std::string>{"run", "mesh", "model", "moe", "optim", "data", "eval", "checkpoint", "distill", "debug"});
}

TEST_CASE("deck: values of every type", "[deck]") {
  const Deck d = parse_deck(R"(
[run]
name = "tiny"
device = "cuda"
max_walltime = 3600       # an integer for a float key is accepted
[model]
tied_embeddings = false
dropout = 0.125
layernorm_eps = 1e-6
[optim]
lr = 3e-4
adafactor_eps = 1E-30
)",
                            "t.toml");
  CHECK(d.cfg.run.name == "tiny");
  CHECK(d.cfg.run.device == Device::Cuda);
  CHECK(d.cfg.run.max_walltime == 3600.0);
  CHECK(d.cfg.model.tied_embeddings == false);
  CHECK(d.cfg.model.dropout == 0.125);
  CHECK(d.cfg.model.layernorm_eps == 1e-6);
  CHECK(d.cfg.optim.lr == 3e-4);
  CHECK(d.cfg.optim.adafactor_eps == 1e-30);
  // Everything else keeps its default.
  CHECK(d.cfg.moe == Config{}.moe);
}

TEST_CASE("deck: every constraint form, at its boundaries", "[deck]") {
  using deck::Constraint;
  using deck::Value;
  struct Case {
    const char* constraint;
    Value v;
    bool ok;
  };
  const Case cases[] = {
      {"", Value(int64_t(-5)), true},
      {">=1", Value(int64_t(1)), true},
      {">=1", Value(int64_t(0)), false},
      {">=0", Value(0.0), true},
      {">=0", Value(-1e-300), false},
      {">0", Value(1e-300), true},
      {">0", Value(0.0), false},
      {"<=1", Value(1.0), true},
      {"<=1", Value(1.0000000000000002), false},
      {"<1", Value(0.9999999999999999), true},
      {"<1", Value(int64_t(1)), false},
      {"[0,1]", Value(0.0), true},
      {"[0,1]", Value(1.0), true},
      {"[0,1]", Value(-0.5), false},
      {"[0,1]", Value(1.5), false},
      {"[0,1)", Value(0.0), true},
      {"[0,1)", Value(1.0), false},
      {"(0,1]", Value(0.0), false},
      {"(0,1]", Value(1.0), true},
      {"a|b|c", Value(std::string("b")), true},
      {"a|b|c", Value(std::string("d")), false},
      {"a|b|c", Value(std::string("")), false},
  };
  for (const auto& c : cases) {
    INFO(c.constraint << " on " << deck::toml_value(c.v));
    CHECK(Constraint::parse(c.constraint).check(c.v).empty() == c.ok);
  }
  CHECK(Constraint::parse("[0,1)").describe(false) == "[0, 1)");
  CHECK(Constraint::parse(">=1").describe(false) == ">= 1");
  CHECK(Constraint::parse(">0").describe(false) == "> 0");
  CHECK(Constraint::parse("a|b").describe(true) == "`a`, `b`");
  CHECK_THROWS_AS(Constraint::parse("[0;1)"), std::logic_error);

  // The same forms through real keys of the schema.
  CHECK(deck_errors("run.log_every = 1").empty());                       // >=1
  CHECK(deck_errors("run.steps = 0").empty());                           // >=0
  CHECK(deck_errors("model.init_scale = 1e-9").empty());                 // >0
  CHECK(deck_errors("model.dropout = 0.999").empty());                   // [0,1)
  CHECK(deck_errors("optim.min_lr_ratio = 1").empty());                  // [0,1]
  CHECK(deck_errors("moe.second_expert = \"threshold\"").empty());       // choices
  CHECK(deck_errors("model.dropout = -0.1").find("model.dropout: out of range: must be in [0, 1), got -0.1") !=
        std::string::npos);
  CHECK(deck_errors("model.init_scale = 0").find("must be > 0, got 0.0") != std::string::npos);
}

TEST_CASE("deck: --set overrides", "[deck]") {
  const std::string file = "[moe]\nnum_experts = 4\n[run]\nname = \"from-file\"\n";
  SECTION("TOML values and bare strings") {
    const Deck d = parse_deck(file, "f.toml",
                              {"moe.num_experts=16", "optim.lr=1e-4", "model.tied_embeddings=false",
                               "run.out_dir=\"/tmp/x y\"", "run.name=bare", " run.max_walltime = 2 "});
    CHECK(d.cfg.moe.num_experts == 16);  // overrides beat the file
    CHECK(d.cfg.optim.lr == 1e-4);
    CHECK(d.cfg.model.tied_embeddings == false);
    CHECK(d.cfg.run.out_dir == "/tmp/x y");
    CHECK(d.cfg.run.name == "bare");
    CHECK(d.cfg.run.max_walltime == 2.0);
  }
  SECTION("a string key takes text that TOML reads otherwise as the string") {
    CHECK(parse_deck("", "f", {"run.name=123"}).cfg.run.name == "123");
    CHECK(parse_deck("", "f", {"run.name=true"}).cfg.run.name == "true");
    CHECK(parse_deck("", "f", {"run.name='lit'"}).cfg.run.name == "lit");
    CHECK(parse_deck("", "f", {"run.out_dir="}).cfg.run.out_dir.empty());
  }
  SECTION("the last override of a key wins") {
    CHECK(parse_deck("", "f", {"moe.num_experts=2", "moe.num_experts=16"}).cfg.moe.num_experts == 16);
  }
  SECTION("validated like file keys, located by the override") {
    const std::string e = deck_errors(file, {"moe.num_experts=eight", "model.dropout=1", "run.device=gpu",
                                             "moe.experts=2", "mooe.num_experts=2", "num_experts", "run.name=\"x"});
    CHECK_THAT(e, Catch::Contains("--set moe.num_experts=eight: moe.num_experts: expected an integer, got \"eight\""));
    CHECK_THAT(e, Catch::Contains("--set model.dropout=1: model.dropout: out of range: must be in [0, 1), got 1.0"));
    CHECK_THAT(e, Catch::Contains("--set run.device=gpu: run.device: must be one of cpu, cuda, got \"gpu\""));
    CHECK_THAT(e, Catch::Contains("--set moe.experts=2: moe.experts: unknown key; did you mean moe.num_experts?"));
    CHECK_THAT(e, Catch::Contains("--set mooe.num_experts=2: [mooe]: unknown section; did you mean [moe]?"));
    CHECK_THAT(e, Catch::Contains("--set num_experts: expected section.key=value"));
    CHECK_THAT(e, Catch::Contains("--set run.name=\"x: run.name: expected a string, got malformed TOML string"));
    CHECK(count_of(e, "\n") == 6);  // seven messages
  }
}

TEST_CASE("deck: effective_toml lists every key and round-trips unchanged", "[deck]") {
  std::vector<std::pair<std::string, std::vector<std::string>>> inputs = {
      {"", {}},
      // A free-form string key (run.name is restricted to a name's characters: see below).
      {"[data]\npath = \"quote\\\" back\\\\slash\\ttab \u00e9\"\n", {}},
      {"", {"optim.lr=0.30000000000000004", "moe.jitter_eps=1e-2", "optim.adafactor_eps=2.5e-300"}},
  };
  for (const auto& p : decks_in("good")) inputs.push_back({read_text(p), {}});
  REQUIRE(inputs.size() >= 5);
  for (const auto& [text, ov] : inputs) {
    INFO(text);
    const Deck a = parse_deck(text, "a.toml", ov);
    const Deck b = parse_deck(a.effective_toml, "b.toml");
    CHECK(b.cfg == a.cfg);
    CHECK(b.effective_toml == a.effective_toml);
    // Independent reading with toml++: every schema key present, in its section, nothing else.
    const toml::table t = toml::parse(a.effective_toml);
    size_t n = 0;
    for (auto&& [sec, node] : t) n += node.as_table()->size();
    CHECK(n == deck::schema().size());
    for (const auto& k : deck::schema()) CHECK(t[k.section][k.key].node() != nullptr);
  }
  const Deck q = parse_deck(inputs[1].first, "q.toml");
  CHECK(q.cfg.data.path == "quote\" back\\slash\ttab \u00e9");
  // run.name names a directory and a line of deck.toml: a quote, a tab, a '/' are refused.
  CHECK_THROWS_WITH(parse_deck("[run]\nname = \"quote\\\" back\\\\slash\\ttab \u00e9\"\n", "n.toml"),
                    Catch::Contains("run.name holds '\"' at character 6"));
  CHECK_THROWS_WITH(parse_deck("[run]\nname = \"a\\nb\"\n", "n.toml"), Catch::Contains("run.name holds a control character (0x0a)"));
  CHECK_THROWS_WITH(parse_deck("", "n.toml", {"run.name=a/b"}), Catch::Contains("run.name holds a '/' at character 2"));
  CHECK_THROWS_WITH(parse_deck("", "n.toml", {"run.name=\"\""}), Catch::Contains("run.name is empty"));
  CHECK(parse_deck("", "n.toml", {"run.name=m4-switch_tiny.v2+lr=3e-4"}).cfg.run.name == "m4-switch_tiny.v2+lr=3e-4");
  // Schema order: [run] first, [checkpoint] last, keys in schema.def order.
  const std::string e = parse_deck("", "x").effective_toml;
  CHECK(e.find("[run]\nname = ") < e.find("[mesh]\npipe = 1\ndata = 1\ntensor = 1\n"));
  CHECK(e.find("[mesh]") < e.find("[checkpoint]"));
}

TEST_CASE("deck: option keys hold their enum; the deck, --set and the effective deck their names", "[deck]") {
  // Every key whose constraint is a list of names: each name parses (file and --set alike) to a
  // Config value that reads back as that name and is echoed as it; a name that is not one of them
  // is refused, naming the choices.
  size_t option_keys = 0;
  for (const auto& k : deck::schema()) {
    if (k.constraint.kind != deck::Constraint::Kind::Choices) continue;
    ++option_keys;
    INFO(k.name());
    std::set<std::string> seen;
    Config last;
    for (const std::string& name : k.constraint.choices) {
      const Deck d = parse_deck("[" + k.section + "]\n" + k.key + " = \"" + name + "\"\n", "o.toml");
      CHECK(std::get<std::string>(k.get(d.cfg)) == name);
      CHECK(d.effective_toml.find("\n" + k.key + " = \"" + name + "\"\n") != std::string::npos);
      CHECK(parse_deck("", "o.toml", {k.name() + "=" + name}).cfg == d.cfg);
      CHECK(seen.insert(name).second);
      if (seen.size() > 1) CHECK(!(d.cfg == last));  // two names, two values
      last = d.cfg;
    }
    CHECK(seen.size() >= 2);
    CHECK_THAT(deck_errors("[" + k.section + "]\n" + k.key + " = \"no-such-name\"\n"),
               Catch::Contains(k.name() + ": must be one of " + k.constraint.describe(false)));
  }
  CHECK(option_keys == 18);  // moe.gate, model.norm, model.position and model.attention_kernel among them
  // The enums themselves, and the names that used to be checked where each was used.
  const Deck d = parse_deck(R"(
[run]
device = "cuda"
[model]
activation = "geglu"
recompute = "block"
precision = "bf16"
[moe]
router = "topk"
second_expert = "threshold"
expert_axis = "tensor"
[optim]
name = "adafactor"
schedule = "cosine"
[data]
tokenizer = "spm"
)", "e.toml");
  CHECK(d.cfg.run.device == Device::Cuda);
  CHECK(d.cfg.model.activation == Activation::Geglu);
  CHECK(d.cfg.model.recompute == Recompute::Block);
  CHECK(d.cfg.model.precision == Precision::Bf16);
  CHECK(Config{}.model.precision == Precision::Fp32);
  CHECK(d.cfg.moe.router == RouterKind::TopK);
  CHECK(d.cfg.moe.second_expert == SecondExpertPolicy::Threshold);
  CHECK(d.cfg.moe.expert_axis == ExpertAxis::Tensor);
  CHECK(d.cfg.optim.name == OptimizerKind::Adafactor);
  CHECK(d.cfg.optim.schedule == ScheduleKind::Cosine);
  CHECK(d.cfg.data.tokenizer == TokenizerKind::Spm);
  CHECK_THAT(deck_errors("[model]\nrecompute = \"all\""), Catch::Contains("model.recompute: must be one of none, block"));
  CHECK_THAT(deck_errors("[model]\nprecision = \"fp16\""), Catch::Contains("model.precision: must be one of fp32, bf16"));
  CHECK_THAT(deck_errors("[model]\nactivation = \"swish\""), Catch::Contains("model.activation: must be one of relu, gelu, geglu, swiglu"));
  CHECK_THAT(deck_errors("[moe]\nexpert_axis = \"pipe\""), Catch::Contains("moe.expert_axis: must be one of data, tensor"));
  CHECK_THAT(deck_errors("[optim]\nname = \"sgd\""), Catch::Contains("optim.name: must be one of adamw, adafactor"));
  CHECK_THAT(deck_errors("[optim]\nschedule = \"linear\""), Catch::Contains("optim.schedule: must be one of constant, rsqrt, cosine"));
  // run.resume: auto, never, or a checkpoint path, echoed as given.
  CHECK(Config{}.run.resume.kind == ResumeFrom::Kind::Auto);
  CHECK(parse_deck("[run]\nresume = \"never\"", "r.toml").cfg.run.resume.kind == ResumeFrom::Kind::Never);
  const Deck r = parse_deck("[run]\nresume = \"runs/a/ckpt/step_00000004.h5\"", "r.toml");
  CHECK(r.cfg.run.resume.kind == ResumeFrom::Kind::Path);
  CHECK(r.cfg.run.resume.path == "runs/a/ckpt/step_00000004.h5");
  CHECK(r.effective_toml.find("\nresume = \"runs/a/ckpt/step_00000004.h5\"\n") != std::string::npos);
}

TEST_CASE("deck: float values are written as the shortest TOML that reads back bit-exactly", "[deck]") {
  CHECK(deck::toml_value(deck::Value(1.0)) == "1.0");
  CHECK(deck::toml_value(deck::Value(1e-5)) == "1e-5");
  CHECK(deck::toml_value(deck::Value(1.25)) == "1.25");
  CHECK(deck::toml_value(deck::Value(1e22)) == "1e22");
  CHECK(deck::toml_value(deck::Value(-0.0)) == "-0.0");
  // Oracle: toml++'s own float parser, over random bit patterns.
  std::mt19937_64 rng(42);
  for (int i = 0; i < 2000; ++i) {
    uint64_t bits = rng();
    double x;
    std::memcpy(&x, &bits, sizeof x);
    if (!std::isfinite(x)) continue;
    const std::string s = deck::toml_value(deck::Value(x));
    INFO(s);
    const toml::table t = toml::parse("v = " + s);
    REQUIRE(t["v"].is_floating_point());
    CHECK(std::memcmp(&x, &t["v"].ref<double>(), sizeof x) == 0);
  }
}

TEST_CASE("deck: suggestions for misspelt keys and sections", "[deck]") {
  CHECK_THAT(deck_errors("[moe]\nexperts = 8"), Catch::Contains("moe.experts: unknown key; did you mean moe.num_experts?"));
  CHECK_THAT(deck_errors("[moe]\nnum_expert = 8"), Catch::Contains("did you mean moe.num_experts?"));
  CHECK_THAT(deck_errors("[optim]\nlearning_rat = 1"), Catch::EndsWith("optim.learning_rat: unknown key"));
  CHECK_THAT(deck_errors("[moe]\nseq_len = 8"), Catch::Contains("did you mean model.seq_len?"));
  // A near key inside the section wins over an equally near one elsewhere.
  CHECK_THAT(deck_errors("[eval]\nevry = 8"), Catch::Contains("did you mean eval.every?"));
  CHECK_THAT(deck_errors("[moe]\nevry = 8"), Catch::Contains("did you mean moe.every?"));
  CHECK_THAT(deck_errors("[optimizer]\nlr = 1"), Catch::Contains("[optimizer]: unknown section; did you mean [optim]?"));
  CHECK_THAT(deck_errors("[chekpoint]\nevery = 1"), Catch::Contains("did you mean [checkpoint]?"));
  CHECK_THAT(deck_errors("[training]\nsteps = 1"), !Catch::Contains("did you mean"));
  CHECK_THAT(deck_errors("[model]\nactivation = \"gelo\""), Catch::Contains("got \"gelo\"; did you mean \"gelu\"?"));
  // Errors carry file:line:col of the key.
  CHECK_THAT(deck_errors("\n\n[moe]\n   experts = 8", {}, "my/deck.toml"), Catch::StartsWith("my/deck.toml:4:4: moe.experts"));
}

TEST_CASE("deck: every error is reported at once, in file order, then --set, then cross-key", "[deck]") {
  const std::string text = R"([run]
nmae = "x"
log_every = 0
[model]
num_heads = "four"
d_model = 100
[moe]
num_experts = "eight"
router = "top3"
[optimizer]
lr = 1
)";
  std::vector<std::string> msgs;
  try {
    parse_deck(text, "d.toml", {"optim.lr=0", "mesh.pipe=3"});
  } catch (const InputError& e) {
    msgs = e.messages();
  }
  REQUIRE(msgs.size() == 9);
  CHECK_THAT(msgs[0], Catch::StartsWith("d.toml:2:1: run.nmae: unknown key; did you mean run.name?"));
  CHECK_THAT(msgs[1], Catch::StartsWith("d.toml:3:13: run.log_every: out of range"));
  CHECK_THAT(msgs[2], Catch::StartsWith("d.toml:5:13: model.num_heads: expected an integer, got string \"four\""));
  CHECK_THAT(msgs[3], Catch::StartsWith("d.toml:8:15: moe.num_experts: expected an integer"));
  CHECK_THAT(msgs[4], Catch::StartsWith("d.toml:9:10: moe.router: must be one of top1, top2, topk"));
  CHECK_THAT(msgs[5], Catch::StartsWith("d.toml:10:2: [optimizer]: unknown section"));
  CHECK_THAT(msgs[6], Catch::StartsWith("--set optim.lr=0: optim.lr: out of range: must be > 0"));
  // Cross-key: pipe 3 does not divide 4 layers, and 1F1B needs 3 micro-batches; the rules that use
  // model.num_heads, moe.num_experts or moe.router (which have their own errors) stay silent.
  CHECK_THAT(msgs[7], Catch::StartsWith("--set mesh.pipe=3: model.num_layers = 4 is not divisible by mesh.pipe = 3"));
  CHECK_THAT(msgs[8], Catch::StartsWith("--set mesh.pipe=3: mesh.pipe = 3 needs optim.micro_batches >= 3"));

  // After a TOML syntax error the --set values are still checked, but cross-key rules are not
  // judged on values the file may have set.
  msgs.clear();
  try {
    parse_deck("[optim]\nmicro_batches = 2\nlr = = 1\n", "s.toml", {"mesh.pipe=2", "moe.every=x"});
  } catch (const InputError& e) {
    msgs = e.messages();
  }
  REQUIRE(msgs.size() == 2);
  CHECK_THAT(msgs[0], Catch::StartsWith("s.toml:3:") && Catch::Contains("TOML syntax error"));
  CHECK_THAT(msgs[1], Catch::StartsWith("--set moe.every=x: moe.every: expected an integer"));
}

TEST_CASE("deck: cross-key checks, both sides of each rule", "[deck]") {
  struct Case {
    std::vector<std::string> set;
    const char* error;  // nullptr: must parse
  };
  const Case cases[] = {
      {{"model.d_model=96", "model.num_heads=3"}, nullptr},
      {{"model.d_model=96", "model.num_heads=5"}, "model.d_model = 96 is not divisible by model.num_heads = 5"},
      {{"mesh.tensor=2", "model.num_heads=2", "model.d_model=64"}, nullptr},
      {{"mesh.tensor=2", "model.num_heads=3", "model.d_model=96"}, "model.num_heads = 3 is not divisible by mesh.tensor = 2"},
      {{"mesh.tensor=2", "model.d_ff=100"}, nullptr},
      {{"mesh.tensor=2", "model.d_ff=101"}, "model.d_ff = 101 is not divisible by mesh.tensor = 2"},
      {{"mesh.tensor=2", "moe.expert_d_ff=102"}, nullptr},
      {{"mesh.tensor=2", "moe.expert_d_ff=101"}, "moe.expert_d_ff = 101 is not divisible by mesh.tensor = 2"},
      // Experts on the tensor axis are whole: their hidden width need not divide.
      {{"mesh.tensor=2", "moe.expert_d_ff=101", "moe.expert_axis=tensor"}, nullptr},
      {{"mesh.tensor=2", "moe.expert_d_ff=101", "moe.every=0"}, nullptr},
      {{"mesh.data=4", "moe.num_experts=4"}, nullptr},
      // Expert replicas: mesh.expert_parallel = 0 takes gcd(data, E) = 2 here (expert groups of 2).
      {{"mesh.data=4", "moe.num_experts=6"}, nullptr},
      {{"mesh.data=4", "moe.num_experts=6", "mesh.expert_parallel=2"}, nullptr},
      {{"mesh.data=4", "moe.num_experts=6", "mesh.expert_parallel=4"}, "moe.num_experts = 6 is not divisible by mesh.expert_parallel = 4"},
      {{"mesh.data=4", "moe.num_experts=6", "mesh.expert_parallel=3"}, "mesh.expert_parallel = 3 does not divide mesh.data = 4"},
      {{"mesh.data=4", "moe.num_experts=6", "mesh.expert_parallel=4", "moe.every=0"}, nullptr},
      {{"mesh.tensor=2", "moe.expert_axis=tensor", "mesh.expert_parallel=0"}, nullptr},
      {{"mesh.tensor=2", "moe.expert_axis=tensor", "mesh.expert_parallel=1"}, "mesh.expert_parallel = 1 needs moe.expert_axis = \"data\""},
      {{"mesh.data=4", "moe.num_experts=6", "moe.every=0"}, nullptr},
      {{"mesh.data=4", "moe.num_experts=6", "moe.expert_axis=tensor"}, nullptr},
      {{"mesh.tensor=4", "moe.num_experts=6", "moe.expert_axis=tensor"}, "moe.num_experts = 6 is not divisible by mesh.tensor = 4"},
      {{"mesh.pipe=2", "optim.micro_batches=2", "model.num_layers=6"}, nullptr},
      {{"mesh.pipe=4", "optim.micro_batches=4", "model.num_layers=6"}, "model.num_layers = 6 is not divisible by mesh.pipe = 4"},
      {{"mesh.data=2", "optim.micro_batches=4", "optim.batch_size=8", "moe.group_size=128"}, nullptr},
      {{"mesh.data=2", "optim.micro_batches=4", "optim.batch_size=12"}, "optim.batch_size = 12 is not divisible by mesh.data * optim.micro_batches = 2 * 4 = 8"},
      {{"optim.batch_size=1", "model.seq_len=100", "moe.group_size=50"}, nullptr},
      {{"optim.batch_size=1", "model.seq_len=100", "moe.group_size=40"}, "= 1 * 100 = 100, is not divisible by moe.group_size = 40"},
      {{"optim.batch_size=1", "model.seq_len=100", "moe.group_size=40", "moe.every=0"}, nullptr},
      {{"moe.every=4"}, nullptr},
      {{"moe.every=5"}, "moe.every = 5 is greater than model.num_layers = 4"},
      {{"moe.router=topk", "moe.top_k=8"}, nullptr},
      {{"moe.router=topk", "moe.top_k=9"}, "moe.top_k = 9 is greater than moe.num_experts = 8"},
      {{"moe.router=top2", "moe.top_k=9"}, nullptr},  // top_k only matters for topk
      {{"moe.router=top2", "moe.num_experts=2"}, nullptr},
      {{"moe.router=top2", "moe.num_experts=1"}, "moe.router = \"top2\" needs moe.num_experts >= 2"},
      {{"moe.router=top1", "moe.num_experts=1"}, nullptr},  // a 1-expert MoE
      {{"moe.router=topk", "moe.top_k=1", "moe.num_experts=1"}, nullptr},
      {{"mesh.pipe=2", "optim.micro_batches=2"}, nullptr},
      {{"mesh.pipe=2", "optim.micro_batches=1"}, "mesh.pipe = 2 needs optim.micro_batches >= 2"},
      {{"checkpoint.every=100", "checkpoint.keep_every=1000"}, nullptr},
      {{"checkpoint.every=0", "checkpoint.keep_every=150"}, nullptr},
      {{"checkpoint.every=100", "checkpoint.keep_every=150"}, "checkpoint.keep_every = 150 is not a multiple of checkpoint.every = 100"},
      {{"data.temperature=5"}, nullptr},
      {{"data.temperature=1", "data.shuffle=false"}, nullptr},
      {{"data.temperature=5", "data.shuffle=false"}, "data.temperature = 5.0 samples languages from each epoch's shuffled order: it needs data.shuffle = true"},
  };
  for (const auto& c : cases) {
    std::string what;
    for (const auto& s : c.set) what += s + " ";
    INFO(what);
    const std::string e = deck_errors("", c.set);
    if (c.error) {
      CHECK_THAT(e, Catch::Contains(c.error));
      CHECK(count_of(e, "\n") == 0);  // this one rule, nothing else
    } else {
      CHECK(e == "");
    }
  }
  // Placed at the file position of the first key the deck gave.
  CHECK_THAT(deck_errors("[model]\nnum_heads = 3\nd_model = 100\n"),
             Catch::StartsWith("deck.toml:3:11: model.d_model = 100 is not divisible"));
  CHECK_THAT(deck_errors("[moe]\nevery = 9\n"), Catch::StartsWith("deck.toml:2:9: moe.every = 9 is greater"));
  // With neither key given (a schema default changed) only the file is named.
  CHECK_THAT(deck_errors("", {"mesh.pipe=2"}), Catch::StartsWith("--set mesh.pipe=2: mesh.pipe = 2 needs"));
}

TEST_CASE("deck: bad-deck corpus (tests/decks/bad, `# expect:` lines)", "[deck]") {
  REQUIRE(!decks_dir().empty());
  const auto decks = decks_in("bad");
  REQUIRE(decks.size() >= 30);
  for (const auto& p : decks) {
    const std::string name = p.filename().string();
    INFO("deck " << p.string());
    const std::string text = read_text(p);
    std::vector<std::string> expect, expect_not, overrides;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      auto after = [&](const char* tag) -> std::optional<std::string> {
        if (line.rfind(tag, 0) != 0) return std::nullopt;
        return line.substr(std::strlen(tag));
      };
      if (auto s = after("# expect: ")) expect.push_back(*s);
      if (auto s = after("# expect-not: ")) expect_not.push_back(*s);
      if (auto s = after("# set: ")) overrides.push_back(*s);
    }
    REQUIRE(!expect.empty());  // a case without an expectation tests nothing
    bool threw = false;
    std::string got;
    try {
      parse_deck(text, name, overrides);
    } catch (const InputError& e) {
      threw = true;
      got = e.what();
    }
    INFO("errors:\n" << got);
    CHECK(threw);
    for (const auto& x : expect) CHECK_THAT(got, Catch::Contains(x));
    for (const auto& x : expect_not) CHECK_THAT(got, !Catch::Contains(x));
  }
}

TEST_CASE("deck: good decks parse", "[deck]") {
  const auto decks = decks_in("good");
  REQUIRE(decks.size() >= 4);
  for (const auto& p : decks) {
    INFO(p.string());
    CHECK_NOTHROW(parse_deck(read_text(p), p.string()));
  }
  const Deck d = parse_deck(read_text(decks_dir() / "good/switch_2x2.toml"), "s.toml");
  CHECK(d.cfg.mesh.data == 2);
  CHECK(d.cfg.moe.router == RouterKind::Top1);
  CHECK(d.cfg.moe.capacity_factor_train == 1.0);
  CHECK(d.cfg.moe.no_token_left_behind);
}

TEST_CASE("deck: load_deck gives every rank the same deck or the same error", "[deck][mpi]") {
  const int rank = test::world_rank();
  REQUIRE(!decks_dir().empty());
  SECTION("a good deck, with an override") {
    const std::string path = (decks_dir() / "good/switch_2x2.toml").string();
    const Deck d = load_deck(path, {"run.steps=3"}, MPI_COMM_WORLD);
    CHECK(d.cfg.run.steps == 3);
    CHECK(d.path == path);
    CHECK(d.effective_toml == parse_deck(read_text(path), path, {"run.steps=3"}).effective_toml);
    // Same text on every rank: compare lengths and a checksum with rank 0's.
    long long sum[2] = {(long long)d.effective_toml.size(), 0};
    for (unsigned char c : d.effective_toml) sum[1] = sum[1] * 131 + c;
    long long root[2] = {sum[0], sum[1]};
    MPI_Bcast(root, 2, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    CHECK(root[0] == sum[0]);
    CHECK(root[1] == sum[1]);
  }
  SECTION("a bad deck: every rank throws rank 0's messages") {
    const std::string path = (decks_dir() / "bad/many_errors.toml").string();
    std::vector<std::string> want;
    try {
      parse_deck(read_text(path), path);
    } catch (const InputError& e) {
      want = e.messages();
    }
    REQUIRE(want.size() == 5);
    std::vector<std::string> got;
    try {
      load_deck(path, {}, MPI_COMM_WORLD);
    } catch (const InputError& e) {
      got = e.messages();
    }
    CHECK(got == want);
  }
  SECTION("a bad override") {
    const std::string path = (decks_dir() / "good/empty.toml").string();
    CHECK_THROWS_WITH(load_deck(path, {"moe.num_experts=0"}, MPI_COMM_WORLD),
                      Catch::Contains("--set moe.num_experts=0: moe.num_experts: out of range: must be >= 1, got 0"));
  }
  SECTION("a missing file and a directory are named") {
    CHECK_THROWS_WITH(load_deck("/nonexistent/deck.toml", {}, MPI_COMM_WORLD),
                      "/nonexistent/deck.toml: cannot read the input deck: No such file or directory");
    CHECK_THROWS_WITH(load_deck(decks_dir().string(), {}, MPI_COMM_WORLD), Catch::Contains("it is a directory"));
  }
  // Nothing is left in flight: a collective after all that still matches up.
  int one = 1, n = 0;
  MPI_Allreduce(&one, &n, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(n == test::world_size());
  (void)rank;
}

TEST_CASE("deck: check_world_size names both numbers", "[deck]") {
  Config c;
  c.mesh.data = 2;
  c.mesh.tensor = 2;
  CHECK_NOTHROW(check_world_size(c, 4));
  CHECK_THROWS_WITH(check_world_size(c, 3),
                    Catch::StartsWith("mesh pipe*data*tensor = 1x2x2 = 4 ranks, but the job has 3 ranks (mpirun -np / srun --ntasks)"));
  CHECK_THROWS_AS(check_world_size(Config{}, 2), InputError);
}

TEST_CASE("deck: the markdown reference has one table per section and a row per key", "[deck]") {
  const std::string md = deck_reference_markdown();
  for (const auto& s : deck::sections()) CHECK_THAT(md, Catch::Contains("\n### [" + s + "]\n"));
  CHECK(count_of(md, "| key | type | default | allowed | meaning |") == deck::sections().size());
  size_t rows = 0;
  std::istringstream lines(md);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    ++rows;
    // Five cells: six unescaped bars.
    size_t bars = 0;
    for (size_t i = 0; i < line.size(); ++i) bars += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
    INFO(line);
    CHECK(bars == 6);
  }
  CHECK(rows == deck::schema().size());
  CHECK_THAT(md, Catch::Contains("| `activation` | string | `\"relu\"` | `relu`, `gelu`, `geglu`, `swiglu` |"));
  CHECK_THAT(md, Catch::Contains("| `dropout` | float | `0.0` | [0, 1) |"));
  CHECK_THAT(md, Catch::Contains("| `layernorm_eps` | float | `1e-5` | > 0 |"));
  // Markdown specials in the docs are escaped: runs/<name> must not read as an HTML tag.
  CHECK_THAT(md, Catch::Contains("runs/\\<name>"));
  CHECK(count_of(md, "<") == count_of(md, "\\<"));
  CHECK(count_of(md, "*") == count_of(md, "\\*"));
}

TEST_CASE("deck: run.max_memory takes a byte size with K/M/G/T suffixes; anything else names file and line", "[deck]") {
  CHECK(parse_deck("[run]\nmax_memory = \"24G\"\n", "f.toml").cfg.run.max_memory == "24G");
  CHECK(parse_deck("", "f.toml").cfg.run.max_memory.empty());
  CHECK(deck_errors("[run]\nmax_memory = \"512M\"\n").empty());
  const std::string e = deck_errors("[run]\nsteps = 2\nmax_memory = \"12X\"\n");
  CHECK_THAT(e, Catch::Contains("deck.toml:3:14: run.max_memory = \"12X\": unknown suffix 'x'"));
  CHECK_THAT(deck_errors("", {"run.max_memory=0G"}),
             Catch::Contains("--set run.max_memory=0G: run.max_memory = \"0G\": must be positive"));
  CHECK_THAT(deck_errors("", {"run.max_memory=lots"}), Catch::Contains("run.max_memory = \"lots\": expected a whole number"));
}

TEST_CASE("deck: the changes of a resumed deck, and which of them change the training", "[deck]") {
  const Deck before = parse_deck("[optim]\nlr = 0.01\n", "a.toml");
  CHECK(deck_changes(before.cfg, before.cfg).empty());
  const Deck after = parse_deck("[optim]\nlr = 0.005\n[run]\nsteps = 300\nseed = 7\n[mesh]\ndata = 2\n"
                                "[model]\nd_model = 64\n[eval]\nevery = 3\n",
                                "b.toml", {"data.path=x.h5", "moe.router=top1"});
  std::vector<std::string> training, other;
  for (const DeckChange& c : deck_changes(before.cfg, after.cfg)) (c.changes_training ? training : other).push_back(c.key);
  // schema order
  CHECK(training == std::vector<std::string>{"run.seed", "model.d_model", "moe.router", "optim.lr"});
  CHECK(other == std::vector<std::string>{"run.steps", "mesh.data", "data.path", "eval.every"});
  const std::string lines = describe_changes(deck_changes(before.cfg, after.cfg), true);
  CHECK(lines.find("\n  optim.lr: 0.01 -> 0.005") != std::string::npos);
  CHECK(lines.find("\n  moe.router: \"top2\" -> \"top1\"") != std::string::npos);
  CHECK(lines.find("run.steps") == std::string::npos);
}

// The blocks of today's MoE models (docs/ARCHITECTURE.md "Blocks"): their keys and errors.
TEST_CASE("deck: model.norm, model.position, model.rope_base, swiglu and moe.first_dense", "[deck][blocks]") {
  const Deck d = parse_deck("[model]\nnorm = \"rmsnorm\"\nposition = \"rope\"\nrope_base = 1e6\nactivation = \"swiglu\"\n"
                            "[moe]\nfirst_dense = 1\n",
                            "blocks.toml");
  CHECK(d.cfg.model.norm == NormKind::RmsNorm);
  CHECK(d.cfg.model.position == PositionKind::Rope);
  CHECK(d.cfg.model.rope_base == 1e6);
  CHECK(d.cfg.model.activation == Activation::Swiglu);
  CHECK(d.cfg.moe.first_dense == 1);
  const Deck defaults = parse_deck("", "empty.toml");
  CHECK(defaults.cfg.model.norm == NormKind::LayerNorm);
  CHECK(defaults.cfg.model.position == PositionKind::Learned);
  CHECK(defaults.cfg.model.rope_base == 10000.0);
  CHECK(defaults.cfg.moe.first_dense == 0);
  CHECK_THAT(deck_errors("[model]\nnorm = \"batchnorm\""), Catch::Contains("model.norm: must be one of layernorm, rmsnorm"));
  CHECK_THAT(deck_errors("[model]\nposition = \"alibi\""), Catch::Contains("model.position: must be one of learned, rope"));
  CHECK_THAT(deck_errors("[model]\nrope_base = 0"), Catch::Contains("model.rope_base"));
  CHECK_THAT(deck_errors("[model]\nposition = \"rope\"\nd_model = 12\nnum_heads = 4"),
             Catch::Contains("the head width model.d_model = 12 / model.num_heads = 4 = 3 must be even"));
  CHECK(deck_errors("[model]\nposition = \"rope\"\nd_model = 16\nnum_heads = 4").empty());
  CHECK_THAT(deck_errors("[model]\nnum_layers = 4\n[moe]\nevery = 2\nfirst_dense = 4"),
             Catch::Contains("moe.first_dense = 4 leaves no MoE layer"));
  CHECK(deck_errors("[model]\nnum_layers = 4\n[moe]\nevery = 2\nfirst_dense = 3").empty());
  CHECK(deck_errors("[model]\nnum_layers = 4\n[moe]\nevery = 0\nfirst_dense = 9").empty());  // dense: nothing to leave
}

// A decoding command's deck (docs/user-guide.md "Translation"): the keys only training reads are
// not checked, the model's and the mesh's are; `given` says which keys the file or --set gave, where.
TEST_CASE("deck: a deck checked for decoding skips the training rules; the keys given and where", "[deck]") {
  const auto errors = [](const std::vector<std::string>& set, DeckUse use) {
    try {
      parse_deck("", "d.toml", set, use);
      return std::string();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
  };
  for (const std::vector<std::string>& training_only :
       {std::vector<std::string>{"mesh.pipe=2", "optim.micro_batches=1"},
        {"mesh.data=3", "optim.batch_size=8"},
        {"optim.batch_size=1", "model.seq_len=100", "moe.group_size=40"},
        {"run.max_walltime=0.5"},
        {"run.grad_bucket_mb=0.00001"},
        {"checkpoint.every=100", "checkpoint.keep_every=150"},
        {"data.temperature=5", "data.shuffle=false"}}) {
    INFO(training_only.front());
    CHECK(errors(training_only, DeckUse::Train) != "");
    CHECK(errors(training_only, DeckUse::Decode) == "");
  }
  // The model's rules on the mesh, and every key's own range, hold for decoding too.
  CHECK_THAT(errors({"mesh.tensor=3"}, DeckUse::Decode), Catch::Contains("model.num_heads = 4 is not divisible by mesh.tensor = 3"));
  CHECK_THAT(errors({"mesh.pipe=3"}, DeckUse::Decode), Catch::Contains("model.num_layers = 4 is not divisible by mesh.pipe = 3"));
  CHECK_THAT(errors({"optim.micro_batches=0"}, DeckUse::Decode), Catch::Contains("optim.micro_batches"));
  CHECK_THAT(errors({"run.max_memory=lots"}, DeckUse::Decode), Catch::Contains("run.max_memory"));

  const Deck d = parse_deck("[model]\nd_model = 64\n", "d.toml", {"mesh.data=2"});
  CHECK(d.given.size() == 2);
  CHECK(d.given.at("model.d_model") == "d.toml:2:11: ");
  CHECK_THAT(d.given.at("mesh.data"), Catch::StartsWith("--set mesh.data=2"));
}
