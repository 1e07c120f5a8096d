#include "data/tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <iostream>
#include <thread>
#include <unordered_map>

#include "core/error.hpp"

namespace meshmoe {

namespace {

class TextsIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit TextsIterator(const std::vector<std::string_view>& texts) : texts_(texts) { load(); }
  bool done() const override { return i_ >= texts_.size(); }
  void Next() override {
    ++i_;
    load();
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void load() {
    if (!done()) value_.assign(texts_[i_]);
  }
  const std::vector<std::string_view>& texts_;
  size_t i_ = 0;
  std::string value_;
};

// SentencePiece logs to std::cerr, line by line ("trainer_interface.cc(406) LOG(INFO) Loaded all 1329048
// sentences"). While it trains, std::cerr writes into this buffer, which passes on to `out` the lines
// naming the trainer's phases (with the seconds since the start), its warnings and errors, and drops
// the rest (its options, one per line, and per-step details).
class SpmPhaseLines final : public std::streambuf {
 public:
  explicit SpmPhaseLines(std::streambuf* out) : out_(out) {}

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    if (c == '\n') {
      pass_on();
      line_.clear();
    } else {
      line_ += char(c);
    }
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    for (std::streamsize i = 0; i < n; ++i) overflow(traits_type::to_int_type(s[i]));
    return n;
  }
  int sync() override { return out_->pubsync(); }

 private:
  void pass_on() {
    static constexpr const char* kPhases[] = {
        "Loaded all",      "Normalizing sentences", "Alphabet size",        "Final character coverage",
        "Done! preprocessed", "Making suffix array", "Extracting frequent", "Initialized",
        "Using",           "EM sub_iter"};
    const size_t info = line_.find(") LOG(INFO) ");
    std::string text;
    if (info != std::string::npos) {
      text = line_.substr(info + 12);
      if (std::none_of(std::begin(kPhases), std::end(kPhases), [&](const char* p) { return text.starts_with(p); }))
        return;
    } else if (line_.find(".cc(") != std::string::npos) {
      text = line_;  // a warning, an error or a failed check
    } else {
      return;  // the continuation of a multi-line message (the trainer's options)
    }
    // Wall time, and the process's CPU time (all threads): on a shared machine the second measures the work.
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const double cpu = double(std::clock() - cpu0_) / CLOCKS_PER_SEC;
    char head[64];
    std::snprintf(head, sizeof head, "  spm %7.1f s (cpu %7.1f s): ", s, cpu);
    const std::string out = head + text + "\n";
    out_->sputn(out.data(), std::streamsize(out.size()));
    out_->pubsync();
  }
  std::streambuf* out_;
  std::string line_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::clock_t cpu0_ = std::clock();
};

// Points std::cerr at a buffer for its lifetime.
class RedirectCerr {
 public:
  explicit RedirectCerr(std::streambuf* to) : saved_(std::cerr.rdbuf(to)) {}
  ~RedirectCerr() { std::cerr.rdbuf(saved_); }
  RedirectCerr(const RedirectCerr&) = delete;
  RedirectCerr& operator=(const RedirectCerr&) = delete;
  std::streambuf* saved() const { return saved_; }

 private:
  std::streambuf* saved_;
};

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> languages, std::string spm_model)
    : languages_(std::move(languages)), spm_model_(std::move(spm_model)) {
  std::sort(languages_.begin(), languages_.end());
  languages_.erase(std::unique(languages_.begin(), languages_.end()), languages_.end());
  for (const auto& l : languages_)
    if (l.empty() || l.find_first_of("<> \t\n") != std::string::npos)
      throw InputError("tokenizer: invalid language name '" + l + "' (must be non-empty, without '<', '>' or spaces)");
  if (!spm_model_.empty()) {
    auto p = std::make_shared<sentencepiece::SentencePieceProcessor>();
    if (const auto st = p->LoadFromSerializedProto(spm_model_); !st.ok())
      throw InputError("tokenizer: the SentencePiece model cannot be read (" + st.ToString() + ")");
    spm_ = std::move(p);
  }
}

