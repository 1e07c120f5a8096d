#include "app/eval_cli.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "app/decode_cli.hpp"
#include "core/error.hpp"
#include "decode/decode_memory.hpp"
#include "core/timers.hpp"
#include "data/batcher.hpp"
#include "deck/shape_rules.hpp"
#include "decode/decoder.hpp"
#include "decode/translation_eval.hpp"
#include "io/h5.hpp"
#include "io/output_file.hpp"
#include "mesh/agree.hpp"
#include "parallel/pipeline_executor.hpp"
#include "train/evaluate.hpp"
#include "run/run_data.hpp"

namespace meshmoe {

namespace fs = std::filesystem;

std::string default_eval_path(const std::string& checkpoint, int64_t step) {
  const fs::path file(checkpoint);
  fs::path dir = file.parent_path();
  if (dir.filename() == "ckpt") dir = dir.parent_path();
  return (dir / ("eval-" + std::to_string(step) + ".h5")).string();
}

namespace {

// The languages to translate: indices into the dataset's table, in its order.
std::vector<size_t> chosen_languages(const std::vector<std::string>& names, const std::vector<std::string>& wanted,
                                     const std::string& data_path) {
  std::vector<size_t> which;
  if (wanted.empty()) {
    which.resize(names.size());
    std::iota(which.begin(), which.end(), size_t(0));
    return which;
  }
  for (const std::string& w : wanted) {
    const auto at = std::find(names.begin(), names.end(), w);
    if (at == names.end()) {
      std::string all;
      for (const std::string& l : names) all += (all.empty() ? "" : ", ") + l;
      throw InputError("--langs " + w + ": not a language of the dataset " + data_path + " (" + all + ")");
    }
    which.push_back(size_t(at - names.begin()));
  }
  std::sort(which.begin(), which.end());
  which.erase(std::unique(which.begin(), which.end()), which.end());
  return which;
}

// The validation batches on this mesh: the deck's (optim.batch_size sequences in
// optim.micro_batches over the data ranks) where they split so; else each batch in one micro-batch
// padded with rows without a target (train/evaluate.hpp) to the fewest rows that split over the
// data ranks in whole routing groups: the same examples and routing groups as the training mesh's
// (the decoding mesh need not be the training mesh), so the same loss up to the order of its sums.
struct EvaluationBatches {
  Config cfg;
  int rows = 0;  // 0: optim.batch_size
};
EvaluationBatches evaluation_batches(const Config& cfg, const MeshShape& mesh, bool talk) {
  const auto fits = [&](const Config& c) {
    for (const ShapeRule& r : shape_rules(c, mesh.pipe, mesh.data, mesh.tensor))
      if (r.batch && !r.ok) return false;
    return true;
  };
  if (fits(cfg)) return {cfg, 0};
  EvaluationBatches e{cfg, 0};
  e.cfg.optim.micro_batches = 1;
  Config padded = e.cfg;
  while (!fits(padded)) ++padded.optim.batch_size;  // ends by mesh.data x moe.group_size
  e.rows = int(padded.optim.batch_size);
  if (talk)
    std::fprintf(stderr, "meshmoe eval: note: optim.batch_size = %lld in %lld micro-batches does not split over mesh %s: "
                 "each validation batch padded to %d rows without targets (the same examples and loss)\n",
                 (long long)cfg.optim.batch_size, (long long)cfg.optim.micro_batches, mesh.str().c_str(), e.rows);
  return e;
}

// Rank 0's result file, checked (never one of the inputs, never another kind of file: src/io/output_file.hpp)
// and created under its temporary name before the long work, so that a bad path fails at once.
h5::File create_output(const std::string& path, const std::vector<std::string>& inputs, ReplacingFile& out, Mesh& mesh) {
  h5::File file;
  agree_on_input(mesh.world(), [&] {
    if (mesh.rank() != 0) return;
    check_output_path(path, {"eval", "-o", inputs, {"meshmoe eval"}});
    out = ReplacingFile(path);
    try {
      file = h5::File::create(out.temporary());
    } catch (const std::exception& e) {
      throw InputError("eval: cannot create the output file " + path + " (" + e.what() + ")");
    }
  });
  return file;
}

// --write-text DIR: DIR is made when missing (its parent never is), each <lang>.src/.ref/.hyp of the
// chosen languages checked as an output file (never an input, an existing one only when it holds
// text), all before the long work.
void check_text_outputs(const std::string& dir, const std::vector<std::string>& names, const std::vector<size_t>& which,
                        const std::vector<std::string>& inputs, Mesh& mesh) {
  agree_on_input(mesh.world(), [&] {
    if (mesh.rank() != 0) return;
    const std::string what = "eval: --write-text " + dir;
    const fs::path parent = fs::path(dir).parent_path();
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0 && (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)))
      throw InputError(what + " exists and is not a directory (give another --write-text)");
    if (!parent.empty() && !fs::is_directory(parent))
      throw InputError(what + ": cannot create it: its directory " + parent.string() +
                       " does not exist (a command never creates it: make it first)");
    if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
      throw InputError(what + ": cannot create the directory (" + std::strerror(errno) + ")");
    for (size_t l : which)
      for (const char* ext : {".src", ".ref", ".hyp"})
        check_output_path((fs::path(dir) / (names[l] + ext)).string(), {"eval", "--write-text", inputs, {}, true});
  });
}

