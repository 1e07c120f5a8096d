// What a checkpoint remembers of the dataset it was trained on, so that a resume on another one
// (a changed data.path, another tokenizer or language table) is caught before any step runs: the
// data cursor and the per-language metrics only mean something on the same data.
#pragma once
#include <string>
#include <vector>

#include "data/dataset.hpp"

namespace meshmoe {

struct DatasetIdentity {
  std::string path;         // data.path as given
  std::string summary;      // "tokenizer bytes, vocab 443, 183 languages, train 1000 examples / 40000 tokens, ..."
  std::string fingerprint;  // 16 hex digits: a hash of the tokenizer, languages and every split's arrays
  std::vector<std::string> languages;

  // The differences from `then` (a checkpoint's record) as sentences; empty when the data is the same.
  std::vector<std::string> differences_from(const DatasetIdentity& then) const;
};

// Hashes every array of both splits (a few tens of milliseconds for the gettext data set).
DatasetIdentity dataset_identity(const std::string& path, const Dataset& train, const Dataset& valid);

// "a,b,c" <-> {a, b, c}
std::string join_languages(const std::vector<std::string>& languages);
std::vector<std::string> split_languages(const std::string& text);

}  // namespace meshmoe
