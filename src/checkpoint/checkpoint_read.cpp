// Reading checkpoints (checkpoint.hpp): the attributes, a resume's read on any mesh, and `ckpt
// verify` (`train --init-from` and the export's read: checkpoint_init.cpp).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>

#include "core/error.hpp"
#include "core/sizes.hpp"
#include "mesh/agree.hpp"
#include "checkpoint/checkpoint_format.hpp"

namespace meshmoe {

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

// Reads a whole float dataset slab by slab (bounded memory); the Fletcher32 filter checks each chunk.
// Every value must be finite, and >= 0 when `nonnegative`; else throws Error naming the first bad one.
void read_fully(const h5::Dataset& d, const std::string& name, bool nonnegative) {
  const auto shape = d.shape();
  if (shape.empty()) throw Error(d.path() + ": a scalar (0-d) dataset; a checkpoint tensor has rank >= 1");
  if (d.type_class() != H5T_FLOAT) throw Error(d.path() + ": not a floating-point dataset");
  if (product(shape) == 0) return;
  const int64_t row = product(shape) / shape[0];
  const int64_t rows = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(row, 1));
  std::vector<float> buf;
  for (int64_t r0 = 0; r0 < shape[0]; r0 += rows) {
    std::vector<int64_t> off(shape.size(), 0), cnt = shape;
    off[0] = r0;
    cnt[0] = std::min(rows, shape[0] - r0);
    buf.resize(size_t(product(cnt)));
    d.read_block(off, cnt, buf.data());
    if (const int64_t i = first_bad_value(buf.data(), int64_t(buf.size()), nonnegative); i >= 0)
      throw Error(std::string(std::isfinite(buf[size_t(i)]) ? "negative second moment: " : "non-finite value: ") +
                  bad_value_str(name, off, cnt, i, buf[size_t(i)]));
  }
}

}  // namespace

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  try {
    h5::File f = h5::File::open(path);
    return read_meta_attrs(f);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw InputError("cannot read checkpoint " + path + ": " + e.what());
  }
}