// Rank 0 alone writes these, so a failure is a warning (throwing would leave the others decoding);
// through a temporary and a rename, as every output (src/io/output_file.hpp).
void write_lines(const fs::path& path, const std::vector<std::string>& lines) {
  try {
    std::string text;
    for (const std::string& s : lines) text += s + '\n';
    replace_text_file(path.string(), text);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshmoe: warning: cannot write %s: %s\n", path.c_str(), e.what());
  }
}

template <typename T>
void dataset(h5::Group& g, const std::string& name, const std::vector<T>& values, const std::string& units,
             const std::string& description, const h5::Dims& shape = {}) {
  h5::Dataset d = shape.empty() ? g.write(name, values) : g.write(name, values, shape);
  d.set_attr("units", units);
  d.set_attr("description", description);
}

struct Row {
  size_t lang;
  std::string name;
  int64_t train_examples, trained_tokens;
  double loss, loss_tokens;
  TranslationScore score;
};

void write_result(h5::File& file, const std::vector<Row>& rows, const Evaluation& e, const TranslationScore& all,
                  const Decoder& d, const Deck& deck, Mesh& mesh, const EvalCliOptions& opt, const std::string& version) {
  const Config& cfg = deck.cfg;
  std::string langs;
  for (const Row& r : rows) langs += (langs.empty() ? "" : ",") + r.name;
  file.set_attr("created_by", "meshmoe eval " + version);
  file.set_attr("checkpoint", d.checkpoint);
  file.set_attr("step", d.meta.step);
  file.set_attr("beam", int64_t(opt.beam.beam));
  file.set_attr("alpha", opt.beam.alpha);
  file.set_attr("max_len", int64_t(opt.beam.max_len));
  file.set_attr("max_examples", opt.max_examples);
  file.set_attr("mesh", mesh.shape().str());
  file.set_attr("data_path", cfg.data.path);
  file.set_attr("languages", langs);
  file.set_attr("run_name", cfg.run.name);
  file.set_attr("valid_loss", e.loss());
  file.set_attr("valid_tokens", e.tokens);
  file.set_attr("bleu", all.bleu_score());
  file.set_attr("chrf", all.chrf_score());
  file.set_attr("sentences", all.sentences);
  file.set_attr("scores", std::string("BLEU: SacreBLEU's corpus BLEU (13a tokens, n-grams 1-4, brevity penalty, exp smoothing); "
                                      "chrF: character 1- to 6-grams without whitespace, beta = 2"));
  file.write_string("deck", deck.effective_toml).set_attr("description", std::string("the effective deck"));
  h5::Group g = file.create_group("languages");
  const size_t n = rows.size();
  auto column = [&](auto get) {
    using V = decltype(get(rows.front()));
    std::vector<V> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = get(rows[i]);
    return v;
  };
  std::vector<std::string> names = column([](const Row& r) { return r.name; });
  g.write_strings("name", names).set_attr("description", std::string("the language of each row (its tag)"));
  dataset(g, "train_examples", column([](const Row& r) { return r.train_examples; }), "examples",
          "training pairs of the language in the dataset (/languages/train_pairs)");
  dataset(g, "trained_tokens", column([](const Row& r) { return r.trained_tokens; }), "tokens",
          "target tokens the run trained on in the language up to the checkpoint (-1: not recorded)");
  dataset(g, "valid_loss", column([](const Row& r) { return r.loss; }), "nats/token",
          "validation cross-entropy of the language over the run's evaluation sample (eval.*; NaN: no token)");
  dataset(g, "valid_tokens", column([](const Row& r) { return r.loss_tokens; }), "tokens",
          "target tokens of the language in the evaluation sample");
  dataset(g, "bleu", column([](const Row& r) { return r.score.bleu_score(); }), "BLEU (0-100)",
          "corpus BLEU of the language's translations (NaN: no sentence)");
  dataset(g, "chrf", column([](const Row& r) { return r.score.chrf_score(); }), "chrF (0-100)",
          "corpus chrF2 of the language's translations (NaN: no sentence)");
  dataset(g, "sentences", column([](const Row& r) { return r.score.sentences; }), "sentences",
          "validation pairs translated and scored");
  dataset(g, "too_long", column([](const Row& r) { return r.score.too_long; }), "sentences",
          "of them, sources longer than the model reads (decoder-only: empty translation; encdec: cut)");
  dataset(g, "translate_time", column([](const Row& r) { return r.score.seconds; }), "s",
          "wall time of decoding its batches, each on its data group, summed");
  dataset(g, "hyp_len", column([](const Row& r) { return r.score.bleu.hyp_len; }), "tokens", "13a tokens of the translations");
  dataset(g, "ref_len", column([](const Row& r) { return r.score.bleu.ref_len; }), "tokens", "13a tokens of the references");
  std::vector<int64_t> matches, totals;
  for (const Row& r : rows)
    for (int k = 0; k < kBleuOrder; ++k) matches.push_back(r.score.bleu.matches[size_t(k)]), totals.push_back(r.score.bleu.totals[size_t(k)]);
  dataset(g, "bleu_matches", matches, "n-grams", "clipped n-gram matches, n = 1..4 (the BLEU statistics)",
          h5::Dims{int64_t(n), kBleuOrder});
  dataset(g, "bleu_totals", totals, "n-grams", "n-grams of the translations, n = 1..4", h5::Dims{int64_t(n), kBleuOrder});
  file.flush();
}

}  // namespace

