// Dataset files: write_dataset (prep) and Dataset::open (trainer), over src/io/h5.hpp.
#include <algorithm>
#include <filesystem>
#include <numeric>

#include "core/error.hpp"
#include "data/dataset.hpp"
#include "io/h5.hpp"

namespace meshmoe {

namespace {
std::string join(const std::vector<std::string>& v, char sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : std::string(1, sep)) + x;
  return s;
}

void write_split(h5::File& f, const std::string& g, const DataSplit& s) {
  f.create_group(g);
  if (s.wide) f.write(g + "/tokens", s.tokens32);
  else f.write(g + "/tokens", s.tokens16);
  f.write(g + "/doc_offsets", s.doc_offsets);
  f.write(g + "/lang", s.lang);
  f.write(g + "/loss_mask", s.loss_mask);
  auto grp = f.group(g);
  grp.set_attr("num_examples", int64_t(s.num_examples()));
  grp.set_attr("num_tokens", int64_t(s.num_tokens()));
  grp.set_attr("loss_tokens", int64_t(std::accumulate(s.loss_mask.begin(), s.loss_mask.end(), int64_t(0))));
}
}  // namespace

void write_dataset(const std::string& path, const DatasetInfo& info, const DataSplit& train, const DataSplit& valid) {
  h5::File f = h5::File::create(path);
  f.set_attr("tokenizer", info.tokenizer);
  f.set_attr("vocab_size", info.vocab_size);
  f.set_attr("pad_id", info.pad_id);
  f.set_attr("bos_id", info.bos_id);
  f.set_attr("eos_id", info.eos_id);
  f.set_attr("sep_id", info.sep_id);
  f.set_attr("lang_tag_first_id", int64_t(Tokenizer::kFirstLang));
  f.set_attr("languages", join(info.languages, ','));  // also /languages/name
  f.set_attr("created_by", info.created_by);
  f.set_attr("root", info.root);
  if (!info.direction.empty()) f.set_attr("direction", info.direction);
  f.set_attr("loss_mask_meaning", "1 = token is a prediction target counted in the loss");
  f.set_attr("lang_meaning", "index into /languages/name; tag token id = lang_tag_first_id + index");
  f.write_strings("languages/name", info.languages);
  f.write("languages/train_pairs", info.train_pairs);
  f.write("languages/valid_pairs", info.valid_pairs);
  f.write_strings("sources", info.sources);
  if (!info.spm_model.empty())
    f.write("tokenizer/spm_model", std::vector<uint8_t>(info.spm_model.begin(), info.spm_model.end()));
  write_split(f, "train", train);
  write_split(f, "valid", valid);
  f.close();
}

namespace {

const char* const kNotPrepHint = "; is it a file written by `meshmoe prep`?";

// Opens a dataset file and checks that it holds the attributes and the language table, and, for a
// non-empty split, that split's datasets: InputError naming the file and every missing part.
h5::File open_dataset_file(const std::string& path, const std::string& split) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError("dataset " + path + ": no such file; write one with `meshmoe prep gettext -o " + path + "`");
  h5::File f;
  try {
    f = h5::File::open(path);
  } catch (const Error& e) {
    throw InputError("dataset " + path + ": cannot be opened as an HDF5 file (" + std::string(e.what()) + ")");
  }
  std::vector<std::string> missing;
  for (const char* a : {"tokenizer", "vocab_size", "pad_id", "bos_id", "eos_id", "sep_id"})
    if (!f.has_attr(a)) missing.push_back(std::string("attribute ") + a);
  std::vector<std::string> datasets{"languages/name"};
  if (!split.empty())
    for (const char* part : {"/tokens", "/doc_offsets", "/lang", "/loss_mask"}) datasets.push_back(split + part);
  for (const std::string& d : datasets)
    if (!f.is_dataset(d)) missing.push_back("dataset /" + d);
  if (!missing.empty()) {
    std::string m;
    for (const auto& x : missing) m += (m.empty() ? "" : ", ") + x;
    throw InputError("dataset " + path + ": missing " + m + kNotPrepHint);
  }
  return f;
}

// The bytes DataSplit holds of `split` once read (Dataset::open), from the datasets' sizes.
int64_t split_memory_bytes(h5::File& f, const std::string& split) {
  // The element sizes Dataset::open reads into: uint16 or uint32 tokens, uint8, int64, int32.
  const std::pair<const char*, int64_t> parts[] = {{"/tokens", 0}, {"/loss_mask", 1}, {"/doc_offsets", 8}, {"/lang", 4}};
  int64_t bytes = 0;
  for (const auto& [part, size] : parts)
    if (f.is_dataset(split + part)) {
      const h5::Dataset d = f.dataset(split + part);
      bytes += d.size() * (size > 0 ? size : d.type_size() == 4 ? 4 : 2);
    }
  return bytes;
}