std::string Tokenizer::train_spm(const std::vector<std::string_view>& texts, int pieces, std::ostream* progress) {
  // Unigram model (SentencePiece's default, Kudo 2018); no BOS/EOS/PAD of its own (ours are
  // used); byte fallback so that every text encodes, characters outside the 99.95 % most frequent
  // as bytes (the corpus's ~180 languages bring CJK's thousands of rare characters); the whole
  // input read in a fixed order with a fixed seed and kSpmTrainShards threads, so that the same
  // texts give the same model. A sample of a large corpus is chosen by prep (prep_tokenizer).
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "unigram"},         {"vocab_size", std::to_string(pieces)},
      {"byte_fallback", "true"},         {"character_coverage", "0.9995"},
      {"bos_id", "-1"},                  {"eos_id", "-1"},
      {"pad_id", "-1"},                  {"unk_id", "0"},
      {"input_sentence_size", "0"},      {"shuffle_input_sentence", "false"},
      {"num_threads", std::to_string(kSpmTrainShards)},
      {"minloglevel", progress ? "0" : "2"},
      {"max_sentence_length", "65536"},  {"hard_vocab_limit", "true"}};
  sentencepiece::SetRandomGeneratorSeed(1234);
  TextsIterator it(texts);
  std::string model;
  sentencepiece::util::Status st;
  if (progress) {
    // progress may be std::cerr itself: the lines then go to its own buffer.
    SpmPhaseLines lines(progress == &std::cerr ? std::cerr.rdbuf() : progress->rdbuf());
    const RedirectCerr redirect(&lines);
    st = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  } else {
    st = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  }
  if (!st.ok())
    throw InputError("SentencePiece training of " + std::to_string(pieces) + " pieces failed: " + st.ToString() +
                     " (the vocabulary holds 256 byte pieces for the fallback, the text's characters and the pieces learnt;\n"
                     "  too large a vocabulary for the text fails too)");
  return model;
}

int Tokenizer::spm_pieces() const { return spm_ ? spm_->GetPieceSize() : 0; }

int Tokenizer::language_index(std::string_view name) const {
  const auto it = std::lower_bound(languages_.begin(), languages_.end(), name);
  return (it != languages_.end() && *it == name) ? int(it - languages_.begin()) : -1;
}

int32_t Tokenizer::lang_token(std::string_view name) const {
  const int i = language_index(name);
  if (i < 0) throw InputError("tokenizer: language '" + std::string(name) + "' is not in the vocabulary");
  return kFirstLang + i;
}

void Tokenizer::encode_bytes(std::string_view text, std::vector<int32_t>& out) {
  for (unsigned char c : text) out.push_back(int32_t(c));
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (!spm_) return encode_bytes(text, out);
  std::vector<int> pieces;
  if (const auto st = spm_->Encode(text, &pieces); !st.ok()) throw Error("SentencePiece encode: " + st.ToString());
  for (const int p : pieces) out.push_back(first_piece() + p);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  encode(text, ids);
  return ids;
}

Tokenizer::EncodedTexts Tokenizer::encode_all(const std::vector<std::string_view>& texts, int threads) const {
  const size_t n = texts.size(), parts = size_t(std::clamp<int64_t>(threads, 1, std::max<int64_t>(1, int64_t(n))));
  std::vector<EncodedTexts> part(parts);
  std::vector<std::exception_ptr> error(parts);
  auto encode_part = [&](size_t p) {
    try {
      EncodedTexts& e = part[p];
      e.offsets.push_back(0);
      for (size_t i = n * p / parts; i < n * (p + 1) / parts; ++i) {
        encode(texts[i], e.ids);
        e.offsets.push_back(e.ids.size());
      }
    } catch (...) {
      error[p] = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  for (size_t p = 1; p < parts; ++p) workers.emplace_back(encode_part, p);
  encode_part(0);
  for (auto& w : workers) w.join();
  for (const auto& e : error)
    if (e) std::rethrow_exception(e);
  EncodedTexts out;
  out.offsets.reserve(n + 1);
  out.offsets.push_back(0);
  size_t total = 0;
  for (const auto& e : part) total += e.ids.size();
  out.ids.reserve(total);
  for (auto& e : part) {
    const size_t base = out.ids.size();
    for (size_t i = 1; i < e.offsets.size(); ++i) out.offsets.push_back(base + e.offsets[i]);
    out.ids.insert(out.ids.end(), e.ids.begin(), e.ids.end());
    e = EncodedTexts{};
  }
  return out;
}

std::string Tokenizer::token_text(int32_t id) const {
  if (id >= 0 && id < 256) return std::string(1, char(id));
  switch (id) {
    case kPad: return "<pad>";
    case kBos: return "<bos>";
    case kEos: return "<eos>";
    case kSep: return "<sep>";
    default: break;
  }
  if (id >= kFirstLang && id < first_piece()) return "<" + languages_[size_t(id - kFirstLang)] + ">";
  if (spm_ && id >= first_piece() && id < vocab_size()) return spm_->IdToPiece(id - first_piece());
  throw Error("tokenizer: id " + std::to_string(id) + " outside the vocabulary of " + std::to_string(vocab_size()));
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  std::vector<int> run;  // consecutive pieces decode together (SentencePiece joins and unescapes them)
  auto flush = [&] {
    if (run.empty()) return;
    std::string text;
    if (const auto st = spm_->Decode(run, &text); !st.ok()) throw Error("SentencePiece decode: " + st.ToString());
    s += text;
    run.clear();
  };
  for (int32_t id : ids) {
    if (spm_ && id >= first_piece() && id < vocab_size()) {
      run.push_back(id - first_piece());
      continue;
    }
    flush();
    s += token_text(id);
  }
  flush();
  return s;
}

}  // namespace meshmoe