int eval_main(const Deck& deck, Mesh& mesh, const EvalCliOptions& opt, const std::string& version) {
  const Config& cfg = deck.cfg;
  check_beam_options("eval", opt.beam, opt.batch);
  if (opt.max_examples < 0)
    throw InputError("eval: --max-examples " + std::to_string(opt.max_examples) + ": must be an integer >= 0 (0: all)");
  Decoder d = load_decoder(deck, mesh, opt.checkpoint);
  const std::vector<std::string>& names = d.tokenizer.languages();
  const std::vector<size_t> which = chosen_languages(names, opt.langs, cfg.data.path);
  const int seq_len = d.model->shape().seq_len;
  BeamOptions beam = opt.beam;
  beam.max_len = capped_by_seq_len(beam.max_len, seq_len, BeamOptions{}.max_len, "eval", "--max-len", mesh.rank());
  check_decode_memory(cfg, d.model->shape().vocab, {opt.batch, beam.beam, beam.max_len, seq_len},
                      "eval --beam " + std::to_string(beam.beam) + " --batch " + std::to_string(opt.batch), mesh);
  const std::vector<TextPairs> pairs = validation_pairs(d.valid, d.tokenizer, opt.max_examples);
  const Dataset eval_set = eval_subset(d.valid, cfg.eval.examples_per_language);
  check_examples_fit(eval_set, int(cfg.model.seq_len), cfg.model.arch);
  const std::string out_path = opt.output.empty() ? default_eval_path(d.checkpoint, d.meta.step) : opt.output;
  ReplacingFile out;  // rank 0's
  h5::File file = create_output(out_path, {d.checkpoint, cfg.data.path, deck.path}, out, mesh);
  if (!opt.write_text.empty()) check_text_outputs(opt.write_text, names, which, {d.checkpoint, cfg.data.path, deck.path}, mesh);
  const bool talk = mesh.rank() == 0;
  if (talk)
    std::fprintf(stderr, "meshmoe eval: %s (step %lld) on mesh %s -> %s\n", d.checkpoint.c_str(), (long long)d.meta.step,
                 mesh.shape().str().c_str(), out_path.c_str());

  // The validation loss: the training run's evaluation (eval.examples_per_language or eval.batches).
  double start = wall_seconds();
  PhaseTimers timers;
  PipelineExecutor pipeline(*d.model, mesh, timers, cfg.model.recompute);
  const EvaluationBatches batches = evaluation_batches(cfg, mesh.shape(), talk);
  const Evaluation e = evaluate(eval_set, names.size(), batches.cfg, d.meta.step, *d.model, pipeline, mesh,
                                [] { return 0; }, batches.rows);
  if (talk)
    std::fprintf(stderr, "meshmoe eval: validation loss %.4f over %.0f tokens (%.1f s)\n", e.loss(), e.tokens,
                 wall_seconds() - start);

  size_t done_count = 0;
  const auto done = [&](size_t l, const TranslationScore& s, const std::vector<std::string>& hyp) {
    ++done_count;
    if (!talk) return;
    std::fprintf(stderr, "meshmoe eval: [%zu/%zu] %s: %lld sentences, BLEU %.2f, chrF %.2f (%.1f s)\n", done_count,
                 which.size(), names[l].c_str(), (long long)s.sentences, s.bleu_score(), s.chrf_score(), s.seconds);
    if (opt.write_text.empty()) return;
    const fs::path dir(opt.write_text);
    write_lines(dir / (names[l] + ".src"), pairs[l].sources);
    write_lines(dir / (names[l] + ".ref"), pairs[l].references);
    write_lines(dir / (names[l] + ".hyp"), hyp);
  };
  const std::vector<TranslationScore> scores =
      translate_and_score(*d.cached, mesh.axis(Axis::Data), d.tokenizer, pairs, which, beam, opt.batch, {}, done);

  std::vector<Row> rows;
  TranslationScore all;
  const std::vector<double> lang_loss = e.lang_loss();
  for (size_t l : which) {
    const int64_t trained = l < d.meta.lang_tokens.size() ? d.meta.lang_tokens[l] : -1;
    const int64_t train_examples = l < d.valid.info().train_pairs.size() ? d.valid.info().train_pairs[l] : 0;
    rows.push_back({l, names[l], train_examples, trained, lang_loss[l], e.lang_tokens[l], scores[l]});
    all += scores[l];
  }
  std::string error;
  if (talk) try {
      write_result(file, rows, e, all, d, deck, mesh, opt, version);
      file.close();
      out.commit();
    } catch (const std::exception& x) {
      error = "cannot write " + out_path + ": " + x.what();
    }
  if (const std::string why = first_error(error, mesh.world()); !why.empty()) throw AgreedFailure(why);
  if (!talk) return kExitOk;

  // The table, languages by training examples (largest first), as GShard's figure 6 orders them.
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.train_examples > b.train_examples; });
  std::printf("# %s, step %lld, beam %d; BLEU (SacreBLEU 13a) and chrF2 of the validation pairs\n", d.checkpoint.c_str(),
              (long long)d.meta.step, opt.beam.beam);
  std::printf("%-10s %12s %14s %10s %10s %8s %8s\n", "language", "train pairs", "trained tokens", "valid loss",
              "sentences", "BLEU", "chrF");
  for (const Row& r : rows)
    std::printf("%-10s %12lld %14lld %10.4f %10lld %8.2f %8.2f\n", r.name.c_str(), (long long)r.train_examples,
                (long long)r.trained_tokens, r.loss, (long long)r.score.sentences, r.score.bleu_score(), r.score.chrf_score());
  std::printf("%-10s %12s %14s %10.4f %10lld %8.2f %8.2f\n", "all", "", "", e.loss(), (long long)all.sentences,
              all.bleu_score(), all.chrf_score());
  std::printf("# written to %s\n", out_path.c_str());
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace meshmoe
