#include "data/dataset_identity.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

namespace meshmoe {

namespace {

// FNV-1a over 8-byte words (fnv1a64 goes byte by byte: too slow for 100 MB of tokens).
struct WordHash {
  uint64_t h = 14695981039346656037ull;
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 1099511628211ull;
    }
    for (; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    h = (h ^ n) * 1099511628211ull;  // lengths keep adjacent arrays apart
  }
  void text(const std::string& s) { bytes(s.data(), s.size()); }
  template <class T>
  void array(const std::vector<T>& v) { bytes(v.data(), v.size() * sizeof(T)); }
};

void hash_split(WordHash& h, const DataSplit& s) {
  h.array(s.tokens16);
  h.array(s.tokens32);
  h.array(s.doc_offsets);
  h.array(s.lang);
  h.array(s.loss_mask);
}

std::string split_summary(const char* name, const Dataset& d) {
  return std::string(name) + " " + std::to_string(d.num_examples()) + " examples / " + std::to_string(d.num_tokens()) + " tokens";
}

}  // namespace

std::string join_languages(const std::vector<std::string>& languages) {
  std::string s;
  for (const auto& l : languages) s += (s.empty() ? "" : ",") + l;
  return s;
}

std::vector<std::string> split_languages(const std::string& text) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find(',', b);
    if (e == std::string::npos) e = text.size();
    out.push_back(text.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

DatasetIdentity dataset_identity(const std::string& path, const Dataset& train, const Dataset& valid) {
  const DatasetInfo& info = train.info();
  WordHash h;
  h.text(info.tokenizer);
  if (!info.spm_model.empty()) h.text(info.spm_model);  // byte datasets keep their fingerprint
  h.bytes(&info.vocab_size, sizeof info.vocab_size);
  h.text(join_languages(info.languages));
  hash_split(h, train.split());
  hash_split(h, valid.split());
  DatasetIdentity id;
  id.path = path;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h.h);
  id.fingerprint = hex;
  id.languages = info.languages;
  id.summary = "tokenizer " + info.tokenizer + ", vocab " + std::to_string(info.vocab_size) + ", " +
               std::to_string(info.languages.size()) + " language" + (info.languages.size() == 1 ? "" : "s") + ", " +
               split_summary("train", train) + ", " + split_summary("valid", valid);
  return id;
}

std::vector<std::string> DatasetIdentity::differences_from(const DatasetIdentity& then) const {
  std::vector<std::string> out;
  if (fingerprint == then.fingerprint) return out;
  if (path != then.path) out.push_back("data.path was " + then.path + ", now " + path);
  if (summary != then.summary) out.push_back("the data was " + then.summary + "; now " + summary);
  if (languages != then.languages) {
    const std::set<std::string> a(then.languages.begin(), then.languages.end()), b(languages.begin(), languages.end());
    std::vector<std::string> gone, added;
    std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(gone));
    std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(added));
    auto some = [](const std::vector<std::string>& v) {
      std::string s;
      for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", " : "") + v[i];
      return v.size() > 8 ? s + ", ... (" + std::to_string(v.size()) + ")" : s;
    };
    std::string line = "the language table changed (" + std::to_string(then.languages.size()) + " -> " +
                       std::to_string(languages.size()) + " languages";
    if (!gone.empty()) line += "; gone: " + some(gone);
    if (!added.empty()) line += "; new: " + some(added);
    if (gone.empty() && added.empty()) line += "; same names, another order";
    out.push_back(line + ")");
  }
  out.push_back("content fingerprint " + then.fingerprint + " then, " + fingerprint + " now");
  return out;
}

}  // namespace meshmoe
