#include "decode/decode_cli.hpp"

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
  // Rank 0 reads the sources, every rank decodes them all.
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
  text = broadcast_string(text, 0, mesh.world());
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
  // A batch at a time, printed as it is done.
  for (size_t first = 0; first < lines.size(); first += size_t(opt.batch)) {
    const size_t last = std::min(lines.size(), first + size_t(opt.batch));
    const std::vector<std::string> chunk(lines.begin() + long(first), lines.begin() + long(last));
    const auto warn = [&](size_t i, size_t tokens) {
      if (mesh.rank() != 0) return;
      if (encdec)
        std::fprintf(stderr, "meshmoe: warning: input line %zu: %zu tokens; the encoder reads its first model.seq_len = %d, as in training\n",
                     first + i + 1, tokens, seq_len);
      else
        std::fprintf(stderr, "meshmoe: warning: input line %zu: %zu tokens leave no room in model.seq_len = %d; its translation is empty\n",
                     first + i + 1, tokens, seq_len);
    };
    const std::vector<std::string> out = translate_lines(*d.cached, d.tokenizer, tag, chunk, opt.beam, opt.batch, warn);
    if (mesh.rank() != 0) continue;
    for (const std::string& s : out) std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }
  return kExitOk;
}

}  // namespace meshmoe
