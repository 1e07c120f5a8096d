#include "decode/decode_cli.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "core/error.hpp"
#include "data/tokenizer.hpp"
#include "mesh/agree.hpp"
#include "parallel/pipeline_executor.hpp"
#include "train/checkpoint.hpp"
#include "train/checkpoint_cli.hpp"
#include "train/run_checkpoints.hpp"
#include "train/run_data.hpp"

namespace meshmoe {

namespace {

// The model of the deck with a checkpoint's parameters, the dataset's tokenizer and the language
// tag the prompts start with.
struct Decoder {
  Tokenizer tokenizer;
  int32_t tag = 0;
  std::unique_ptr<Transformer<float>> model;
  std::unique_ptr<CachedModel<float>> cached;
};

Decoder load_decoder(const Deck& deck, Mesh& mesh, const std::string& checkpoint, const std::string& lang) {
  const Config& cfg = deck.cfg;
  if (cfg.run.device != Device::Cpu) throw InputError("decoding runs on the host only: use --set run.device=cpu");
  // A cached step routes its new tokens as a group of their own (README "KV cache and MoE layers"):
  // expert choice would pick among other sequences' tokens of that step, not as training did.
  if (cfg.moe.every > 0 && cfg.moe.router == RouterKind::ExpertChoice)
    throw InputError("decoding does not support moe.router = \"expert_choice\": each expert chooses among the "
                     "tokens of a whole group, which a step-by-step decoder does not have (README, Expert-choice "
                     "routing); decode a model trained with a token-choice router (top1, top2, topk)");
  const Dataset valid = open_split(cfg.data.path, "valid", mesh.world());
  Decoder d;
  d.tokenizer = valid.info().tokenizer_object();
  const std::vector<std::string>& langs = d.tokenizer.languages();
  std::string use = lang;
  if (use.empty()) {
    if (langs.size() != 1) {
      std::string all;
      for (const std::string& l : langs) all += (all.empty() ? "" : ", ") + l;
      throw InputError("the dataset " + cfg.data.path + " has " + std::to_string(langs.size()) +
                       " languages: say which with --lang (" + all + ")");
    }
    use = langs.front();
  }
  d.tag = d.tokenizer.lang_token(use);
  std::string path;
  agree_on_input(mesh.world(), [&] {
    try {
      path = resolve_ckpt_path(checkpoint);
    } catch (const std::exception& e) {
      throw InputError(std::string("--checkpoint ") + e.what());
    }
  });
  d.model = std::make_unique<Transformer<float>>(cfg, model_vocab(cfg, valid), model_sharding(mesh));
  // No optimizer state; the routers' selection biases (moe.balance = bias) route as in training.
  std::vector<StateTensor> model_state = selection_bias_state(*d.model);
  read_checkpoint(path, d.model->params(), model_state, mesh.world());
  d.cached = std::make_unique<CachedModel<float>>(*d.model, &mesh.axis(Axis::Pipe));
  Comm& world = mesh.world_comm();
  d.cached->agree_logits = [&world](float* logits, size_t n) { world.broadcast(logits, n, 0); };
  return d;
}

// What the model wrote, on one line.
std::string one_line(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string s = tok.decode(ids);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

int generate_main(const Deck& deck, Mesh& mesh, const GenerateCliOptions& opt) {
  if (deck.cfg.model.arch == ModelArch::EncDec)
    throw InputError("generate continues a prompt with a decoder-only model; an encoder-decoder (model.arch = \"encdec\") "
                     "translates a source: use `meshmoe translate`");
  Decoder d = load_decoder(deck, mesh, opt.checkpoint, opt.lang);
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : opt.prompts) {
    std::vector<int32_t>& ids = prompts.emplace_back(1, d.tag);
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
  Decoder d = load_decoder(deck, mesh, opt.checkpoint, opt.lang);
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
  for (size_t first = 0; first < lines.size(); first += size_t(opt.batch)) {
    const size_t last = std::min(lines.size(), first + size_t(opt.batch));
    std::vector<std::vector<int32_t>> prompts, sources;
    std::vector<size_t> which;  // input line of each prompt
    for (size_t i = first; i < last; ++i) {
      std::vector<int32_t> ids(1, d.tag);
      d.tokenizer.encode(lines[i], ids);
      if (encdec) {  // `<lang> source` to the encoder, the decoder starts from BOS
        if (int(ids.size()) > seq_len) {
          if (mesh.rank() == 0)
            std::fprintf(stderr, "meshmoe: warning: input line %zu: %zu tokens; the encoder reads its first model.seq_len = %d, as in training\n",
                         i + 1, ids.size(), seq_len);
          ids.resize(size_t(seq_len));
        }
        sources.push_back(std::move(ids));
        prompts.push_back({Tokenizer::kBos});
        which.push_back(i);
        continue;
      }
      ids.push_back(Tokenizer::kSep);
      if (int(ids.size()) >= seq_len) {
        if (mesh.rank() == 0)
          std::fprintf(stderr, "meshmoe: warning: input line %zu: %zu tokens leave no room in model.seq_len = %d; its translation is empty\n",
                       i + 1, ids.size(), seq_len);
        continue;
      }
      prompts.push_back(std::move(ids));
      which.push_back(i);
    }
    if (!sources.empty()) d.cached->encode(sources);
    const std::vector<Hypothesis> best = beam_search(*d.cached, prompts, Tokenizer::kEos, opt.beam);
    if (mesh.rank() != 0) continue;
    std::vector<std::string> out(last - first);
    for (size_t k = 0; k < best.size(); ++k) out[which[k] - first] = one_line(d.tokenizer, best[k].tokens);
    for (const std::string& s : out) std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }
  return kExitOk;
}

}  // namespace meshmoe