CheckpointMeta read_checkpoint(const std::string& path, ParamStore<float>& store, std::vector<StateTensor>& state,
                               MPI_Comm comm) {
  // The union of the parameter names of all ranks (pipeline stages hold different ones), to
  // catch a checkpoint of a bigger model.
  Out o;
  for (const auto& p : store.infos()) o.str(p.name);
  std::set<std::string> model_params;
  for (const auto& s : allgather_strings(o.buf, comm)) {
    In in(s);
    while (!in.done()) model_params.insert(in.str());
  }

  // Independent reads: each rank opens the file read-only on its own and reads its blocks.
  CheckpointMeta meta;
  std::string err;
  try {
    if (!fs::is_regular_file(path)) throw InputError("checkpoint " + path + " does not exist or is not a file");
    h5::File f = h5::File::open(path);
    meta = read_meta_attrs(f);
    std::vector<std::string> bad;  // compatibility problems, all of them
    auto check_shape = [&](const std::string& dpath, const std::vector<int64_t>& logical, const char* what,
                           const std::string& name) {
      if (!f.is_dataset(dpath)) {
        bad.push_back(std::string(what) + " '" + name + "' " + shape_str(logical) + " is not in the checkpoint");
        return false;
      }
      const h5::Dataset d = f.dataset(dpath);
      if (d.type_class() != H5T_FLOAT) {
        bad.push_back(std::string(what) + " '" + name + "' is not a floating-point dataset in the checkpoint");
        return false;
      }
      auto shape = d.shape();
      if (shape != logical) {
        bad.push_back(std::string(what) + " '" + name + "' is " + shape_str(shape) + " in the checkpoint, " +
                      shape_str(logical) + " in this model");
        return false;
      }
      return true;
    };
    std::vector<bool> ok_p, ok_s;
    for (const auto& p : store.infos()) ok_p.push_back(check_shape("/params/" + p.name, p.logical_shape, "parameter", p.name));
    for (const auto& t : state) ok_s.push_back(check_shape("/optim/" + t.name, t.logical_shape, "optimizer state", t.name));
    for (const auto& c : f.group("params").children())
      if (!model_params.count(c)) bad.push_back("the checkpoint holds parameter '" + c + "', which this model does not have");
    if (!bad.empty()) {
      std::string msg = std::string(kIncompatibleModel) + ": " + path + ":";
      for (size_t i = 0; i < bad.size() && i < 12; ++i) msg += "\n  " + bad[i];
      if (bad.size() > 12) msg += "\n  ... and " + std::to_string(bad.size() - 12) + " more";
      throw InputError(msg);
    }
    // Read on the host, checked there, then uploaded (transfer points on a device). With one copy
    // of the weights per node its first rank alone reads, checks and writes them.
    std::optional<HostCopy<float>> weights;
    if (store.writes_all_weights()) weights.emplace(store.weights(), store.size());
    if (weights)
      for (const auto& p : store.infos())
        f.dataset("/params/" + p.name).read_block(p.offset, p.local_shape, weights->data() + p.flat_offset);
    std::vector<std::vector<float>> values(state.size());
    for (size_t s = 0; s < state.size(); ++s) {
      const StateTensor& t = state[s];
      if (!t.data) throw Error("checkpoint: optimizer state '" + t.name + "' has no buffer");
      values[s].resize(size_t(product(t.local_shape)));
      f.dataset("/optim/" + t.name).read_block(t.offset, t.local_shape, values[s].data());
    }
    // A state that is not finite cannot train (a resume from it would only run non-finite steps):
    // the same check as `ckpt verify`, on the blocks this rank read (run.resume = PATH skips verify).
    if (weights)
      for (const auto& p : store.infos())
        if (const int64_t i = first_bad_value(weights->data() + p.flat_offset, product(p.local_shape), false); i >= 0)
          throw InputError("checkpoint " + path + " is bad: non-finite value: " +
                           bad_value_str("/params/" + p.name, p.offset, p.local_shape, i, weights->data()[p.flat_offset + size_t(i)]));
    for (size_t s = 0; s < state.size(); ++s) {
      const StateTensor& t = state[s];
      const std::vector<float>& v = values[s];
      const bool nonnegative = is_second_moment_state(t.name);
      if (const int64_t i = first_bad_value(v.data(), int64_t(v.size()), nonnegative); i >= 0)
        throw InputError("checkpoint " + path + " is bad: " +
                         (std::isfinite(v[size_t(i)]) ? "negative second moment: " : "non-finite value: ") +
                         bad_value_str("/optim/" + t.name, t.offset, t.local_shape, i, v[size_t(i)]));
    }
    if (weights) weights->upload();
    for (size_t s = 0; s < state.size(); ++s) upload(*state[s].data, values[s].data(), values[s].size());
  } catch (const InputError& e) {
    err = e.what();
  } catch (const std::exception& e) {
    err = "cannot read checkpoint " + path + " (corrupt or truncated?): " + e.what();
  }
  if (auto e = first_error(err, comm); !e.empty()) throw InputError(e);
  store.publish_weights();  // one copy per node: its first rank's writes, to every rank
  return meta;
}

VerifyResult verify_checkpoint(const std::string& path) {
  VerifyResult r;
  try {
    if (!fs::is_regular_file(path)) throw Error(path + " does not exist or is not a file");
    h5::File f = h5::File::open(path);
    CheckpointMeta m = read_meta_attrs(f);
    if (!f.is_group("params") || !f.is_group("optim")) throw Error("the /params or /optim group is missing");
    std::vector<std::pair<std::string, h5::Dataset>> params, optim;
    walk_datasets(f.group("params"), "", params);
    walk_datasets(f.group("optim"), "", optim);
    int64_t count = 0;
    for (const auto& [n, d] : params) read_fully(d, "/params/" + n, false), count += d.size();
    for (const auto& [n, d] : optim) read_fully(d, "/optim/" + n, is_second_moment_state(n));
    if (int64_t(params.size()) != f.attr<int64_t>("param_tensors") || int64_t(optim.size()) != f.attr<int64_t>("optim_tensors"))
      throw Error("holds " + std::to_string(params.size()) + " parameter and " + std::to_string(optim.size()) +
                  " optimizer tensors, its attributes say " + std::to_string(f.attr<int64_t>("param_tensors")) + " and " +
                  std::to_string(f.attr<int64_t>("optim_tensors")));
    if (count != m.param_count)
      throw Error("holds " + std::to_string(count) + " parameter elements, param_count says " + std::to_string(m.param_count));
    r.ok = true;
    r.message = "ok: step " + std::to_string(m.step) + ", " + std::to_string(params.size()) + " parameters (" +
                std::to_string(count) + " elements), " + std::to_string(optim.size()) + " optimizer tensors";
  } catch (const std::exception& e) {
    r.ok = false;
    r.message = e.what();
  }
  return r;
}

}  // namespace meshmoe
