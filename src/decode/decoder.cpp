#include "decode/decoder.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "parallel/pipeline_executor.hpp"
#include "tensor/blas.hpp"
#include "train/checkpoint.hpp"
#include "train/run_checkpoints.hpp"
#include "train/run_data.hpp"

namespace meshmoe {

void check_decodable(const Config& cfg) {
  if (cfg.run.device != Device::Cpu) throw InputError("decoding runs on the host only: use --set run.device=cpu");
  // A cached step routes its new tokens as a group of their own (README "KV cache and MoE layers"):
  // expert choice would pick among other sequences' tokens of that step, not as training did.
  if (cfg.moe.every > 0 && cfg.moe.router == RouterKind::ExpertChoice)
    throw InputError("decoding does not support moe.router = \"expert_choice\": each expert chooses among the "
                     "tokens of a whole group, which a step-by-step decoder does not have (README, Expert-choice "
                     "routing); decode a model trained with a token-choice router (top1, top2, topk)");
}

std::unique_ptr<CachedModel<float>> agreed_cached_model(Transformer<float>& model, Mesh& mesh) {
  auto cached = std::make_unique<CachedModel<float>>(model, &mesh.axis(Axis::Pipe));
  Comm& world = mesh.world_comm();
  cached->agree_logits = [&world](float* logits, size_t n) { world.broadcast(logits, n, 0); };
  return cached;
}

Decoder load_decoder(const Deck& deck, Mesh& mesh, const std::string& checkpoint) {
  const Config& cfg = deck.cfg;
  check_decodable(cfg);
  Decoder d;
  d.valid = open_split(cfg.data.path, "valid", mesh.world());
  d.tokenizer = d.valid.info().tokenizer_object();
  d.checkpoint = resolve_named_checkpoint(checkpoint, "--checkpoint", mesh.world());
  set_gemm_precision(cfg.model.precision);  // decode in the arithmetic the model was trained in
  d.model = std::make_unique<Transformer<float>>(cfg, model_vocab(cfg, d.valid), model_sharding(mesh, cfg));
  // No optimizer state; the routers' selection biases (moe.balance = bias) route as in training.
  std::vector<StateTensor> model_state = selection_bias_state(*d.model);
  d.meta = read_checkpoint(d.checkpoint, d.model->params(), model_state, mesh.world());
  d.cached = agreed_cached_model(*d.model, mesh);
  return d;
}

int32_t language_tag(const Tokenizer& tokenizer, const std::string& lang, const std::string& data_path) {
  const std::vector<std::string>& langs = tokenizer.languages();
  std::string all;
  for (const std::string& l : langs) all += (all.empty() ? "" : ", ") + l;
  if (lang.empty()) {
    if (langs.size() != 1)
      throw InputError("the dataset " + data_path + " has " + std::to_string(langs.size()) +
                       " languages: say which with --lang (" + all + ")");
    return tokenizer.lang_token(langs.front());
  }
  if (std::find(langs.begin(), langs.end(), lang) == langs.end())
    throw InputError("--lang " + lang + ": not a language of the dataset " + data_path + " (" + all + ")");
  return tokenizer.lang_token(lang);
}

std::string one_line(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string s = tok.decode(ids);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

std::vector<std::string> translate_lines(CachedModel<float>& cached, const Tokenizer& tokenizer, int32_t tag,
                                         const std::vector<std::string>& lines, const BeamOptions& beam, int batch,
                                         const std::function<void(size_t, size_t)>& too_long) {
  const int seq_len = cached.max_positions();
  const bool encdec = cached.encdec();
  std::vector<std::string> out(lines.size());
  for (size_t first = 0; first < lines.size(); first += size_t(batch)) {
    const size_t last = std::min(lines.size(), first + size_t(batch));
    std::vector<std::vector<int32_t>> prompts, sources;
    std::vector<size_t> which;  // input line of each prompt
    for (size_t i = first; i < last; ++i) {
      std::vector<int32_t> ids(1, tag);
      tokenizer.encode(lines[i], ids);
      if (encdec) {  // `<lang> source` to the encoder, the decoder starts from BOS
        if (int(ids.size()) > seq_len) {
          if (too_long) too_long(i, ids.size());
          ids.resize(size_t(seq_len));
        }
        sources.push_back(std::move(ids));
        prompts.push_back({Tokenizer::kBos});
        which.push_back(i);
        continue;
      }
      ids.push_back(Tokenizer::kSep);
      if (int(ids.size()) >= seq_len) {
        if (too_long) too_long(i, ids.size());
        continue;
      }
      prompts.push_back(std::move(ids));
      which.push_back(i);
    }
    if (prompts.empty()) continue;
    if (!sources.empty()) cached.encode(sources);
    const std::vector<Hypothesis> best = beam_search(cached, prompts, Tokenizer::kEos, beam);
    for (size_t k = 0; k < best.size(); ++k) out[which[k]] = one_line(tokenizer, best[k].tokens);
  }
  return out;
}

}  // namespace meshmoe
