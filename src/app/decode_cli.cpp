#include "app/decode_cli.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "core/error.hpp"
#include "decode/decoder.hpp"
#include "mesh/agree.hpp"

namespace meshmoe {

int generate_main(const Deck& deck, Mesh& mesh, const GenerateCliOptions& opt) {
  if (deck.cfg.model.arch == ModelArch::EncDec)
    throw InputError("generate continues a prompt with a decoder-only model; an encoder-decoder (model.arch = \"encdec\") "
                     "translates a source: use `meshmoe translate`");
  Decoder d = load_decoder(deck, mesh, opt.checkpoint);
  const int32_t tag = language_tag(d.tokenizer, opt.lang, deck.cfg.data.path);
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : opt.prompts) {
    std::vector<int32_t>& ids = prompts.emplace_back(1, tag);
    d.tokenizer.encode(p, ids);
    if (int(ids.size()) > d.model->shape().seq_len)
      throw InputError("a prompt of " + std::to_string(ids.size()) + " tokens is longer than model.seq_len = " +
                       std::to_string(d.model->shape().seq_len));
  }
  const auto out = generate(*d.cached, prompts, Tokenizer::kEos, opt.sampling);
  if (mesh.rank() == 0)
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%s\n", opt.prompts[i].c_str(), one_line(d.tokenizer, out[i]).c_str());
  std::fflush(stdout);
  return kExitOk;
}

int translate_main(const Deck& deck, Mesh& mesh, const TranslateCliOptions& opt) {
  if (opt.beam.beam < 1 || opt.batch < 1 || opt.beam.max_len < 1)
    throw InputError("translate: --beam, --batch and --max-len must be >= 1");
  Decoder d = load_decoder(deck, mesh, opt.checkpoint);
  const int32_t tag = language_tag(d.tokenizer, opt.lang, deck.cfg.data.path);
  // Rank 0 reads the sources, every rank holds them.
  std::string text;
  agree_on_input(mesh.world(), [&] {
    if (mesh.rank() != 0) return;
    const bool stdin_input = opt.input.empty() || opt.input == "-";
    std::ifstream file;
    if (!stdin_input) {
      file.open(opt.input, std::ios::binary);
      if (!file) throw InputError("translate: cannot read --input " + opt.input);
    }
    std::istream& in = stdin_input ? std::cin : file;
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  });
  text = mesh.world_comm().broadcast_string(std::move(text), 0);
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    at = end + 1;
  }
  const int seq_len = d.model->shape().seq_len;
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
      translate_batches(*d.cached, mesh.axis(Axis::Data), d.tokenizer, work, opt.beam, {}, print);
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
