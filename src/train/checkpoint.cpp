// Checkpoint files: see checkpoint.hpp.
#include "train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "core/sizes.hpp"
#include "io/h5.hpp"
#include "mesh/agree.hpp"

namespace meshmoe {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "meshmoe checkpoint";
constexpr int64_t kFormatVersion = 1;
// Root attributes every checkpoint has (verify checks them).
const std::vector<std::string> kRequiredAttrs = {
    "format", "format_version", "step", "update_count", "schedule_step", "seed", "data_epoch",
    "data_position", "optimizer", "deck", "version", "mesh", "mesh_shape", "world_size",
    "param_count", "param_tensors", "optim_tensors"};

int64_t product(const std::vector<int64_t>& d) {
  int64_t n = 1;
  for (auto x : d) n *= x;
  return n;
}
int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}
int comm_size(MPI_Comm c) {
  int s = 1;
  MPI_Comm_size(c, &s);
  return s;
}

// ---------------------------------------------------------------------------------------------
// A tiny byte serializer for the allgather of block lists and the broadcast of meta / verdicts.

struct Out {
  std::string buf;
  void i64(int64_t v) { buf.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(const std::string& s) {
    i64(int64_t(s.size()));
    buf += s;
  }
  void dims(const std::vector<int64_t>& d) {
    i64(int64_t(d.size()));
    for (auto x : d) i64(x);
  }
};
struct In {
  const char* p;
  const char* end;
  int64_t i64() {
    if (end - p < 8) throw Error("checkpoint: internal: short message");
    int64_t v;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  }
  std::string str() {
    int64_t n = i64();
    if (n < 0 || end - p < n) throw Error("checkpoint: internal: short message");
    std::string s(p, size_t(n));
    p += n;
    return s;
  }
  std::vector<int64_t> dims() {
    int64_t n = i64();
    std::vector<int64_t> d(size_t(std::max<int64_t>(n, 0)));
    for (auto& x : d) x = i64();
    return d;
  }
  bool done() const { return p >= end; }
};

// Every rank's string, in rank order, on every rank.
std::vector<std::string> allgather_strings(const std::string& mine, MPI_Comm comm) {
  const int n = comm_size(comm);
  int len = int(mine.size());
  std::vector<int> lens(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
  int total = 0;
  for (int r = 0; r < n; ++r) displs[size_t(r)] = total, total += lens[size_t(r)];
  std::string all(size_t(total), '\0');
  MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(all.substr(size_t(displs[size_t(r)]), size_t(lens[size_t(r)])));
  return out;
}


// ---------------------------------------------------------------------------------------------
// The global plan of a write: every tensor of every rank, and who writes which block.

enum class Kind : int64_t { Param = 0, Optim = 1 };

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

std::string dataset_path(Kind k, const std::string& name) {
  return (k == Kind::Param ? "/params/" : "/optim/") + name;
}

std::vector<Held> held_tensors(const ParamStore<float>& store, const std::vector<StateTensor>& state) {
  std::vector<Held> out;
  for (const auto& p : store.infos())
    out.push_back({Kind::Param, p.name, p.logical_shape, p.offset, p.local_shape, store.weights() + p.flat_offset});
  for (const auto& t : state) {
    if (!t.data || int64_t(t.data->size()) != product(t.local_shape))
      throw Error("checkpoint: optimizer state '" + t.name + "' holds " + std::to_string(t.data ? t.data->size() : 0) +
                  " values for its block " + shape_str(t.local_shape));
    out.push_back({Kind::Optim, t.name, t.logical_shape, t.offset, t.local_shape, t.data->data()});
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
    In in{all[size_t(r)].data(), all[size_t(r)].data() + all[size_t(r)].size()};
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

// ---------------------------------------------------------------------------------------------
// Meta <-> bytes (broadcast) and <-> attributes.

// The text attributes a checkpoint may lack (older files): name and member, in one order.
const std::vector<std::string> kOptionalTexts = {"lineage", "forked_from", "data_path", "data_summary",
                                                 "data_fingerprint", "data_languages"};
template <class Meta>
auto optional_texts(Meta& m) {
  return std::vector{&m.lineage, &m.forked_from, &m.data_path, &m.data_summary, &m.data_fingerprint, &m.data_languages};
}

std::string pack_meta(const CheckpointMeta& m) {
  Out o;
  o.i64(m.step);
  o.i64(m.update_count);
  o.i64(int64_t(m.seed));
  o.i64(int64_t(m.data_cursor.epoch));
  o.i64(int64_t(m.data_cursor.position));
  o.str(m.optimizer);
  o.str(m.deck);
  o.str(m.version);
  o.i64(int64_t(m.counters.size()));
  for (const auto& [k, v] : m.counters) o.str(k), o.i64(v);
  for (const std::string* t : optional_texts(m)) o.str(*t);
  o.i64(int64_t(m.lang_tokens.size()));
  for (int64_t v : m.lang_tokens) o.i64(v);
  return o.buf;
}
CheckpointMeta unpack_meta(const std::string& s) {
  In in{s.data(), s.data() + s.size()};
  CheckpointMeta m;
  m.step = in.i64();
  m.update_count = in.i64();
  m.seed = uint64_t(in.i64());
  m.data_cursor.epoch = uint64_t(in.i64());
  m.data_cursor.position = uint64_t(in.i64());
  m.optimizer = in.str();
  m.deck = in.str();
  m.version = in.str();
  for (int64_t n = in.i64(); n > 0; --n) {
    std::string k = in.str();
    m.counters[k] = in.i64();
  }
  for (std::string* t : optional_texts(m)) *t = in.str();
  m.lang_tokens.resize(size_t(in.i64()));
  for (int64_t& v : m.lang_tokens) v = in.i64();
  return m;
}

void write_meta_attrs(h5::File& f, const CheckpointMeta& m, int64_t n_params, int64_t n_optim) {
  f.set_attr("format", std::string(kFormat));
  f.set_attr("format_version", kFormatVersion);
  f.set_attr("step", m.step);
  f.set_attr("update_count", m.update_count);
  f.set_attr("schedule_step", m.step);  // the LR schedule is a pure function of the step
  f.set_attr("seed", int64_t(m.seed));  // uint64 stored bit for bit
  f.set_attr("data_epoch", int64_t(m.data_cursor.epoch));
  f.set_attr("data_position", int64_t(m.data_cursor.position));
  f.set_attr("optimizer", m.optimizer);
  f.set_attr("deck", m.deck);
  f.set_attr("version", m.version);
  f.set_attr("mesh", m.mesh.str());
  f.set_attr("mesh_shape", std::vector<int64_t>{m.mesh.pipe, m.mesh.data, m.mesh.tensor});
  f.set_attr("world_size", m.world_size);
  f.set_attr("param_count", m.param_count);
  f.set_attr("param_tensors", n_params);
  f.set_attr("optim_tensors", n_optim);
  h5::Group c = f.create_group("counters");
  for (const auto& [k, v] : m.counters) c.set_attr(k, v);
  const auto texts = optional_texts(m);
  for (size_t i = 0; i < texts.size(); ++i) f.set_attr(kOptionalTexts[i], *texts[i]);
  if (!m.lang_tokens.empty()) f.set_attr("lang_tokens", m.lang_tokens);
}

CheckpointMeta read_meta_attrs(const h5::File& f) {
  if (!f.has_attr("format") || f.attr<std::string>("format") != kFormat)
    throw InputError(f.file_name() + ": not a meshmoe checkpoint (no format = \"" + kFormat + "\" attribute)");
  if (f.attr<int64_t>("format_version") != kFormatVersion)
    throw InputError(f.file_name() + ": checkpoint format version " + std::to_string(f.attr<int64_t>("format_version")) +
                     ", this program reads version " + std::to_string(kFormatVersion));
  for (const auto& a : kRequiredAttrs)
    if (!f.has_attr(a)) throw InputError(f.file_name() + ": checkpoint attribute '" + a + "' is missing");
  CheckpointMeta m;
  m.step = f.attr<int64_t>("step");
  m.update_count = f.attr<int64_t>("update_count");
  m.seed = uint64_t(f.attr<int64_t>("seed"));
  m.data_cursor.epoch = uint64_t(f.attr<int64_t>("data_epoch"));
  m.data_cursor.position = uint64_t(f.attr<int64_t>("data_position"));
  m.optimizer = f.attr<std::string>("optimizer");
  m.deck = f.attr<std::string>("deck");
  m.version = f.attr<std::string>("version");
  auto ms = f.attr<std::vector<int64_t>>("mesh_shape");
  if (ms.size() != 3) throw InputError(f.file_name() + ": checkpoint attribute mesh_shape does not hold 3 extents");
  m.mesh = MeshShape{int(ms[0]), int(ms[1]), int(ms[2])};
  m.world_size = f.attr<int64_t>("world_size");
  m.param_count = f.attr<int64_t>("param_count");
  if (f.exists("counters")) {
    h5::Group c = f.group("counters");
    for (const auto& k : c.attr_names()) m.counters[k] = c.attr<int64_t>(k);
  }
  const auto texts = optional_texts(m);
  for (size_t i = 0; i < texts.size(); ++i)
    if (f.has_attr(kOptionalTexts[i])) *texts[i] = f.attr<std::string>(kOptionalTexts[i]);
  if (f.has_attr("lang_tokens")) m.lang_tokens = f.attr<std::vector<int64_t>>("lang_tokens");
  return m;
}

// ---------------------------------------------------------------------------------------------
// Files: fsync, atomic replace, listing.

// Throws Error with errno text.
void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open to fsync: " + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(path + ": fsync failed: " + std::strerror(err));
}

void rename_durably(const std::string& from, const std::string& to, const std::string& dir) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw Error("cannot rename " + from + " to " + to + ": " + std::strerror(errno));
  fsync_path(dir, true);
}

void write_latest(const std::string& dir, const std::string& file_name) {
  const std::string tmp = dir + "/LATEST.tmp", latest = dir + "/LATEST";
  {
    std::ofstream o(tmp, std::ios::trunc);
    o << file_name << "\n";
    o.flush();
    if (!o) throw Error(tmp + ": cannot write");
  }
  fsync_path(tmp, false);
  rename_durably(tmp, latest, dir);
}

// Step of "step_00001000.h5" (or of "...h5.tmp" when tmp), -1 when the name is something else.
int64_t step_of(const std::string& name, bool tmp) {
  const std::string prefix = "step_", suffix = tmp ? ".h5.tmp" : ".h5";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

// The name LATEST holds, "" when there is none; throws Error when it holds something unexpected.
std::string read_latest(const std::string& dir) {
  const std::string latest = dir + "/LATEST";
  std::error_code ec;
  if (!fs::exists(latest, ec)) return "";
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  if (step_of(name, false) < 0) throw Error(latest + " does not name a checkpoint file (holds \"" + name + "\")");
  return name;
}

void prune(const std::string& dir, int64_t just_written, const RetentionPolicy& keep) {
  std::vector<std::pair<int64_t, std::string>> all;  // this lineage's, oldest first
  for (auto& c : list_checkpoints(dir)) {
    std::string lineage;
    try {
      lineage = checkpoint_lineage(c.second);
    } catch (const std::exception&) {
      continue;  // unreadable: not provably ours, leave it
    }
    if (lineage == keep.lineage) all.push_back(std::move(c));
  }
  std::set<int64_t> kept{just_written};
  int n = 0;
  for (auto it = all.rbegin(); it != all.rend() && n < std::max(keep.keep_last, 1); ++it, ++n) kept.insert(it->first);
  for (const auto& [step, path] : all) {
    if (kept.count(step) || (keep.keep_every > 0 && step % keep.keep_every == 0)) continue;
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) std::fprintf(stderr, "meshmoe: warning: cannot remove old checkpoint %s: %s\n", path.c_str(), ec.message().c_str());
  }
}

// Every dataset under `loc` (recursively), as (path relative to loc, dataset).
void walk_datasets(const h5::Location& loc, const std::string& prefix, std::vector<std::pair<std::string, h5::Dataset>>& out) {
  for (const auto& c : loc.children()) {
    const std::string name = prefix.empty() ? c : prefix + "/" + c;
    if (loc.is_group(c))
      walk_datasets(loc.group(c), name, out);
    else if (loc.is_dataset(c))
      out.emplace_back(name, loc.dataset(c));
  }
}

// "[3, 5]": the logical coordinates of element i of a block (row-major in `local`, at `offset`).
std::string coords_str(const std::vector<int64_t>& offset, const std::vector<int64_t>& local, int64_t i) {
  std::vector<int64_t> c(local.size());
  for (size_t d = local.size(); d-- > 0;) {
    c[d] = offset[d] + i % std::max<int64_t>(local[d], 1);
    i /= std::max<int64_t>(local[d], 1);
  }
  return shape_str(c);
}

std::string value_str(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", double(v));
  return b;
}

// Index of the first of data[0..n) that is NaN or infinite, or (nonnegative) below 0; -1 when none.
int64_t first_bad_value(const float* data, int64_t n, bool nonnegative) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(data[i]) || (nonnegative && data[i] < 0)) return i;
  return -1;
}

