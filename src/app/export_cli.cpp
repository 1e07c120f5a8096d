#include "app/export_cli.hpp"

#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "core/error.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/hf_layout.hpp"
#include "data/dataset.hpp"
#include "deck/deck.hpp"
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
  const bool hf = opt.layout == "hf";
  if (!hf && !opt.config.empty())
    throw InputError("export: --config " + opt.config + " needs --layout hf (config.json describes the Hugging Face Mixtral model)");
  std::error_code ec;
  // --layout hf -o DIR: the directory a Hugging Face from_pretrained reads.
  const bool to_dir = hf && fs::is_directory(opt.output, ec);
  const std::string output = to_dir ? (fs::path(opt.output) / "model.safetensors").string() : opt.output;
  const std::string config = to_dir && opt.config.empty() ? (fs::path(opt.output) / "config.json").string() : opt.config;
  if (same_file(path, output))
    throw InputError("export: the output " + output + " is the checkpoint itself; name another file");
  const CheckpointMeta meta = read_checkpoint_meta(path);
  std::optional<Config> cfg;
  if (hf) {
    cfg = parse_deck(meta.deck, path + ":/meta/deck").cfg;
    check_hf_layout_deck(*cfg, "export --layout hf: " + path);
  }
  const std::string data_path = opt.data.empty() ? meta.data_path : opt.data;
  // Never an input, and an existing file only when it is an earlier export (src/io/output_file.hpp);
  // config.json only over a text file.
  check_output_path(output, {"export", "-o", {path, data_path}, {}});
  if (fs::exists(output) && !is_safetensors_file(output))
    throw InputError("export: the output file " + output + " exists and is not a safetensors file: refusing to replace "
                     "it, only an earlier export is replaced (remove it yourself; give another -o)");
  if (!config.empty()) check_output_path(config, {"export", "--config", {path, data_path, output}, {}, /*text=*/true});
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
  if (hf) {
    tensors = to_hf_layout(read_logical_tensors(path));
    for (const SafeTensor& t : tensors) elements += int64_t(t.data.size());
  } else {
    for (LogicalTensor& t : read_logical_tensors(path)) {
      elements += int64_t(t.data.size());
      tensors.push_back({t.name, t.shape, std::move(t.data)});
    }
  }
  std::map<std::string, std::string> metadata = export_metadata(path, meta, data_path, info, version);
  if (hf) {
    metadata["format"] = "pt";  // what Hugging Face's loader requires of a PyTorch checkpoint's metadata
    metadata["layout"] = "hf";
  }
  write_safetensors(output, tensors, metadata);
  std::printf("export: %s (step %lld) -> %s: %zu tensors, %lld values, deck and tokenizer (%s) in the metadata%s\n",
              path.c_str(), (long long)meta.step, output.c_str(), tensors.size(), (long long)elements,
              info.tokenizer.c_str(), hf ? ", Hugging Face Mixtral layout" : "");
  if (hf) {
    const SafeTensor* embed = nullptr;
    for (const SafeTensor& t : tensors)
      if (t.name == "model.embed_tokens.weight") embed = &t;
    if (!embed) throw Error("export: " + path + " has no token embedding");
    if (config.empty()) {
      std::printf("export: no config.json written (give --config FILE, or -o DIR for DIR/model.safetensors and DIR/config.json)\n");
    } else {
      replace_text_file(config, hf_config_json(*cfg, embed->shape[0], info.bos_id, info.eos_id, info.pad_id));
      std::printf("export: MixtralConfig -> %s\n", config.c_str());
    }
  }
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
