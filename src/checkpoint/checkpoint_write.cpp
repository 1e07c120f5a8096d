// write_checkpoint (checkpoint.hpp): the plan of who writes which block, the check of the values,
// the collective write of step_N.h5.tmp, and its commit (checkpoint_dir.cpp).
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.hpp"
#include "core/sizes.hpp"
#include "mesh/agree.hpp"
#include "checkpoint/checkpoint_format.hpp"

namespace meshmoe {

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

// ---------------------------------------------------------------------------------------------
// The global plan of a write: every tensor of every rank, and who writes which block.

struct Held {  // one tensor block this rank holds
  Kind kind;
  std::string name;
  std::vector<int64_t> logical, offset, local;
  const float* data;
};

struct Block {
  std::vector<int64_t> offset, local;
  int writer;  // lowest world rank holding exactly this block
};
struct Planned {
  Kind kind;
  std::string name;
  std::vector<int64_t> logical;
  std::vector<Block> blocks;  // distinct blocks, tiling the logical shape
};

// The blocks as the host reads them: on a device, host copies kept in `staged` (transfer points).
std::vector<Held> held_tensors(const ParamStore<float>& store, const std::vector<StateTensor>& state,
                               std::deque<HostStaged>& staged) {
  std::vector<Held> out;
  const auto on_host = [&](const float* p, size_t n) {
    return static_cast<const float*>(staged.emplace_back(p, n * sizeof(float), /*read=*/true).host());
  };
  const float* weights = on_host(store.weights(), store.size());
  for (const auto& p : store.infos())
    out.push_back({Kind::Param, p.name, p.logical_shape, p.offset, p.local_shape, weights + p.flat_offset});
  for (const auto& t : state) {
    if (!t.data || int64_t(t.data->size()) != product(t.local_shape))
      throw Error("checkpoint: optimizer state '" + t.name + "' holds " + std::to_string(t.data ? t.data->size() : 0) +
                  " values for its block " + shape_str(t.local_shape));
    out.push_back(
        {Kind::Optim, t.name, t.logical_shape, t.offset, t.local_shape, on_host(t.data->data(), t.data->size())});
  }
  std::set<std::pair<Kind, std::string>> seen;
  for (const auto& h : out) {
    if (h.logical.empty()) throw Error("checkpoint: tensor '" + h.name + "' is a scalar (0-d); give it shape [1]");
    if (h.logical.size() != h.offset.size() || h.logical.size() != h.local.size())
      throw Error("checkpoint: tensor '" + h.name + "': block and logical shape differ in rank");
    for (size_t d = 0; d < h.logical.size(); ++d)
      if (h.offset[d] < 0 || h.local[d] < 0 || h.offset[d] + h.local[d] > h.logical[d])
        throw Error("checkpoint: tensor '" + h.name + "': block offset " + shape_str(h.offset) + " size " +
                    shape_str(h.local) + " outside its logical shape " + shape_str(h.logical));
    if (!seen.insert({h.kind, h.name}).second) throw Error("checkpoint: tensor '" + h.name + "' registered twice");
  }
  return out;
}

bool overlap(const Block& a, const Block& b) {
  for (size_t d = 0; d < a.offset.size(); ++d)
    if (a.offset[d] + a.local[d] <= b.offset[d] || b.offset[d] + b.local[d] <= a.offset[d]) return false;
  return true;
}

// Collective: the same plan on every rank (tensors in order of first appearance over the ranks).
std::vector<Planned> make_plan(const std::vector<Held>& mine, MPI_Comm comm) {
  Out o;
  for (const auto& h : mine) {
    o.i64(int64_t(h.kind));
    o.str(h.name);
    o.dims(h.logical);
    o.dims(h.offset);
    o.dims(h.local);
  }
  const auto all = allgather_strings(o.buf, comm);
  std::vector<Planned> plan;
  std::map<std::pair<Kind, std::string>, size_t> index;
  for (int r = 0; r < int(all.size()); ++r) {
    In in(all[size_t(r)]);
    while (!in.done()) {
      Kind k = Kind(in.i64());
      std::string name = in.str();
      auto logical = in.dims(), offset = in.dims(), local = in.dims();
      auto [it, fresh] = index.try_emplace({k, name}, plan.size());
      if (fresh) plan.push_back({k, name, logical, {}});
      Planned& t = plan[it->second];
      if (t.logical != logical)
        throw Error("checkpoint: ranks disagree on the logical shape of '" + name + "': " + shape_str(t.logical) +
                    " and " + shape_str(logical) + " (rank " + std::to_string(r) + ")");
      if (product(local) == 0) continue;
      bool known = false;
      for (const auto& b : t.blocks) known = known || (b.offset == offset && b.local == local);
      if (!known) t.blocks.push_back({offset, local, r});  // ranks visited in order: lowest rank wins
    }
  }
  // The distinct blocks must tile the tensor: pairwise disjoint and as many elements as it has.
  for (const auto& t : plan) {
    int64_t covered = 0;
    for (size_t i = 0; i < t.blocks.size(); ++i) {
      covered += product(t.blocks[i].local);
      for (size_t j = 0; j < i; ++j)
        if (overlap(t.blocks[i], t.blocks[j]))
          throw Error("checkpoint: blocks of '" + t.name + "' overlap without being equal: offset " +
                      shape_str(t.blocks[i].offset) + " size " + shape_str(t.blocks[i].local) + " (rank " +
                      std::to_string(t.blocks[i].writer) + ") and offset " + shape_str(t.blocks[j].offset) + " size " +
                      shape_str(t.blocks[j].local) + " (rank " + std::to_string(t.blocks[j].writer) + ")");
    }
    if (covered != product(t.logical))
      throw Error("checkpoint: the ranks' blocks of '" + t.name + "' cover " + std::to_string(covered) + " of its " +
                  std::to_string(product(t.logical)) + " elements " + shape_str(t.logical));
  }
  return plan;
}

}  // namespace

