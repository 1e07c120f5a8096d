#include "run/run_data.hpp"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "core/error.hpp"
#include "data/batcher.hpp"
#include "mesh/agree.hpp"

namespace meshmoe {

Dataset open_split(const std::string& path, const std::string& split, MPI_Comm world) {
  Dataset d;
  agree_on_input(world, [&] {
    if (path.empty()) throw InputError("data.path is empty: set it to a dataset file written by `meshmoe prep gettext|text`");
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      throw InputError("data.path: " + path + ": is a directory, not a dataset file (write one with `meshmoe prep`)");
    d = Dataset::open(path, split);
  });
  return d;
}

Dataset eval_subset(const Dataset& valid, int64_t per_language) {
  if (per_language <= 0) return valid;
  const DataSplit& in = valid.split();
  DataSplit out;
  out.wide = in.wide;
  for (const size_t e : per_language_sample(in, valid.info().languages.size(), per_language)) {
    const size_t b = in.example_begin(e), len = in.example_size(e);
    std::vector<int32_t> tokens(len);
    for (size_t i = 0; i < len; ++i) tokens[i] = int32_t(in.token(b + i));
    out.add_example(tokens, std::vector<uint8_t>(in.loss_mask.begin() + long(b), in.loss_mask.begin() + long(b + len)),
                    in.lang[e]);
  }
  return Dataset::from_memory(valid.info(), std::move(out), valid.path() + " (valid, " + std::to_string(per_language) + " per language)");
}

int model_vocab(const Config& cfg, const Dataset& train) {
  const int vocab = cfg.model.vocab_size > 0 ? int(cfg.model.vocab_size) : train.vocab_size();
  if (vocab < train.vocab_size())
    throw InputError("model.vocab_size = " + std::to_string(vocab) + " is smaller than the vocabulary of " +
                     cfg.data.path + " (" + std::to_string(train.vocab_size()) + "); set it to 0 to use the dataset's");
  return vocab;
}

TooLong check_eval_split(const Config& cfg, const Dataset& valid, const Dataset& eval_set) {
  if (cfg.eval.every > 0 && !eval_set.split().has_target())
    throw InputError(cfg.data.path + ": the valid split has no target token (" + std::to_string(valid.num_examples()) +
                     " examples) but eval.every = " + std::to_string(cfg.eval.every) +
                     " evaluates on it: set eval.every = 0, or prepare the data set with a larger --valid-percent");
  // An evaluation's Batcher refuses a set whose every example it would drop: found at the first
  // evaluation, that would cost every step before it.
  const int T = int(cfg.model.seq_len);
  const ModelArch arch = cfg.model.arch;
  return cfg.eval.every > 0 ? check_examples_fit(eval_set, T, arch)
                            : count_too_long(eval_set.split(), T, arch, eval_set.info().sep_id);
}

}  // namespace meshmoe
