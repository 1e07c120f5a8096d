// The checkpoint file's format: root attributes, datasets, value checks, and the byte messages the
// ranks exchange (checkpoint_format.hpp).
#include "checkpoint/checkpoint_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.hpp"
#include "core/sizes.hpp"

namespace meshmoe {
namespace ckpt {

namespace {

constexpr const char* kFormat = "meshmoe checkpoint";
constexpr int64_t kFormatVersion = 1;
// Root attributes every checkpoint has (verify checks them).
const std::vector<std::string> kRequiredAttrs = {
    "format", "format_version", "step", "update_count", "schedule_step", "seed", "data_epoch",
    "data_position", "optimizer", "deck", "version", "mesh", "mesh_shape", "world_size",
    "param_count", "param_tensors", "optim_tensors"};

// The text attributes a checkpoint may lack (older files): name and member, in one order.
const std::vector<std::string> kOptionalTexts = {"lineage", "forked_from", "data_path", "data_summary",
                                                 "data_fingerprint", "data_languages"};
template <class Meta>
auto optional_texts(Meta& m) {
  return std::vector{&m.lineage, &m.forked_from, &m.data_path, &m.data_summary, &m.data_fingerprint, &m.data_languages};
}

}  // namespace

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
// Byte messages.

void Out::i64(int64_t v) { buf.append(reinterpret_cast<const char*>(&v), sizeof v); }
void Out::str(const std::string& s) {
  i64(int64_t(s.size()));
  buf += s;
}
void Out::dims(const std::vector<int64_t>& d) {
  i64(int64_t(d.size()));
  for (auto x : d) i64(x);
}

int64_t In::i64() {
  if (end - p < 8) throw Error("checkpoint: internal: short message");
  int64_t v;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return v;
}
std::string In::str() {
  int64_t n = i64();
  if (n < 0 || end - p < n) throw Error("checkpoint: internal: short message");
  std::string s(p, size_t(n));
  p += n;
  return s;
}
std::vector<int64_t> In::dims() {
  int64_t n = i64();
  std::vector<int64_t> d(size_t(std::max<int64_t>(n, 0)));
  for (auto& x : d) x = i64();
  return d;
}

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
// Meta <-> bytes (broadcast) and <-> attributes.

std::string dataset_path(Kind k, const std::string& name) {
  return (k == Kind::Param ? "/params/" : "/optim/") + name;
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
  In in(s);
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
  for (const int64_t e : ms)
    if (e < 1 || e > (int64_t(1) << 24))
      throw InputError(f.file_name() + ": checkpoint attribute mesh_shape holds " + std::to_string(e) + ": expected extents in [1, 2^24]");
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
  // What a writer can have written (a resume trusts them: step + 1 is the next step, the optimizer's
  // schedule counts from update_count + 1).
  const auto expect = [&](bool ok, const std::string& what) {
    if (!ok) throw InputError(f.file_name() + ": checkpoint attribute " + what);
  };
  expect(m.step >= 0, "step = " + std::to_string(m.step) + ": expected an integer >= 0");
  expect(m.update_count >= 0 && m.update_count <= m.step,
         "update_count = " + std::to_string(m.update_count) + ": expected an integer in [0, step = " + std::to_string(m.step) + "]");
  expect(int64_t(m.data_cursor.epoch) >= 0 && int64_t(m.data_cursor.position) >= 0,
         "data_epoch / data_position = " + std::to_string(int64_t(m.data_cursor.epoch)) + " / " +
             std::to_string(int64_t(m.data_cursor.position)) + ": expected integers >= 0");
  expect(ms[0] >= 1 && ms[1] >= 1 && ms[2] >= 1 && ms[0] * ms[1] * ms[2] == m.world_size,
         "mesh_shape = [" + std::to_string(ms[0]) + ", " + std::to_string(ms[1]) + ", " + std::to_string(ms[2]) +
             "] with world_size = " + std::to_string(m.world_size) + ": expected extents >= 1 whose product is world_size");
  expect(m.param_count >= 0, "param_count = " + std::to_string(m.param_count) + ": expected an integer >= 0");
  for (const int64_t t : m.lang_tokens) expect(t >= 0, "lang_tokens: expected counts >= 0, holds " + std::to_string(t));
  for (const auto& [k, v] : m.counters) expect(v >= 0, "counters/" + k + " = " + std::to_string(v) + ": expected >= 0");
  return m;
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

// ---------------------------------------------------------------------------------------------
// Values.

namespace {

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

}  // namespace

// Index of the first of data[0..n) that is NaN or infinite, or (nonnegative) below 0; -1 when none.
int64_t first_bad_value(const float* data, int64_t n, bool nonnegative) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(data[i]) || (nonnegative && data[i] < 0)) return i;
  return -1;
}

std::string bad_value_str(const std::string& name, const std::vector<int64_t>& offset, const std::vector<int64_t>& local,
                          int64_t i, float v) {
  return name + " " + coords_str(offset, local, i) + " = " + value_str(v) +
         (std::isfinite(v) ? ", a second moment must be >= 0" : "");
}

}  // namespace ckpt

// ---------------------------------------------------------------------------------------------
// Public (checkpoint.hpp).

bool is_second_moment_state(const std::string& name) {
  for (const char* slot : {"/exp_avg_sq", "/v_row", "/v_col", "/v"}) {
    const size_t n = std::strlen(slot);
    if (name.size() > n && name.compare(name.size() - n, n, slot) == 0) return true;
  }
  return false;
}

std::string checkpoint_lineage(const std::string& path) {
  h5::File f = h5::File::open(path);
  return f.has_attr("lineage") ? f.attr<std::string>("lineage") : "";
}

std::vector<CheckpointTensorInfo> checkpoint_tensors(const std::string& path, const std::string& group) {
  h5::File f = h5::File::open(path);
  std::vector<std::pair<std::string, h5::Dataset>> found;
  ckpt::walk_datasets(f.group(group), "", found);
  std::vector<CheckpointTensorInfo> out;
  for (const auto& [name, d] : found) out.push_back({name, d.shape()});
  return out;
}

}  // namespace meshmoe
