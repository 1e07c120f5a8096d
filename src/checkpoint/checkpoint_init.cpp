// A run started from another model's tensors (checkpoint.hpp): `train --init-from` a checkpoint or
// a safetensors export, with sparse upcycling (Komatsuzaki et al. 2023, "Sparse Upcycling",
// section 3: every expert of an MoE layer starts as the dense feed-forward it replaces, the router
// fresh); and the logical tensors of a checkpoint that `meshmoe export` writes.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/error.hpp"
#include "core/philox.hpp"
#include "io/safetensors.hpp"
#include "mesh/agree.hpp"
#include "checkpoint/checkpoint_format.hpp"
#include "checkpoint/hf_layout.hpp"

namespace meshmoe {

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

// fn(i, g) for every element of the block [offset, offset + count) of a row-major tensor of
// `shape`: i its index in the block (row-major), g its index in the whole tensor.
template <typename Fn>
void for_block(const std::vector<int64_t>& shape, const std::vector<int64_t>& offset, const std::vector<int64_t>& count,
               Fn&& fn) {
  const size_t r = shape.size();
  if (product(count) == 0) return;
  std::vector<int64_t> idx(r, 0);
  for (int64_t i = 0;; ++i) {
    int64_t g = 0;
    for (size_t d = 0; d < r; ++d) g = g * shape[d] + offset[d] + idx[d];
    fn(i, g);
    size_t d = r;
    while (d > 0 && ++idx[d - 1] == count[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
}

// The tensors an --init-from file holds: an HDF5 checkpoint's /params or a safetensors file's.
class InitSource {
 public:
  explicit InitSource(const std::string& path) {
    if (is_safetensors_file(path)) {
      st_ = read_safetensors(path);
      if (is_hf_layout(*st_)) st_ = from_hf_layout(*st_, path);  // export --layout hf: back to meshmoe's names
      for (const SafeTensor& t : st_->tensors) index_[t.name] = &t;
    } else {
      h5_.emplace(h5::File::open(path));
      read_meta_attrs(*h5_);  // a meshmoe checkpoint, not any HDF5 file
    }
  }
  std::optional<std::vector<int64_t>> shape(const std::string& name) const {
    if (st_) {
      const auto it = index_.find(name);
      return it == index_.end() ? std::nullopt : std::optional(it->second->shape);
    }
    const std::string d = "/params/" + name;
    return h5_->is_dataset(d) ? std::optional(h5_->dataset(d).shape()) : std::nullopt;
  }
  void read_block(const std::string& name, const std::vector<int64_t>& offset, const std::vector<int64_t>& count,
                  float* out) const {
    if (!st_) return h5_->dataset("/params/" + name).read_block(offset, count, out);
    const SafeTensor& t = *index_.at(name);
    for_block(t.shape, offset, count, [&](int64_t i, int64_t g) { out[i] = t.data[size_t(g)]; });
  }

 private:
  std::optional<h5::File> h5_;
  std::optional<SafeTensorsFile> st_;
  std::map<std::string, const SafeTensor*> index_;
};

// "blocks.<i>.moe.experts.w_in" -> ("blocks.<i>.mlp.w_in", i, 0); w_out: 1. Not an expert tensor: i = -1.
struct UpcycleSource {
  std::string dense;
  int block = -1, which = 0;
};
UpcycleSource upcycle_source(const std::string& name) {
  const std::string head = "blocks.", mid = ".moe.experts.";
  if (name.rfind(head, 0) != 0) return {};
  size_t p = head.size(), q = p;
  while (q < name.size() && std::isdigit(static_cast<unsigned char>(name[q]))) ++q;
  if (q == p || name.compare(q, mid.size(), mid) != 0) return {};
  const std::string w = name.substr(q + mid.size());
  if (w != "w_in" && w != "w_out") return {};
  return {name.substr(0, q) + ".mlp." + w, std::stoi(name.substr(p, q - p)), w == "w_out" ? 1 : 0};
}

// Names in the model's order: digit runs compare as numbers ("blocks.2" before "blocks.10").
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      const long long x = std::stoll(a.substr(i, i2 - i)), y = std::stoll(b.substr(j, j2 - j));
      if (x != y) return x < y;
      i = i2, j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

enum class Fate : int64_t { Kept = 0, Copied = 1, Upcycled = 2, Mismatched = 3 };

}  // namespace

InitFromResult init_from_checkpoint(const std::string& path, ParamStore<float>& store, MPI_Comm comm,
                                    const InitFromOptions& opt) {
  Out mine;  // per parameter of this rank: its fate, its name, the reason of a mismatch
  std::string err;
  try {
    if (!fs::is_regular_file(path)) throw InputError("--init-from " + path + " does not exist or is not a file");
    const InitSource src(path);
    std::optional<HostCopy<float>> weights;  // read on the host, then uploaded (one copy: its first rank's)
    if (store.writes_all_weights()) weights.emplace(store.weights(), store.size());
    for (const auto& p : store.infos()) {
      Fate fate = Fate::Kept;
      std::string why;
      const auto shape = src.shape(p.name);
      const UpcycleSource up = opt.upcycle ? upcycle_source(p.name) : UpcycleSource{};
      const auto dense = up.block >= 0 ? src.shape(up.dense) : std::nullopt;
      if (shape) {
        fate = *shape == p.logical_shape ? Fate::Copied : Fate::Mismatched;
        if (fate == Fate::Mismatched) why = shape_str(*shape) + " in the file, " + shape_str(p.logical_shape) + " in this model";
      } else if (dense) {
        const std::vector<int64_t> one(p.logical_shape.begin() + 1, p.logical_shape.end());
        fate = *dense == one ? Fate::Upcycled : Fate::Mismatched;
        if (fate == Fate::Mismatched)
          why = "cannot be upcycled from " + up.dense + " " + shape_str(*dense) + ": one expert is " + shape_str(one) +
                " (moe.expert_d_ff must equal the dense model's model.d_ff, and model.activation be the same)";
      }
      if (weights && (fate == Fate::Copied || fate == Fate::Upcycled)) {
        float* block = weights->data() + p.flat_offset;
        if (fate == Fate::Copied) {
          src.read_block(p.name, p.offset, p.local_shape, block);
        } else {
          // Expert e0 + e of the block reads the dense tensor's block of this rank's hidden units.
          const std::vector<int64_t> off(p.offset.begin() + 1, p.offset.end()), cnt(p.local_shape.begin() + 1, p.local_shape.end());
          const int64_t inner = product(cnt);
          for (int64_t e = 0; e < p.local_shape[0]; ++e) src.read_block(up.dense, off, cnt, block + e * inner);
          if (opt.upcycle_noise != 0) {
            const Rng rng{opt.seed, 0, uint32_t(2 * up.block + up.which), RngPurpose::UpcycleNoise};
            for_block(p.logical_shape, p.offset, p.local_shape, [&](int64_t i, int64_t g) {
              block[i] = float(double(block[i]) * (1.0 + opt.upcycle_noise * (2.0 * rng.uniform_double(uint64_t(g)) - 1.0)));
            });
          }
        }
        if (const int64_t i = first_bad_value(block, product(p.local_shape), false); i >= 0)
          throw InputError("--init-from " + path + " is bad: non-finite value: " +
                           bad_value_str(fate == Fate::Copied ? p.name : up.dense, p.offset, p.local_shape, i, block[size_t(i)]));
      }
      mine.i64(int64_t(fate));
      mine.str(p.name);
      mine.str(why);
    }
    if (weights) weights->upload();
  } catch (const InputError& e) {
    err = e.what();
  } catch (const std::exception& e) {
    err = "cannot read --init-from file " + path + " (corrupt or truncated?): " + e.what();
  }
  if (auto e = first_error(err, comm); !e.empty()) throw InputError(e);
  store.publish_weights();  // one copy per node: its first rank's writes, to every rank
  std::map<std::string, std::pair<Fate, std::string>> all;
  for (const auto& s : allgather_strings(mine.buf, comm)) {
    In in(s);
    while (!in.done()) {
      const Fate f = Fate(in.i64());
      std::string name = in.str(), why = in.str();
      all[name] = {f, why};
    }
  }
  InitFromResult r;
  for (const auto& [name, fw] : all) {
    switch (fw.first) {
      case Fate::Kept: r.kept.push_back(name); break;
      case Fate::Copied: r.copied.push_back(name); break;
      case Fate::Upcycled: r.upcycled.push_back(name); break;
      case Fate::Mismatched: r.mismatched.push_back(name + ": " + fw.second); break;
    }
  }
  auto refuse = [&](const std::string& what, const std::vector<std::string>& list) {
    std::string msg = "--init-from " + path + ": " + what;
    for (size_t i = 0; i < list.size() && i < 12; ++i) msg += "\n  " + list[i];
    if (list.size() > 12) msg += "\n  ... and " + std::to_string(list.size() - 12) + " more";
    throw InputError(msg);
  };
  if (opt.upcycle && r.upcycled.empty())
    refuse("--upcycle: no expert tensor of this deck has a dense feed-forward blocks.<i>.mlp.w_in / w_out of the same block "
           "index in the file (the deck needs MoE blocks where the file's model has dense ones)", r.mismatched);
  if (!opt.partial && !r.mismatched.empty())
    refuse(std::to_string(r.mismatched.size()) + " tensor(s) have this model's name but another shape (the deck's model "
           "is not the file's; --init-partial copies only what matches):", r.mismatched);
  if (!opt.partial && r.copied.empty() && r.upcycled.empty())
    refuse("no parameter of this model is in the file under its name and shape, nothing would be copied (a file of "
           "another model? --init-partial starts anyway)", {});
  return r;
}

std::vector<LogicalTensor> read_logical_tensors(const std::string& path) {
  std::vector<LogicalTensor> out;
  try {
    if (!fs::is_regular_file(path)) throw InputError("checkpoint " + path + " does not exist or is not a file");
    h5::File f = h5::File::open(path);
    read_meta_attrs(f);
    std::vector<std::pair<std::string, h5::Dataset>> params, optim;
    walk_datasets(f.group("params"), "", params);
    walk_datasets(f.group("optim"), "", optim);
    auto read = [&](const std::string& name, const h5::Dataset& d) {
      LogicalTensor t{name, d.shape(), {}};
      t.data.resize(size_t(product(t.shape)));
      if (!t.data.empty()) d.read_block(std::vector<int64_t>(t.shape.size(), 0), t.shape, t.data.data());
      if (const int64_t i = first_bad_value(t.data.data(), int64_t(t.data.size()), false); i >= 0)
        throw InputError("checkpoint " + path + " is bad: non-finite value: " +
                         bad_value_str(name, std::vector<int64_t>(t.shape.size(), 0), t.shape, i, t.data[size_t(i)]));
      out.push_back(std::move(t));
    };
    for (const auto& [name, d] : params) read(name, d);
    const std::string bias = "/selection_bias";
    for (const auto& [name, d] : optim)
      if (name.size() > bias.size() && name.compare(name.size() - bias.size(), bias.size(), bias) == 0) read(name, d);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw InputError("cannot read checkpoint " + path + " (corrupt or truncated?): " + e.what());
  }
  std::stable_sort(out.begin(), out.end(), [](const LogicalTensor& a, const LogicalTensor& b) { return natural_less(a.name, b.name); });
  return out;
}

}  // namespace meshmoe
