#include "decode/decoder.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include "core/error.hpp"
#include "core/timers.hpp"
#include "parallel/pipeline_executor.hpp"
#include "tensor/blas.hpp"
#include "checkpoint/checkpoint.hpp"
#include "run/run_checkpoints.hpp"
#include "run/run_data.hpp"
#include "run/startup.hpp"

namespace meshmoe {

void check_decodable(const Config& cfg) {
  if (cfg.run.device != Device::Cpu) throw InputError("decoding runs on the host only: use --set run.device=cpu");
  // A cached step routes its new tokens as a group of their own (docs/user-guide.md "Translation",
  // KV cache and MoE layers): expert choice would pick among other sequences' tokens of that step,
  // not as training did.
  if (cfg.moe.every > 0 && cfg.moe.router == RouterKind::ExpertChoice)
    throw InputError("decoding does not support moe.router = \"expert_choice\": each expert chooses among the "
                     "tokens of a whole group, which a step-by-step decoder does not have (docs/user-guide.md, "
                     "Expert-choice routing); decode a model trained with a token-choice router (top1, top2, topk)");
}

std::unique_ptr<CachedModel<float>> data_group_cached_model(Transformer<float>& model, Mesh& mesh) {
  auto cached = std::make_unique<CachedModel<float>>(model, &mesh.axis(Axis::Pipe));
  // step() has broadcast the last stage's logits over pipe: tensor rank 0's are then the group's.
  if (Comm& tensor = mesh.axis(Axis::Tensor); tensor.size() > 1)
    cached->agree_logits = [&tensor](float* logits, size_t n) { tensor.broadcast(logits, n, 0); };
  if (Comm& data = mesh.axis(Axis::Data); data.size() > 1)
    cached->more_steps = [&data](bool mine) {
      int any = mine ? 1 : 0;
      data.all_reduce(&any, 1, Op::Max);
      return any != 0;
    };
  return cached;
}

namespace {

// Attempts at reading the checkpoint that a directory's LATEST names, when it vanishes under us.
constexpr int kLatestAttempts = 4;

// Tests only (tests/scripts/decode_bounds.sh): with MESHMOE_TEST_PAUSE_AFTER_LATEST=F, the first
// call creates F.ready and waits (30 s at most) until F.go exists: the test replaces the checkpoint
// in that gap, deterministically.
void pause_after_latest() {
  static bool paused = false;
  const char* f = std::getenv("MESHMOE_TEST_PAUSE_AFTER_LATEST");
  if (!f || paused) return;
  paused = true;
  std::fclose(std::fopen((std::string(f) + ".ready").c_str(), "w"));
  for (int i = 0; i < 3000 && !std::filesystem::exists(std::string(f) + ".go"); ++i) usleep(10000);
}

}  // namespace

Decoder load_decoder(const Deck& deck, Mesh& mesh, const std::string& checkpoint) {
  const Config& cfg = deck.cfg;
  check_decodable(cfg);
  Decoder d;
  d.valid = open_split(cfg.data.path, "valid", mesh.world());
  d.tokenizer = d.valid.info().tokenizer_object();
  set_gemm_precision(cfg.model.precision);  // decode in the arithmetic the model was trained in
  // The model's start-up (run/startup.hpp): decoding needs no memory plan, nor the training batch's rules.
  const Startup start = Startup::forward_only(cfg, model_vocab(cfg, d.valid), mesh, false);
  d.model = std::make_unique<Transformer<float>>(cfg, start.table(), start.placement_on(mesh));
  // No optimizer state; the routers' selection biases (moe.balance = bias) route as in training.
  std::vector<StateTensor> model_state = selection_bias_state(*d.model);
  // A directory names its newest checkpoint in LATEST, which a training run beside this one replaces,
  // pruning the file it named (checkpoint.keep_last), maybe between our reading LATEST and opening
  // the file: while LATEST then names another file, that one is read (a few times at most).
  d.checkpoint = resolve_named_checkpoint(checkpoint, "--checkpoint", mesh.world());
  pause_after_latest();
  for (int attempt = 1;; ++attempt) {
    try {
      d.meta = read_checkpoint(d.checkpoint, d.model->params(), model_state, mesh.world());
      break;
    } catch (const InputError&) {
      // Every rank is here (read_checkpoint's errors are agreed); d.checkpoint is rank 0's on all.
      if (attempt == kLatestAttempts || d.checkpoint == checkpoint) throw;
      const std::string newer = resolve_named_checkpoint(checkpoint, "--checkpoint", mesh.world());
      if (newer == d.checkpoint) throw;
      if (mesh.rank() == 0)
        std::fprintf(stderr, "meshmoe: note: %s was replaced while it was read (a training run pruning its checkpoints?); "
                     "reading %s, which LATEST names now\n", d.checkpoint.c_str(), newer.c_str());
      d.checkpoint = newer;
    }
  }
  d.cached = data_group_cached_model(*d.model, mesh);
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

std::vector<LineBatch> line_batches(int32_t tag, const std::vector<std::string>& lines, int batch) {
  std::vector<LineBatch> out;
  for (size_t first = 0; first < lines.size(); first += size_t(batch))
    out.push_back({tag, &lines, first, std::min(lines.size(), first + size_t(batch))});
  return out;
}

namespace {

// The translations of one batch on this rank's data group (an empty batch steps with no tokens).
BatchTranslation translate_batch(CachedModel<float>& cached, const Tokenizer& tokenizer, const LineBatch& b,
                                 const BeamOptions& beam) {
  const double start = wall_seconds();
  const int seq_len = cached.max_positions();
  const bool encdec = cached.encdec();
  BatchTranslation out;
  out.text.resize(b.last - b.first);
  out.too_long.assign(b.last - b.first, 0);
  std::vector<std::vector<int32_t>> prompts, sources;
  std::vector<size_t> which;  // line of each prompt in the batch
  for (size_t i = 0; i < b.last - b.first; ++i) {
    std::vector<int32_t> ids(1, b.tag);
    tokenizer.encode((*b.lines)[b.first + i], ids);
    if (encdec) {  // `<lang> source` to the encoder, the decoder starts from BOS
      if (int(ids.size()) > seq_len) {
        out.too_long[i] = ids.size();
        ids.resize(size_t(seq_len));
      }
      sources.push_back(std::move(ids));
      prompts.push_back({Tokenizer::kBos});
      which.push_back(i);
      continue;
    }
    ids.push_back(Tokenizer::kSep);
    if (int(ids.size()) >= seq_len) {
      out.too_long[i] = ids.size();
      continue;
    }
    prompts.push_back(std::move(ids));
    which.push_back(i);
  }
  if (encdec && (!sources.empty() || cached.lockstep())) cached.encode(sources);
  const std::vector<Hypothesis> best = beam_search(cached, prompts, Tokenizer::kEos, beam);
  for (size_t k = 0; k < best.size(); ++k) out.text[which[k]] = one_line(tokenizer, best[k].tokens);
  out.seconds = wall_seconds() - start;
  return out;
}

template <typename U>
void put(std::string& bytes, const U& v) {
  bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename U>
U take(const std::string& bytes, size_t& at) {
  U v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  at += sizeof v;
  return v;
}

// Data rank `root`'s translation of a batch of `lines` lines, on every rank of `data`.
BatchTranslation broadcast_translation(const BatchTranslation& mine, size_t lines, int root, Comm& data) {
  std::string bytes;
  if (data.rank() == root) {
    put(bytes, mine.seconds);
    for (size_t i = 0; i < lines; ++i) {
      put(bytes, uint64_t(mine.too_long[i]));
      put(bytes, uint64_t(mine.text[i].size()));
      bytes += mine.text[i];
    }
  }
  bytes = data.broadcast_string(std::move(bytes), root);
  if (data.rank() == root) return mine;
  BatchTranslation out;
  size_t at = 0;
  out.seconds = take<double>(bytes, at);
  for (size_t i = 0; i < lines; ++i) {
    out.too_long.push_back(size_t(take<uint64_t>(bytes, at)));
    const size_t n = size_t(take<uint64_t>(bytes, at));
    out.text.push_back(bytes.substr(at, n));
    at += n;
  }
  return out;
}

}  // namespace

std::vector<BatchTranslation> translate_batches(CachedModel<float>& cached, Comm& data, const Tokenizer& tokenizer,
                                                const std::vector<LineBatch>& work, const BeamOptions& beam,
                                                const std::function<int()>& stop,
                                                const std::function<void(size_t, const BatchTranslation&)>& ready,
                                                int* stopped) {
  if (data.size() > 1 && !cached.lockstep())
    throw std::logic_error("translate_batches: data ranks decoding their own batches must step together (more_steps)");
  const size_t n = work.size(), ranks = size_t(data.size()), d = size_t(data.rank());
  const auto block_begin = [n, ranks](size_t j) { return n * j / ranks; };
  std::vector<BatchTranslation> out(n);
  std::vector<bool> arrived(n, false);
  size_t next_ready = 0;
  const LineBatch none;
  for (size_t round = 0; round < (n + ranks - 1) / ranks; ++round) {
    if (stop)
      if (const int why = stop()) {
        if (stopped) *stopped = why;
        return out;
      }
    const size_t mine = block_begin(d) + round;
    const BatchTranslation t = translate_batch(cached, tokenizer, mine < block_begin(d + 1) ? work[mine] : none, beam);
    for (size_t j = 0; j < ranks; ++j) {
      const size_t b = block_begin(j) + round;
      if (b >= block_begin(j + 1)) continue;
      out[b] = broadcast_translation(t, work[b].last - work[b].first, int(j), data);
      arrived[b] = true;
    }
    for (; next_ready < n && arrived[next_ready]; ++next_ready)
      if (ready) ready(next_ready, out[next_ready]);
  }
  return out;
}

}  // namespace meshmoe
