// The data a training run reads (docs/user-guide.md "Datasets"): the train and valid splits of data.path, read by
// every rank, and the sample an evaluation scores.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

#include "data/batcher.hpp"
#include "data/dataset.hpp"
#include "deck/config.hpp"

namespace meshmoe {

// Dataset::open with the mistakes of data.path named first. Collective: every rank reads the file
// itself, and a rank that cannot (the file missing on its node only) stops every rank, named.
Dataset open_split(const std::string& path, const std::string& split, MPI_Comm world);

// `per_language` examples of every language of a split (per_language_sample; all of it when 0), so
// that an evaluation scores every language, the small ones too.
Dataset eval_subset(const Dataset& valid, int64_t per_language);

// The vocabulary size of the model: model.vocab_size, or the dataset's when 0. Throws InputError
// when the deck's is smaller than the dataset's.
int model_vocab(const Config& cfg, const Dataset& train);

// Every split the run will use is checked before the first step: an empty validation split found
// only at the first evaluation would cost every step before it. Throws InputError when
// eval.every > 0 and `eval_set` (the sample of `valid` an evaluation scores) has no target token
// or would drop every example (check_examples_fit). Returns the examples of `eval_set` that the
// sequences truncate or drop.
TooLong check_eval_split(const Config& cfg, const Dataset& valid, const Dataset& eval_set);

}  // namespace meshmoe