std::string write_checkpoint(const std::string& ckpt_dir, const ParamStore<float>& store,
                             const std::vector<StateTensor>& state, const CheckpointMeta& meta_in,
                             const Mesh& mesh, const RetentionPolicy& keep) {
  MPI_Comm comm = mesh.world();
  const int me = comm_rank(comm);

  // Rank 0's meta is the truth: attribute writes on a parallel file must agree on every rank.
  CheckpointMeta meta = unpack_meta(broadcast_string(me == 0 ? pack_meta(meta_in) : "", 0, comm));
  meta.mesh = mesh.shape();
  meta.world_size = comm_size(comm);

  std::string err;
  std::vector<Held> mine;
  std::deque<HostStaged> staged;  // on a device: the host copies mine points into
  try {
    mine = held_tensors(store, state, staged);
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (auto e = first_error(err, comm); !e.empty()) throw Error(e);
  const std::vector<Planned> plan = make_plan(mine, comm);  // throws alike on every rank
  int64_t n_params = 0, n_optim = 0;
  for (const auto& t : plan) {
    (t.kind == Kind::Param ? n_params : n_optim) += 1;
    if (t.kind == Kind::Param) meta.param_count += product(t.logical);
  }

  // Never commit a non-finite state as good (a run whose update overflowed the weights would make
  // it LATEST): every rank scans the blocks it writes, one pass, before anything is created.
  {
    std::map<std::pair<Kind, std::string>, const Planned*> planned;
    for (const auto& t : plan) planned[{t.kind, t.name}] = &t;
    for (const auto& h : mine) {
      bool writes = false;
      for (const auto& b : planned.at({h.kind, h.name})->blocks)
        writes = writes || (b.writer == me && b.offset == h.offset && b.local == h.local);
      const bool nonnegative = h.kind == Kind::Optim && is_second_moment_state(h.name);
      const int64_t i = writes ? first_bad_value(h.data, product(h.local), nonnegative) : -1;
      if (i < 0) continue;
      const float v = h.data[i];
      err = std::string(h.kind == Kind::Param ? "the parameters" : "the optimizer state") + " at step " +
            std::to_string(meta.step) + (h.kind == Kind::Param ? " are" : " is") +
            (std::isfinite(v) ? " not valid (" : " not finite (") + bad_value_str(h.name, h.offset, h.local, i, v) + ")";
      break;
    }
  }
  if (auto e = first_error(err, comm); !e.empty()) {
    std::string latest;
    if (me == 0) {
      try {
        latest = read_latest_name(ckpt_dir);
      } catch (const std::exception&) {
      }
    }
    latest = broadcast_string(latest, 0, comm);
    throw NonFiniteState(e + "; no checkpoint written; " +
                         (latest.empty() ? "there is no earlier checkpoint in " + ckpt_dir
                                         : "the newest good checkpoint is " + ckpt_dir + "/LATEST -> " + latest));
  }

  const std::string name = checkpoint_file_name(meta.step);
  const std::string path = ckpt_dir + "/" + name, tmp = path + ".tmp";
  if (me == 0) {
    std::error_code ec;
    fs::create_directories(ckpt_dir, ec);
    if (ec) err = "cannot create the checkpoint directory " + ckpt_dir + ": " + ec.message();
  }
  if (auto e = first_error(err, comm); !e.empty()) throw InputError(e);

  // Collective HDF5 phase. Every rank creates every dataset in plan order.
  try {
    h5::File f = h5::File::create(tmp, comm);
    try {
    write_meta_attrs(f, meta, n_params, n_optim);
    f.create_group("params");
    f.create_group("optim");
    h5::CreateOptions opt;
    opt.fletcher32 = true;
    std::map<std::pair<Kind, std::string>, const Held*> by_name;
    for (const auto& h : mine) by_name[{h.kind, h.name}] = &h;
    for (const auto& t : plan) {
      h5::Dataset d = f.create_dataset<float>(dataset_path(t.kind, t.name), t.logical, opt);
      d.set_attr("kind", std::string(t.kind == Kind::Param ? "parameter" : "optimizer state"));
      std::vector<int64_t> off(t.logical.size(), 0), cnt(t.logical.size(), 0);
      const float* data = nullptr;
      auto it = by_name.find({t.kind, t.name});
      if (it != by_name.end()) {
        const Held& h = *it->second;
        for (const auto& b : t.blocks)
          if (b.writer == me && b.offset == h.offset && b.local == h.local) off = h.offset, cnt = h.local, data = h.data;
      }
      d.write_block(off, cnt, data);  // count 0: this rank selects none
    }
    f.flush();
    f.close();
    } catch (const std::exception& e) {
      // A rank failed inside the collective HDF5 calls (e.g. the disk is full): the others may wait
      // in the same collective, and closing the file is collective too, so no rank can recover.
      // Abort with the reason; the committed checkpoints are untouched (only the .tmp is partial).
      std::fprintf(stderr, "meshmoe: rank %d: fatal: cannot write checkpoint %s: %s\n", me, tmp.c_str(), e.what());
      std::fflush(stderr);
      MPI_Abort(comm, 1);
    }
  } catch (const std::exception& e) {
    err = e.what();  // the file could not be created (on every rank alike)
  }
  if (auto e = first_error(err, comm); !e.empty()) {
    if (me == 0) std::remove(tmp.c_str());
    throw InputError("cannot write checkpoint " + tmp + ": " + e);
  }

  // Commit (rank 0): the data file reaches the disk before its name does, LATEST after both.
  if (me == 0) {
    try {
      commit_checkpoint(tmp, path, ckpt_dir, meta.step, keep);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  if (auto e = first_error(err, comm); !e.empty()) throw InputError("cannot commit checkpoint " + path + ": " + e);
  return path;
}

}  // namespace meshmoe
