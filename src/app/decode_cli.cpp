#include "app/decode_cli.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "app/text_input.hpp"
#include "core/error.hpp"
#include "decode/decode_memory.hpp"
#include "decode/decoder.hpp"
#include "mesh/agree.hpp"

namespace meshmoe {

namespace {

// "--top-p 5: must be in (0, 1]" (every rank parses the same options: every rank throws alike).
void require(bool ok, const std::string& command, const std::string& option, double value, const std::string& range) {
  if (ok) return;
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  throw InputError(command + ": " + option + " " + text + ": must be " + range);
}

}  // namespace

int capped_by_seq_len(int value, int seq_len, int default_value, const std::string& command, const std::string& option,
                      int rank) {
  if (value <= seq_len) return value;
  if (rank == 0 && value != default_value)
    std::fprintf(stderr, "meshmoe: %s: %s %d capped at model.seq_len = %d (no position lies beyond it)\n", command.c_str(),
                 option.c_str(), value, seq_len);
  return seq_len;
}

void check_sampling_options(const SamplingOptions& s) {
  require(s.max_new >= 1, "generate", "--max-new", s.max_new, "an integer >= 1");
  require(std::isfinite(s.temperature) && s.temperature >= 0, "generate", "--temperature", s.temperature,
          "finite and >= 0 (0: greedy)");
  require(s.top_k >= 0, "generate", "--top-k", s.top_k, "an integer >= 0 (0: all tokens)");
  require(s.top_p > 0 && s.top_p <= 1, "generate", "--top-p", s.top_p, "in (0, 1]");
}

void check_beam_options(const std::string& command, const BeamOptions& b, int batch) {
  require(b.beam >= 1, command, "--beam", b.beam, "an integer >= 1 (1: greedy)");
  require(std::isfinite(b.alpha) && b.alpha >= 0, command, "--alpha", b.alpha, "finite and >= 0 (0: no length normalisation)");
  require(b.max_len >= 1, command, "--max-len", b.max_len, "an integer >= 1");
  require(batch >= 1, command, "--batch", batch, "an integer >= 1");
}

int generate_main(const Deck& deck, Mesh& mesh, const GenerateCliOptions& opt) {
  if (deck.cfg.model.arch == ModelArch::EncDec)
    throw InputError("generate continues a prompt with a decoder-only model; an encoder-decoder (model.arch = \"encdec\") "
                     "translates a source: use `meshmoe translate`");
  check_sampling_options(opt.sampling);
  Decoder d = load_decoder(deck, mesh, opt.checkpoint);
  const int32_t tag = language_tag(d.tokenizer, opt.lang, deck.cfg.data.path);
  const int seq_len = d.model->shape().seq_len;
  std::vector<std::vector<int32_t>> prompts;
  size_t longest = 1;
  for (const std::string& p : opt.prompts) {
    std::vector<int32_t>& ids = prompts.emplace_back(1, tag);
    d.tokenizer.encode(p, ids);
    if (int(ids.size()) > seq_len)
      throw InputError("a prompt of " + std::to_string(ids.size()) + " tokens is longer than model.seq_len = " +
                       std::to_string(seq_len));
    longest = std::max(longest, ids.size());
  }
  SamplingOptions sampling = opt.sampling;
  sampling.max_new = capped_by_seq_len(sampling.max_new, seq_len, SamplingOptions{}.max_new, "generate", "--max-new", mesh.rank());
  check_decode_memory(deck.cfg, d.model->shape().vocab, {int(prompts.size()), 1, sampling.max_new, int(longest)},
                      "generate of " + std::to_string(prompts.size()) + " prompts", mesh);
  const auto out = generate(*d.cached, prompts, Tokenizer::kEos, sampling);
  if (mesh.rank() == 0)
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%s\n", opt.prompts[i].c_str(), one_line(d.tokenizer, out[i]).c_str());
  std::fflush(stdout);
  return kExitOk;
}

int translate_main(const Deck& deck, Mesh& mesh, const TranslateCliOptions& opt) {
  check_beam_options("translate", opt.beam, opt.batch);
  Decoder d = load_decoder(deck, mesh, opt.checkpoint);
  const int32_t tag = language_tag(d.tokenizer, opt.lang, deck.cfg.data.path);
  const int seq_len = d.model->shape().seq_len;
  BeamOptions beam = opt.beam;
  beam.max_len = capped_by_seq_len(beam.max_len, seq_len, BeamOptions{}.max_len, "translate", "--max-len", mesh.rank());
  check_decode_memory(deck.cfg, d.model->shape().vocab, {opt.batch, beam.beam, beam.max_len, seq_len},
                      "translate --beam " + std::to_string(beam.beam) + " --batch " + std::to_string(opt.batch), mesh);
  // Rank 0 reads the sources, every rank holds them.
  std::string text;
  agree_on_input(mesh.world(), [&] {
    if (mesh.rank() != 0) return;
    text = read_text_input(opt.input.empty() ? "-" : opt.input, "translate --input");
  });
  text = mesh.world_comm().broadcast_string(std::move(text), 0);
  const std::vector<std::string> lines = split_lines(text);
  const bool encdec = d.model->encdec();
  // The batches split over the data ranks (docs/user-guide.md "The device mesh and parallelism"); rank 0 prints them in input order as
  // they arrive.
  const auto print = [&](size_t, const BatchTranslation& t) {
    if (mesh.rank() != 0) return;
    for (size_t i = 0; i < t.text.size(); ++i) std::printf("%s\n", t.text[i].c_str());
    std::fflush(stdout);
  };
  const std::vector<LineBatch> work = line_batches(tag, lines, opt.batch);
  const std::vector<BatchTranslation> out =
      translate_batches(*d.cached, mesh.axis(Axis::Data), d.tokenizer, work, beam, {}, print);
  if (mesh.rank() != 0) return kExitOk;
  for (size_t b = 0; b < out.size(); ++b)
    for (size_t i = 0; i < out[b].too_long.size(); ++i) {
      const size_t line = work[b].first + i + 1, tokens = out[b].too_long[i];
      if (tokens == 0) continue;
      if (encdec)
        std::fprintf(stderr, "meshmoe: warning: input line %zu: %zu tokens; the encoder reads its first model.seq_len = %d, as in training\n",
                     line, tokens, seq_len);
      else
        std::fprintf(stderr, "meshmoe: warning: input line %zu: %zu tokens leave no room in model.seq_len = %d; its translation is empty\n",
                     line, tokens, seq_len);
    }
  return kExitOk;
}

}  // namespace meshmoe