// "blocks.0.attn.wq [3, 5] = inf" plus why it is bad.
std::string bad_value_str(const std::string& name, const std::vector<int64_t>& offset, const std::vector<int64_t>& local,
                          int64_t i, float v) {
  return name + " " + coords_str(offset, local, i) + " = " + value_str(v) +
         (std::isfinite(v) ? ", a second moment must be >= 0" : "");
}

// Reads a whole float dataset slab by slab (bounded memory); the Fletcher32 filter checks each chunk.
// Every value must be finite, and >= 0 when `nonnegative`; else throws Error naming the first bad one.
void read_fully(const h5::Dataset& d, const std::string& name, bool nonnegative) {
  const auto shape = d.shape();
  if (product(shape) == 0) return;
  if (d.type_class() != H5T_FLOAT) throw Error(d.path() + ": not a floating-point dataset");
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

// ---------------------------------------------------------------------------------------------

bool is_second_moment_state(const std::string& name) {
  for (const char* slot : {"/exp_avg_sq", "/v_row", "/v_col", "/v"}) {
    const size_t n = std::strlen(slot);
    if (name.size() > n && name.compare(name.size() - n, n, slot) == 0) return true;
  }
  return false;
}

std::string checkpoint_file_name(int64_t step) {
  char b[40];
  std::snprintf(b, sizeof b, "step_%08lld.h5", static_cast<long long>(step));
  return b;
}

std::string checkpoint_lineage(const std::string& path) {
  h5::File f = h5::File::open(path);
  return f.has_attr("lineage") ? f.attr<std::string>("lineage") : "";
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(ckpt_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
    const int64_t s = step_of(e.path().filename().string(), false);
    if (s >= 0 && e.is_regular_file(ec)) out.emplace_back(s, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

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
  try {
    mine = held_tensors(store, state);
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
        latest = read_latest(ckpt_dir);
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
      fsync_path(tmp, false);
      rename_durably(tmp, path, ckpt_dir);
      write_latest(ckpt_dir, name);
      prune(ckpt_dir, meta.step, keep);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  if (auto e = first_error(err, comm); !e.empty()) throw InputError("cannot commit checkpoint " + path + ": " + e);
  return path;
}

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
    In in{s.data(), s.data() + s.size()};
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
      auto shape = f.dataset(dpath).shape();
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
    for (const auto& p : store.infos())
      f.dataset("/params/" + p.name).read_block(p.offset, p.local_shape, store.weights() + p.flat_offset);
    for (auto& t : state) {
      if (!t.data) throw Error("checkpoint: optimizer state '" + t.name + "' has no buffer");
      t.data->resize(size_t(product(t.local_shape)));
      f.dataset("/optim/" + t.name).read_block(t.offset, t.local_shape, t.data->data());
    }
    // A state that is not finite cannot train (a resume from it would only run non-finite steps):
    // the same check as `ckpt verify`, on the blocks this rank read (run.resume = PATH skips verify).
    for (const auto& p : store.infos())
      if (const int64_t i = first_bad_value(store.weights() + p.flat_offset, product(p.local_shape), false); i >= 0)
        throw InputError("checkpoint " + path + " is bad: non-finite value: " +
                         bad_value_str("/params/" + p.name, p.offset, p.local_shape, i, store.weights()[p.flat_offset + size_t(i)]));
    for (const auto& t : state) {
      const bool nonnegative = is_second_moment_state(t.name);
      if (const int64_t i = first_bad_value(t.data->data(), int64_t(t.data->size()), nonnegative); i >= 0)
        throw InputError("checkpoint " + path + " is bad: " +
                         (std::isfinite((*t.data)[size_t(i)]) ? "negative second moment: " : "non-finite value: ") +
                         bad_value_str("/optim/" + t.name, t.offset, t.local_shape, i, (*t.data)[size_t(i)]));
    }
  } catch (const InputError& e) {
    err = e.what();
  } catch (const std::exception& e) {
    err = "cannot read checkpoint " + path + " (corrupt or truncated?): " + e.what();
  }
  if (auto e = first_error(err, comm); !e.empty()) throw InputError(e);
  return meta;
}

InitFromResult init_from_checkpoint(const std::string& path, ParamStore<float>& store, MPI_Comm comm) {
  Out mine;  // per parameter of this rank: copied (1) or kept (0), then its name
  std::string err;
  try {
    if (!fs::is_regular_file(path)) throw InputError("--init-from " + path + " does not exist or is not a file");
    h5::File f = h5::File::open(path);
    read_meta_attrs(f);  // a meshmoe checkpoint, not any HDF5 file
    for (const auto& p : store.infos()) {
      const std::string dpath = "/params/" + p.name;
      const bool match = f.is_dataset(dpath) && f.dataset(dpath).shape() == p.logical_shape;
      if (match) {
        float* block = store.weights() + p.flat_offset;
        f.dataset(dpath).read_block(p.offset, p.local_shape, block);
        if (const int64_t i = first_bad_value(block, product(p.local_shape), false); i >= 0)
          throw InputError("--init-from " + path + " is bad: non-finite value: " +
                           bad_value_str(dpath, p.offset, p.local_shape, i, block[size_t(i)]));
      }
      mine.i64(match ? 1 : 0);
      mine.str(p.name);
    }
  } catch (const InputError& e) {
    err = e.what();
  } catch (const std::exception& e) {
    err = "cannot read --init-from checkpoint " + path + " (corrupt or truncated?): " + e.what();
  }
  if (auto e = first_error(err, comm); !e.empty()) throw InputError(e);
  std::set<std::string> copied, kept;
  for (const auto& s : allgather_strings(mine.buf, comm)) {
    In in{s.data(), s.data() + s.size()};
    while (!in.done()) {
      const bool c = in.i64() != 0;
      (c ? copied : kept).insert(in.str());
    }
  }
  return {{copied.begin(), copied.end()}, {kept.begin(), kept.end()}};
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

ResumeChoice find_resume_checkpoint(const std::string& ckpt_dir, MPI_Comm comm) {
  ResumeChoice c;
  if (comm_rank(comm) == 0) {
    std::error_code ec;
    if (fs::is_directory(ckpt_dir, ec)) {
      for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
        const std::string n = e.path().filename().string();
        if (step_of(n, true) >= 0 || n == "LATEST.tmp")
          c.warnings.push_back("ignoring " + e.path().string() + ": left over from an interrupted checkpoint write");
      }
      std::string latest;
      try {
        latest = read_latest(ckpt_dir);
      } catch (const std::exception& e) {
        c.warnings.push_back(e.what());
      }
      // Newest first. A step file is renamed into place only once complete, so the newest one
      // that verifies is the newest good state; LATEST normally names it (not when a crash came
      // between the rename and the LATEST update, or when LATEST's file went bad).
      auto all = list_checkpoints(ckpt_dir);
      for (auto it = all.rbegin(); it != all.rend(); ++it) {
        VerifyResult v = verify_checkpoint(it->second);
        if (v.ok) {
          c.path = it->second;
          break;
        }
        c.warnings.push_back("skipping bad checkpoint " + it->second + ": " + v.message);
      }
      const std::string chosen = c.path.empty() ? "" : fs::path(c.path).filename().string();
      if (!latest.empty() && latest != chosen) {
        if (!fs::exists(ckpt_dir + "/" + latest))
          c.warnings.push_back(ckpt_dir + "/LATEST names " + latest + ", which does not exist");
        else if (step_of(latest, false) < step_of(chosen, false))
          c.warnings.push_back(ckpt_dir + "/LATEST names " + latest + " but " + chosen +
                               " is newer and complete (the run stopped before LATEST was updated)");
      } else if (latest.empty() && !chosen.empty()) {
        c.warnings.push_back(ckpt_dir + "/LATEST is missing; using " + chosen);
      }
      if (c.path.empty() && !all.empty())
        c.warnings.push_back("no usable checkpoint in " + ckpt_dir + ": every step_*.h5 failed verification");
    }
  }
  Out o;
  o.str(c.path);
  o.i64(int64_t(c.warnings.size()));
  for (const auto& w : c.warnings) o.str(w);
  const std::string s = broadcast_string(o.buf, 0, comm);
  In in{s.data(), s.data() + s.size()};
  ResumeChoice out;
  out.path = in.str();
  for (int64_t n = in.i64(); n > 0; --n) out.warnings.push_back(in.str());
  return out;
}

std::string read_latest_name(const std::string& dir) { return read_latest(dir); }

std::vector<CheckpointTensorInfo> checkpoint_tensors(const std::string& path, const std::string& group) {
  h5::File f = h5::File::open(path);
  std::vector<std::pair<std::string, h5::Dataset>> found;
  walk_datasets(f.group(group), "", found);
  std::vector<CheckpointTensorInfo> out;
  for (const auto& [name, d] : found) out.push_back({name, d.shape()});
  return out;
}

}  // namespace meshmoe