// The attributes and language table of an opened dataset file (h5 errors propagate).
DatasetInfo read_dataset_info(h5::File& f) {
  DatasetInfo info;
  info.tokenizer = f.attr<std::string>("tokenizer");
  info.vocab_size = f.attr<int64_t>("vocab_size");
  info.pad_id = f.attr<int64_t>("pad_id");
  info.bos_id = f.attr<int64_t>("bos_id");
  info.eos_id = f.attr<int64_t>("eos_id");
  info.sep_id = f.attr<int64_t>("sep_id");
  if (f.has_attr("created_by")) info.created_by = f.attr<std::string>("created_by");
  if (f.has_attr("root")) info.root = f.attr<std::string>("root");
  // Files from before --direction hold xx-en.
  if (f.has_attr("direction")) info.direction = f.attr<std::string>("direction");
  else if (info.created_by == "meshmoe prep gettext") info.direction = "xx-en";
  info.languages = f.read_strings("languages/name");
  // The tokenizer's rule for a tag's name (data/tokenizer.cpp), checked here to name the file.
  for (size_t i = 0; i < info.languages.size(); ++i) {
    const std::string& l = info.languages[i];
    if (l.empty() || l.find_first_of("<> \t\n") != std::string::npos)
      throw InputError("dataset " + f.file_name() + ": /languages/name[" + std::to_string(i) + "] = '" + l +
                       "' is not a language name (non-empty, without '<', '>' or spaces)" + kNotPrepHint);
  }
  if (f.is_dataset("languages/train_pairs")) info.train_pairs = f.read<int64_t>("languages/train_pairs");
  if (f.is_dataset("languages/valid_pairs")) info.valid_pairs = f.read<int64_t>("languages/valid_pairs");
  if (f.is_dataset("sources")) info.sources = f.read_strings("sources");
  if (f.is_dataset("tokenizer/spm_model")) {
    const std::vector<uint8_t> model = f.read<uint8_t>("tokenizer/spm_model");
    info.spm_model.assign(model.begin(), model.end());
  }
  info.train_bytes = split_memory_bytes(f, "train");
  info.valid_bytes = split_memory_bytes(f, "valid");
  if (f.is_dataset("train/lang")) info.train_examples = f.dataset("train/lang").size();
  return info;
}

}  // namespace

DatasetInfo Dataset::read_info(const std::string& path) {
  h5::File f = open_dataset_file(path, "");
  try {
    return read_dataset_info(f);
  } catch (const Error& e) {
    throw InputError("dataset " + path + ": cannot be read (" + std::string(e.what()) + ")" + kNotPrepHint);
  }
}

Dataset Dataset::open(const std::string& path, const std::string& split) {
  if (split != "train" && split != "valid")
    throw InputError("dataset " + path + ": unknown split '" + split + "' (train or valid)");
  h5::File f = open_dataset_file(path, split);
  Dataset d;
  d.path_ = path;
  d.split_name_ = split;
  try {
    d.info_ = read_dataset_info(f);
    DataSplit& s = d.split_;
    h5::Dataset tokens = f.dataset(split + "/tokens");
    if (tokens.type_class() != H5T_INTEGER || (tokens.type_size() != 2 && tokens.type_size() != 4))
      throw InputError("dataset " + path + ": /" + split + "/tokens must hold uint16 or uint32 integers" + kNotPrepHint);
    s.wide = tokens.type_size() == 4;
    if (s.wide) s.tokens32 = tokens.read<uint32_t>();
    else s.tokens16 = tokens.read<uint16_t>();
    s.doc_offsets = f.read<int64_t>(split + "/doc_offsets");
    s.lang = f.read<int32_t>(split + "/lang");
    s.loss_mask = f.read<uint8_t>(split + "/loss_mask");
  } catch (const Error& e) {
    throw InputError("dataset " + path + ": cannot be read (" + std::string(e.what()) + ")" + kNotPrepHint);
  }
  if (d.split_.doc_offsets.empty()) throw InputError("dataset " + path + ": /" + split + "/doc_offsets is empty" + kNotPrepHint);
  d.validate();
  // Every step of a run on it would have no loss (NaN) and be skipped.
  if (split == "train" && !d.split_.has_target())
    throw InputError("no target token (loss_mask = 1) in " + path + " /train: nothing to train on");
  return d;
}

}  // namespace meshmoe
