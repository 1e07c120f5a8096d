#include "app/prep_cli.hpp"

#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <optional>
#include <iostream>
#include <sstream>

#include "core/error.hpp"
#include "io/output_file.hpp"

namespace meshmoe {

std::string prep_summary(const PreparedDataset& d) {
  const PrepStats& s = d.stats;
  std::ostringstream o;
  o << d.info.created_by << ": " << s.train_examples + s.valid_examples << " examples (" << s.train_examples
    << " train, " << s.valid_examples << " valid), " << d.info.languages.size() << " languages, "
    << s.train_tokens + s.valid_tokens << " tokens (" << s.train_tokens << " train, " << s.valid_tokens
    << " valid), vocab_size " << d.info.vocab_size << ", " << s.seconds << " s\n";
  if (!d.info.direction.empty()) o << "  direction " << direction_text(d.info.direction) << "\n";
  if (d.info.created_by == "meshmoe prep gettext") {
    o << "  catalogs read " << s.catalogs << ", skipped as corrupt " << s.catalogs_skipped << "; entries " << s.entries
      << ": untranslated " << s.untranslated << ", identical to English " << s.identical << ", duplicates "
      << s.duplicates << ", longer than --max-len " << s.too_long << "\n";
    if (s.languages_dropped > 0)
      o << "  languages dropped (fewer than --min-pairs pairs): " << s.languages_dropped << " with "
        << s.pairs_dropped_with_languages << " pairs\n";
  } else if (s.pieces_cut > 0) {
    o << "  long lines cut into " << s.pieces_cut << " extra pieces (--max-len)\n";
  }
  return o.str();
}

TokenizerKind parse_tokenizer_options(const std::string& cmd, const std::string& tokenizer, int64_t spm_pieces,
                                      int64_t spm_sample) {
  const std::optional<TokenizerKind> kind = parse_option<TokenizerKind>(tokenizer);
  if (!kind) throw InputError(cmd + ": --tokenizer must be bytes or spm (got " + tokenizer + ")");
  if (*kind == TokenizerKind::Spm && (spm_pieces < 16 || spm_pieces > 1000000))
    throw InputError(cmd + ": --spm-pieces must be in 16..1000000 (got " + std::to_string(spm_pieces) + ")");
  if (spm_sample != 0 && (spm_sample < 100 || spm_sample > 1000000000))
    throw InputError(cmd + ": --spm-sample must be 0 (every text) or in 100..1000000000 (got " +
                     std::to_string(spm_sample) + ")");
  return *kind;
}

std::vector<std::string_view> spm_training_sample(const std::vector<std::string_view>& texts, int64_t n) {
  if (n == 0 || size_t(n) >= texts.size()) return texts;
  std::vector<std::pair<uint64_t, size_t>> keys(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) keys[i] = {mix64(fnv1a64(texts[i])), i};
  std::nth_element(keys.begin(), keys.begin() + std::ptrdiff_t(n), keys.end());
  keys.resize(size_t(n));
  std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::vector<std::string_view> sample;
  sample.reserve(keys.size());
  for (const auto& k : keys) sample.push_back(texts[k.second]);
  return sample;
}

Tokenizer prep_tokenizer(const std::string& cmd, TokenizerKind kind, int64_t spm_pieces, int64_t spm_sample,
                         std::vector<std::string> languages, const std::vector<std::string_view>& train_texts, bool quiet,
                         std::ostream& log) {
  if (kind == TokenizerKind::Bytes) return Tokenizer(std::move(languages));
  const std::vector<std::string_view> sample = spm_training_sample(train_texts, spm_sample);
  if (!quiet) {
    log << cmd << ": training a SentencePiece model of " << spm_pieces << " pieces on ";
    if (sample.size() < train_texts.size())
      log << sample.size() << " of the " << train_texts.size() << " texts of the train split (--spm-sample)\n";
    else
      log << train_texts.size() << " texts of the train split\n";
    log << std::flush;
  }
  return Tokenizer(std::move(languages), Tokenizer::train_spm(sample, int(spm_pieces), quiet ? nullptr : &log));
}

void refuse_output_overwriting_input(const std::string& cmd, const std::string& output,
                                     const std::vector<std::string>& inputs) {
  if (!output.empty()) check_output_path(output, {cmd, "-o", inputs, {}});
}

void check_split_sizes(const std::string& cmd, const PreparedDataset& d, int64_t valid_percent, std::ostream& log) {
  if (d.train.num_examples() == 0)
    throw InputError(cmd + ": the train split is empty (" +
                     (valid_percent >= 100 ? std::string("--valid-percent 100") : "every example hashed into valid") +
                     "): nothing to train on; lower --valid-percent or give more input");
  if (d.valid.num_examples() == 0)
    log << cmd << ": warning: the valid split is empty ("
        << (valid_percent == 0 ? std::string("--valid-percent 0") : "no example hashed into it; raise --valid-percent")
        << "): a deck must set eval.every = 0 to train on it\n" << std::flush;
}

namespace {

// Rank 0 runs `work`; its InputError (if any) is broadcast and raised on every rank.
int on_rank0(const std::function<void()>& work) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string error;
  if (rank == 0) {
    try {
      work();
    } catch (const InputError& e) {
      error = e.what();
      if (error.empty()) error = "prep failed";
    }
  }
  int n = int(error.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  error.resize(size_t(n));
  MPI_Bcast(error.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (n > 0) throw InputError(error);
  return kExitOk;
}

// Checked before the work starts, so a typo in -o costs nothing (src/io/output_file.hpp); the
// inputs are compared as they are found (refuse_output_overwriting_input).
void check_output(const std::string& cmd, const std::string& output) {
  if (output.empty()) throw InputError(cmd + ": give the output file with -o FILE.h5");
  check_output_path(output, {cmd, "-o", {}, {}});
}

// Replaces only an earlier dataset, written under a temporary name and renamed over `output` once whole.
void write_output(const std::string& cmd, const std::string& output, const PreparedDataset& d) {
  check_output_path(output, {cmd, "-o", {}, {"meshmoe prep"}});
  try {
    ReplacingFile out(output);
    write_dataset(out.temporary(), d.info, d.train, d.valid);
    out.commit();
  } catch (const Error& e) {
    throw InputError(cmd + ": cannot write " + output + ": " + e.what());
  }
}

}  // namespace

int prep_gettext_main(const PrepGettextOptions& opt) {
  return on_rank0([&] {
    check_output("prep gettext", opt.output);
    const PreparedDataset d = prepare_gettext(opt, std::cerr);
    write_output("prep gettext", opt.output, d);
    std::cout << prep_summary(d) << "  wrote " << opt.output << "\n" << std::flush;
  });
}

int prep_text_main(const PrepTextOptions& opt) {
  return on_rank0([&] {
    check_output("prep text", opt.output);
    const PreparedDataset d = prepare_text(opt, std::cerr);
    write_output("prep text", opt.output, d);
    std::cout << prep_summary(d) << "  wrote " << opt.output << "\n" << std::flush;
  });
}

}  // namespace meshmoe
