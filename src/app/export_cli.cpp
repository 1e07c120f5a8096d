#include "app/export_cli.hpp"

#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include "core/error.hpp"
#include "checkpoint/checkpoint.hpp"
#include "data/dataset.hpp"
#include "io/output_file.hpp"
#include "io/safetensors.hpp"

namespace meshmoe {

namespace {

namespace fs = std::filesystem;

std::string base64(const std::string& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += abc[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += abc[(v >> 18) & 63];
    out += abc[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? abc[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string json_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ",\"" : "\"") + items[i] + "\"";  // names hold no '"' (Tokenizer)
  return out + "]";
}

// The metadata of docs/export.md "Metadata".
std::map<std::string, std::string> export_metadata(const std::string& ckpt, const CheckpointMeta& m,
                                                   const std::string& data_path, const DatasetInfo& d,
                                                   const std::string& version) {
  return {{"format", "meshmoe"},
          {"meshmoe_version", version},
          {"checkpoint", ckpt},
          {"step", std::to_string(m.step)},
          {"deck", m.deck},
          {"data_path", data_path},
          {"data_fingerprint", m.data_fingerprint},
          {"tokenizer", d.tokenizer},
          {"vocab_size", std::to_string(d.vocab_size)},
          {"pad_id", std::to_string(d.pad_id)},
          {"bos_id", std::to_string(d.bos_id)},
          {"eos_id", std::to_string(d.eos_id)},
          {"sep_id", std::to_string(d.sep_id)},
          {"lang_tag_first_id", std::to_string(Tokenizer::kFirstLang)},
          {"languages", json_list(d.languages)},
          {"direction", d.direction},
          {"spm_model_base64", base64(d.spm_model)}};
}

int export_checkpoint(const ExportCliOptions& opt, const std::string& version) {
  const std::string path = find_named_checkpoint(opt.checkpoint);
  if (same_file(path, opt.output))
    throw InputError("export: the output " + opt.output + " is the checkpoint itself; name another file");
  const CheckpointMeta meta = read_checkpoint_meta(path);
  const std::string data_path = opt.data.empty() ? meta.data_path : opt.data;
  // Never an input, and an existing file only when it is an earlier export (src/io/output_file.hpp).
  check_output_path(opt.output, {"export", "-o", {path, data_path}, {}});
  if (fs::exists(opt.output) && !is_safetensors_file(opt.output))
    throw InputError("export: the output file " + opt.output + " exists and is not a safetensors file: refusing to replace "
                     "it, only an earlier export is replaced (remove it yourself; give another -o)");
  if (data_path.empty())
    throw InputError("export: " + path + " does not record the dataset it was trained on; name it with --data DATA.h5 "
                     "(its tokenizer goes into the file)");
  DatasetInfo info;
  try {
    info = Dataset::read_info(data_path);
  } catch (const InputError& e) {
    throw InputError(std::string(e.what()) + (opt.data.empty() ? " (the checkpoint's dataset; give it with --data DATA.h5)" : ""));
  }
  std::vector<SafeTensor> tensors;
  int64_t elements = 0;
  for (LogicalTensor& t : read_logical_tensors(path)) {
    elements += int64_t(t.data.size());
    tensors.push_back({t.name, t.shape, std::move(t.data)});
  }
  write_safetensors(opt.output, tensors, export_metadata(path, meta, data_path, info, version));
  std::printf("export: %s (step %lld) -> %s: %zu tensors, %lld values, deck and tokenizer (%s) in the metadata\n",
              path.c_str(), (long long)meta.step, opt.output.c_str(), tensors.size(), (long long)elements,
              info.tokenizer.c_str());
  return kExitOk;
}

}  // namespace

int export_main(const ExportCliOptions& opt, const std::string& version) {
  int rc = kExitFailure, rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    try {
      rc = export_checkpoint(opt, version);
    } catch (const InputError& e) {
      for (const auto& m : e.messages()) std::fprintf(stderr, "meshmoe: error: %s\n", m.c_str());
      rc = kExitInputError;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "meshmoe: export: %s\n", e.what());
      rc = kExitFailure;
    }
    std::fflush(stdout);
    std::fflush(stderr);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
}

}  // namespace meshmoe
