// HDF5 layer: see h5.hpp.
#include "io/h5.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

namespace meshmoe::h5 {

// ---------------------------------------------------------------------------------------------
// Errors

void init_errors() {
  // Silence HDF5's own printing: failures come back to us as negative return values and we read
  // the stack with H5Ewalk2 instead (error_stack()).
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

namespace {
herr_t walk_cb(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::string*>(data);
  char maj[128] = "", min[128] = "";
  H5Eget_msg(e->maj_num, nullptr, maj, sizeof maj);
  H5Eget_msg(e->min_num, nullptr, min, sizeof min);
  if (!out->empty()) *out += "; ";
  *out += std::string(e->func_name ? e->func_name : "?") + "(): " + (e->desc ? e->desc : "");
  if (maj[0] || min[0]) *out += std::string(" [") + maj + ": " + min + "]";
  return 0;
}
}  // namespace

std::string error_stack() {
  std::string s;
  // Downward: from the API call we made down to the cause.
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &s);
  H5Eclear2(H5E_DEFAULT);
  return s;
}

int64_t check(int64_t status, const std::string& context) {
  if (status < 0) {
    std::string stack = error_stack();
    throw Error("HDF5: " + context + (stack.empty() ? "" : ": " + stack));
  }
  return status;
}

// ---------------------------------------------------------------------------------------------
// Handles

void Handle::reset() {
  if (id_ >= 0) {
    // Errors on close cannot be reported from a destructor; keep the stack clean for the next call.
    if (H5Iis_valid(id_) > 0 && H5Idec_ref(id_) < 0) H5Eclear2(H5E_DEFAULT);
    id_ = H5I_INVALID_HID;
  }
}

PropList::PropList(hid_t cls) : Handle(static_cast<hid_t>(check(H5Pcreate(cls), "H5Pcreate"))) {}

namespace {
std::vector<hsize_t> to_h(const Dims& d) {
  std::vector<hsize_t> h(d.size());
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] < 0) throw Error("HDF5: negative extent " + std::to_string(d[i]));
    h[i] = static_cast<hsize_t>(d[i]);
  }
  return h;
}
std::string dims_str(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}
int comm_rank(MPI_Comm comm) {
  int r = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &r);
  return r;
}
}  // namespace

Dataspace Dataspace::scalar() { return Dataspace(static_cast<hid_t>(check(H5Screate(H5S_SCALAR), "H5Screate"))); }

Dataspace Dataspace::simple(const Dims& dims, const Dims& max_dims) {
  if (dims.empty()) return scalar();
  auto h = to_h(dims);
  std::vector<hsize_t> m;
  if (!max_dims.empty()) {
    if (max_dims.size() != dims.size()) throw Error("HDF5: max_dims rank differs from dims rank");
    for (auto x : max_dims) m.push_back(x < 0 ? H5S_UNLIMITED : static_cast<hsize_t>(x));
  }
  return Dataspace(static_cast<hid_t>(check(
      H5Screate_simple(static_cast<int>(h.size()), h.data(), m.empty() ? nullptr : m.data()),
      "H5Screate_simple " + dims_str(dims))));
}

int64_t Dataspace::rank() const { return check(H5Sget_simple_extent_ndims(id()), "H5Sget_simple_extent_ndims"); }

Dims Dataspace::dims() const {
  std::vector<hsize_t> h(static_cast<size_t>(rank()));
  check(H5Sget_simple_extent_dims(id(), h.data(), nullptr), "H5Sget_simple_extent_dims");
  return Dims(h.begin(), h.end());
}

Dims Dataspace::max_dims() const {
  std::vector<hsize_t> h(static_cast<size_t>(rank()));
  check(H5Sget_simple_extent_dims(id(), nullptr, h.data()), "H5Sget_simple_extent_dims");
  Dims d;
  for (auto x : h) d.push_back(x == H5S_UNLIMITED ? -1 : static_cast<int64_t>(x));
  return d;
}

void Dataspace::select_block(const Dims& offset, const Dims& count) {
  if (detail::product(count) == 0) return select_none();
  auto o = to_h(offset), c = to_h(count);
  check(H5Sselect_hyperslab(id(), H5S_SELECT_SET, o.data(), nullptr, c.data(), nullptr), "H5Sselect_hyperslab");
}

void Dataspace::select_none() { check(H5Sselect_none(id()), "H5Sselect_none"); }

// ---------------------------------------------------------------------------------------------
// Strings: variable-length UTF-8 for attributes and string arrays; fixed-length (NULLPAD) for
// scalar string datasets, which parallel HDF5 can also write.

namespace {
Handle vlen_string_type() {
  Handle t(static_cast<hid_t>(check(H5Tcopy(H5T_C_S1), "H5Tcopy")));
  check(H5Tset_size(t.id(), H5T_VARIABLE), "H5Tset_size");
  check(H5Tset_cset(t.id(), H5T_CSET_UTF8), "H5Tset_cset");
  return t;
}
Handle fixed_string_type(size_t n) {
  Handle t(static_cast<hid_t>(check(H5Tcopy(H5T_C_S1), "H5Tcopy")));
  check(H5Tset_size(t.id(), std::max<size_t>(n, 1)), "H5Tset_size");
  check(H5Tset_strpad(t.id(), H5T_STR_NULLPAD), "H5Tset_strpad");
  check(H5Tset_cset(t.id(), H5T_CSET_UTF8), "H5Tset_cset");
  return t;
}

// Reads `count` strings of an attribute (is_attr) or dataset whose stored type is `file_type`.
std::vector<std::string> read_strings_any(hid_t obj, bool is_attr, hid_t file_type, hid_t space,
                                          size_t count, const std::string& ctx) {
  if (H5Tget_class(file_type) != H5T_STRING) throw Error("HDF5: " + ctx + ": not a string");
  std::vector<std::string> out(count);
  if (count == 0) return out;
  if (check(H5Tis_variable_str(file_type), ctx) > 0) {
    Handle mt = vlen_string_type();
    std::vector<char*> p(count, nullptr);
    if (is_attr)
      check(H5Aread(obj, mt.id(), p.data()), ctx + ": H5Aread");
    else
      check(H5Dread(obj, mt.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()), ctx + ": H5Dread");
    for (size_t i = 0; i < count; ++i) out[i] = p[i] ? p[i] : "";
#if H5_VERSION_GE(1, 12, 0)
    H5Treclaim(mt.id(), space, H5P_DEFAULT, p.data());
#else
    H5Dvlen_reclaim(mt.id(), space, H5P_DEFAULT, p.data());
#endif
  } else {
    size_t n = H5Tget_size(file_type);
    Handle mt = fixed_string_type(n);
    std::vector<char> buf(n * count);
    if (is_attr)
      check(H5Aread(obj, mt.id(), buf.data()), ctx + ": H5Aread");
    else
      check(H5Dread(obj, mt.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()), ctx + ": H5Dread");
    for (size_t i = 0; i < count; ++i) {
      const char* b = buf.data() + i * n;
      out[i].assign(b, strnlen(b, n));
    }
  }
  return out;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Object: attributes

std::string Object::where(const std::string& what) const { return file_ + ":" + path_ + ": " + what; }

bool Object::has_attr(const std::string& name) const {
  return check(H5Aexists(id(), name.c_str()), where("H5Aexists '" + name + "'")) > 0;
}

std::vector<std::string> Object::attr_names() const {
  std::vector<std::string> names;
  auto cb = [](hid_t, const char* n, const H5A_info_t*, void* d) -> herr_t {
    static_cast<std::vector<std::string>*>(d)->push_back(n);
    return 0;
  };
  check(H5Aiterate2(id(), H5_INDEX_NAME, H5_ITER_INC, nullptr, cb, &names), where("H5Aiterate2"));
  return names;
}

void Object::write_attr_raw(const std::string& name, hid_t mem_type, const Dims& dims, const void* data) {
  std::string ctx = where("attribute '" + name + "'");
  if (has_attr(name)) check(H5Adelete(id(), name.c_str()), ctx + ": H5Adelete");
  Dataspace space = Dataspace::simple(dims);
  Handle a(static_cast<hid_t>(
      check(H5Acreate2(id(), name.c_str(), mem_type, space.id(), H5P_DEFAULT, H5P_DEFAULT), ctx + ": H5Acreate2")));
  check(H5Awrite(a.id(), mem_type, data), ctx + ": H5Awrite");
}

void Object::write_attr_string(const std::string& name, const std::string& value) {
  std::string ctx = where("attribute '" + name + "'");
  if (has_attr(name)) check(H5Adelete(id(), name.c_str()), ctx + ": H5Adelete");
  Handle t = vlen_string_type();
  Dataspace space = Dataspace::scalar();
  Handle a(static_cast<hid_t>(
      check(H5Acreate2(id(), name.c_str(), t.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT), ctx + ": H5Acreate2")));
  const char* p = value.c_str();
  check(H5Awrite(a.id(), t.id(), &p), ctx + ": H5Awrite");
}

void Object::write_attr_strings(const std::string& name, const std::vector<std::string>& values) {
  std::string ctx = where("attribute '" + name + "'");
  if (has_attr(name)) check(H5Adelete(id(), name.c_str()), ctx + ": H5Adelete");
  Handle t = vlen_string_type();
  Dataspace space = Dataspace::simple(Dims{static_cast<int64_t>(values.size())});
  Handle a(static_cast<hid_t>(
      check(H5Acreate2(id(), name.c_str(), t.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT), ctx + ": H5Acreate2")));
  std::vector<const char*> p;
  for (const std::string& v : values) p.push_back(v.c_str());
  if (!p.empty()) check(H5Awrite(a.id(), t.id(), p.data()), ctx + ": H5Awrite");
}

namespace {
Handle open_attr(hid_t obj, const std::string& name, const std::string& ctx) {
  return Handle(static_cast<hid_t>(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), ctx + ": H5Aopen")));
}
}  // namespace

Dims Object::attr_dims(const std::string& name) const {
  std::string ctx = where("attribute '" + name + "'");
  Handle a = open_attr(id(), name, ctx);
  Dataspace s(static_cast<hid_t>(check(H5Aget_space(a.id()), ctx + ": H5Aget_space")));
  return s.dims();
}

void Object::read_attr_raw(const std::string& name, hid_t mem_type, void* data) const {
  std::string ctx = where("attribute '" + name + "'");
  Handle a = open_attr(id(), name, ctx);
  check(H5Aread(a.id(), mem_type, data), ctx + ": H5Aread");
}

std::string Object::read_attr_string(const std::string& name) const {
  std::string ctx = where("attribute '" + name + "'");
  Handle a = open_attr(id(), name, ctx);
  Handle t(static_cast<hid_t>(check(H5Aget_type(a.id()), ctx + ": H5Aget_type")));
  Dataspace s(static_cast<hid_t>(check(H5Aget_space(a.id()), ctx + ": H5Aget_space")));
  if (detail::product(s.dims()) != 1) throw Error("HDF5: " + ctx + ": not a scalar string");
  return read_strings_any(a.id(), true, t.id(), s.id(), 1, ctx)[0];
}

std::vector<std::string> Object::read_attr_strings(const std::string& name) const {
  std::string ctx = where("attribute '" + name + "'");
  Handle a = open_attr(id(), name, ctx);
  Handle t(static_cast<hid_t>(check(H5Aget_type(a.id()), ctx + ": H5Aget_type")));
  Dataspace s(static_cast<hid_t>(check(H5Aget_space(a.id()), ctx + ": H5Aget_space")));
  return read_strings_any(a.id(), true, t.id(), s.id(), static_cast<size_t>(detail::product(s.dims())), ctx);
}

// ---------------------------------------------------------------------------------------------
// Dataset

Dims Dataset::shape() const {
  Dataspace s(static_cast<hid_t>(check(H5Dget_space(id()), where("H5Dget_space"))));
  return s.dims();
}
Dims Dataset::max_dims() const {
  Dataspace s(static_cast<hid_t>(check(H5Dget_space(id()), where("H5Dget_space"))));
  return s.max_dims();
}
int64_t Dataset::size() const { return detail::product(shape()); }

H5T_class_t Dataset::type_class() const {
  Handle t(static_cast<hid_t>(check(H5Dget_type(id()), where("H5Dget_type"))));
  return H5Tget_class(t.id());
}
size_t Dataset::type_size() const {
  Handle t(static_cast<hid_t>(check(H5Dget_type(id()), where("H5Dget_type"))));
  return H5Tget_size(t.id());
}

namespace {
// The transfer property list: collective MPI-IO on a parallel file (required for filtered
// datasets in parallel HDF5, and the fast path for the rest).
PropList transfer_plist(bool parallel, const std::string& ctx) {
  PropList dxpl(H5P_DATASET_XFER);
  if (parallel) check(H5Pset_dxpl_mpio(dxpl.id(), H5FD_MPIO_COLLECTIVE), ctx + ": H5Pset_dxpl_mpio");
  return dxpl;
}
}  // namespace

namespace {
struct Selection {
  Dataspace file, mem;
  bool empty = false;
};
// `none`: this rank takes part in a collective call but moves nothing (also for scalar datasets,
// where an empty count cannot say so).
Selection select(hid_t dset, const Dims& offset, const Dims& count, const std::string& ctx, bool none = false) {
  Selection s;
  s.file = Dataspace(static_cast<hid_t>(check(H5Dget_space(dset), ctx + ": H5Dget_space")));
  Dims shape = s.file.dims();
  if (offset.size() != shape.size() || count.size() != shape.size())
    throw Error("HDF5: " + ctx + ": block offset " + dims_str(offset) + " count " + dims_str(count) +
                " has the wrong rank for shape " + dims_str(shape));
  bool empty = none || detail::product(count) == 0;
  s.empty = empty;
  for (size_t i = 0; i < shape.size() && !empty; ++i)
    if (offset[i] < 0 || count[i] < 0 || offset[i] + count[i] > shape[i])
      throw Error("HDF5: " + ctx + ": block offset " + dims_str(offset) + " count " + dims_str(count) +
                  " outside shape " + dims_str(shape));
  if (shape.empty()) {  // scalar dataset
    s.mem = Dataspace::scalar();
    if (empty) {
      s.file.select_none();
      s.mem.select_none();
    }
    return s;
  }
  if (empty) {
    // A rank with nothing to move still takes part in the collective call, selecting none.
    s.file.select_none();
    s.mem = Dataspace::simple(Dims{1});
    s.mem.select_none();
  } else {
    s.file.select_block(offset, count);
    s.mem = Dataspace::simple(count);
  }
  return s;
}
}  // namespace

namespace {
thread_local H5D_mpio_actual_io_mode_t g_last_io_mode = H5D_MPIO_NO_COLLECTIVE;
void record_io_mode(bool parallel, hid_t dxpl) {
  g_last_io_mode = H5D_MPIO_NO_COLLECTIVE;
  if (parallel) H5Pget_mpio_actual_io_mode(dxpl, &g_last_io_mode);
}
}  // namespace

H5D_mpio_actual_io_mode_t last_io_mode() { return g_last_io_mode; }

namespace {
void write_selected(const Dataset& d, hid_t mem_type, const Dims& offset, const Dims& count, const void* data,
                    bool none, const std::string& ctx) {
  Selection s = select(d.id(), offset, count, ctx, none);
  PropList dxpl = transfer_plist(d.parallel(), ctx);
  if (!data && !s.empty) throw Error("HDF5: " + ctx + ": null buffer for " + dims_str(count));
  static const char dummy = 0;  // HDF5 rejects a null buffer even when nothing is selected
  check(H5Dwrite(d.id(), mem_type, s.mem.id(), s.file.id(), dxpl.id(), s.empty ? &dummy : data),
        ctx + " block offset " + dims_str(offset) + " count " + dims_str(count) + ": H5Dwrite");
  record_io_mode(d.parallel(), dxpl.id());
}
}  // namespace

void Dataset::write_raw(hid_t mem_type, const Dims& offset, const Dims& count, const void* data) {
  write_selected(*this, mem_type, offset, count, data, false, where("write"));
}

void Dataset::write_raw_root(hid_t mem_type, const Dims& offset, const Dims& count, const void* data) {
  bool none = parallel() && comm_rank(comm()) != 0;
  write_selected(*this, mem_type, offset, count, data, none, where("write"));
}

void Dataset::read_raw(hid_t mem_type, const Dims& offset, const Dims& count, void* data) const {
  std::string ctx = where("read");
  Selection s = select(id(), offset, count, ctx);
  PropList dxpl = transfer_plist(parallel(), ctx);
  if (!data && !s.empty) throw Error("HDF5: " + ctx + ": null buffer for " + dims_str(count));
  static char dummy = 0;
  check(H5Dread(id(), mem_type, s.mem.id(), s.file.id(), dxpl.id(), s.empty ? &dummy : data),
        ctx + " block offset " + dims_str(offset) + " count " + dims_str(count) + ": H5Dread");
  record_io_mode(parallel(), dxpl.id());
}

void Dataset::resize(const Dims& new_shape) {
  auto h = to_h(new_shape);
  check(H5Dset_extent(id(), h.data()), where("resize to " + dims_str(new_shape) + ": H5Dset_extent"));
}

void Dataset::write_strings(const std::vector<std::string>& s) {
  if (parallel()) throw Error(where("string arrays can only be written to a serial file"));
  if (static_cast<int64_t>(s.size()) != size())
    throw Error(where("write of " + std::to_string(s.size()) + " strings into a dataset of " + std::to_string(size())));
  if (s.empty()) return;
  Handle t = vlen_string_type();
  std::vector<const char*> p;
  for (const auto& x : s) p.push_back(x.c_str());
  check(H5Dwrite(id(), t.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()), where("H5Dwrite"));
}

std::vector<std::string> Dataset::read_strings() const {
  Handle t(static_cast<hid_t>(check(H5Dget_type(id()), where("H5Dget_type"))));
  Dataspace s(static_cast<hid_t>(check(H5Dget_space(id()), where("H5Dget_space"))));
  return read_strings_any(id(), false, t.id(), s.id(), static_cast<size_t>(detail::product(s.dims())), where("read"));
}

// ---------------------------------------------------------------------------------------------
// Location

std::string Location::child_path(const std::string& name) const {
  if (!name.empty() && name[0] == '/') return name;
  return path_ == "/" ? "/" + name : path_ + "/" + name;
}

bool Location::exists(const std::string& name) const {
  if (name.empty() || name == "/") return true;
  // H5Lexists fails (rather than saying "no") when an intermediate component is missing or is
  // not a group: walk the path one component at a time.
  std::string prefix = name[0] == '/' ? "/" : "";
  size_t start = name[0] == '/' ? 1 : 0;
  while (start < name.size()) {
    size_t end = std::min(name.find('/', start), name.size());
    if (end > start) {
      if (!prefix.empty() && prefix != "/") {
        if (!is_group(prefix)) return false;
        prefix += "/";
      }
      prefix += name.substr(start, end - start);
      if (check(H5Lexists(id(), prefix.c_str(), H5P_DEFAULT), where("H5Lexists '" + prefix + "'")) <= 0) return false;
      if (check(H5Oexists_by_name(id(), prefix.c_str(), H5P_DEFAULT), where("H5Oexists_by_name '" + prefix + "'")) <= 0)
        return false;
    }
    start = end + 1;
  }
  return true;
}

namespace {
H5I_type_t object_type(hid_t loc, const std::string& name, const std::string& ctx) {
  Handle o(static_cast<hid_t>(check(H5Oopen(loc, name.c_str(), H5P_DEFAULT), ctx + ": H5Oopen")));
  return H5Iget_type(o.id());
}
}  // namespace

bool Location::is_group(const std::string& name) const {
  return object_type(id(), name, where("'" + name + "'")) == H5I_GROUP;
}
bool Location::is_dataset(const std::string& name) const {
  return exists(name) && object_type(id(), name, where("'" + name + "'")) == H5I_DATASET;
}

std::vector<std::string> Location::children() const {
  H5G_info_t info;
  check(H5Gget_info(id(), &info), where("H5Gget_info"));
  std::vector<std::string> out;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t n = H5Lget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    check(n, where("H5Lget_name_by_idx"));
    std::string s(static_cast<size_t>(n) + 1, '\0');
    check(H5Lget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, s.data(), s.size(), H5P_DEFAULT),
          where("H5Lget_name_by_idx"));
    s.resize(static_cast<size_t>(n));
    out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
PropList intermediate_lcpl(const std::string& ctx) {
  PropList lcpl(H5P_LINK_CREATE);
  check(H5Pset_create_intermediate_group(lcpl.id(), 1), ctx + ": H5Pset_create_intermediate_group");
  return lcpl;
}
}  // namespace

Group Location::create_group(const std::string& name) {
  if (exists(name)) return group(name);
  std::string ctx = where("create group '" + name + "'");
  PropList lcpl = intermediate_lcpl(ctx);
  hid_t g = static_cast<hid_t>(check(H5Gcreate2(id(), name.c_str(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT), ctx + ": H5Gcreate2"));
  return Group(g, file_, child_path(name), comm_);
}

Group Location::group(const std::string& name) const {
  std::string ctx = where("open group '" + name + "'");
  hid_t g = static_cast<hid_t>(check(H5Gopen2(id(), name.c_str(), H5P_DEFAULT), ctx + ": H5Gopen2"));
  return Group(g, file_, child_path(name), comm_);
}

void Location::remove(const std::string& name) {
  check(H5Ldelete(id(), name.c_str(), H5P_DEFAULT), where("remove '" + name + "': H5Ldelete"));
}

Dataset Location::dataset(const std::string& name) const {
  std::string ctx = where("open dataset '" + name + "'");
  hid_t d = static_cast<hid_t>(check(H5Dopen2(id(), name.c_str(), H5P_DEFAULT), ctx + ": H5Dopen2"));
  return Dataset(d, file_, child_path(name), comm_);
}

Dataset Location::create_dataset_raw(const std::string& name, hid_t file_type, const Dims& shape,
                                     const CreateOptions& opt) {
  std::string ctx = where("create dataset '" + name + "' " + dims_str(shape));
  PropList dcpl(H5P_DATASET_CREATE);
  Dims chunk = opt.chunk;
  bool extendible = std::any_of(opt.max_dims.begin(), opt.max_dims.end(), [](int64_t x) { return x < 0; });
  if (chunk.empty() && (opt.fletcher32 || extendible)) {
    // Default chunk: the whole array (zero extents as 1), first dims halved down to <= 1 MiB.
    size_t elem = H5Tget_size(file_type);
    for (auto d : shape) chunk.push_back(std::max<int64_t>(d, 1));
    for (size_t i = 0; i < chunk.size(); ++i)
      while (chunk[i] > 1 && static_cast<size_t>(detail::product(chunk)) * elem > (1u << 20)) chunk[i] = (chunk[i] + 1) / 2;
  }
  bool filter = opt.fletcher32;
  if (!chunk.empty()) {
    if (chunk.size() != shape.size())
      throw Error(ctx + ": chunk " + dims_str(chunk) + " has a different rank from the shape");
    // HDF5 wants chunk <= extent along fixed-size dims: clip (a small array gets one chunk).
    for (size_t i = 0; i < chunk.size(); ++i) {
      bool unlimited = i < opt.max_dims.size() && opt.max_dims[i] < 0;
      int64_t limit = i < opt.max_dims.size() && opt.max_dims[i] >= 0 ? opt.max_dims[i] : shape[i];
      if (!unlimited) chunk[i] = std::min(chunk[i], limit);
    }
    // A fixed-size array with a zero extent holds nothing: store it contiguous, unfiltered.
    if (!extendible && detail::product(chunk) == 0) chunk.clear(), filter = false;
  }
  if (!chunk.empty()) {
    if (shape.empty()) throw Error(ctx + ": a scalar dataset cannot be chunked or filtered");
    auto c = to_h(chunk);
    check(H5Pset_chunk(dcpl.id(), static_cast<int>(c.size()), c.data()), ctx + ": H5Pset_chunk");
  } else if (extendible) {
    throw Error(ctx + ": an extendible dataset needs a chunk shape");
  }
  if (filter) check(H5Pset_fletcher32(dcpl.id()), ctx + ": H5Pset_fletcher32");
  Dataspace space = Dataspace::simple(shape, opt.max_dims);
  PropList lcpl = intermediate_lcpl(ctx);
  hid_t d = static_cast<hid_t>(
      check(H5Dcreate2(id(), name.c_str(), file_type, space.id(), lcpl.id(), dcpl.id(), H5P_DEFAULT), ctx + ": H5Dcreate2"));
  return Dataset(d, file_, child_path(name), comm_);
}

Dataset Location::write_string(const std::string& name, const std::string& s) {
  std::string ctx = where("create dataset '" + name + "'");
  Handle t = fixed_string_type(s.size());
  Dataspace space = Dataspace::scalar();
  PropList lcpl = intermediate_lcpl(ctx);
  Dataset d(static_cast<hid_t>(check(H5Dcreate2(id(), name.c_str(), t.id(), space.id(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT),
                                     ctx + ": H5Dcreate2")),
            file_, child_path(name), comm_);
  std::string padded = s;
  padded.resize(std::max<size_t>(s.size(), 1), '\0');
  d.write_raw_root(t.id(), Dims{}, Dims{}, padded.data());
  return d;
}

Dataset Location::write_strings(const std::string& name, const std::vector<std::string>& s) {
  if (parallel()) throw Error(where("string arrays can only be written to a serial file ('" + name + "')"));
  std::string ctx = where("create dataset '" + name + "'");
  Handle t = vlen_string_type();
  Dataspace space = Dataspace::simple(Dims{static_cast<int64_t>(s.size())});
  PropList lcpl = intermediate_lcpl(ctx);
  Dataset d(static_cast<hid_t>(check(H5Dcreate2(id(), name.c_str(), t.id(), space.id(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT),
                                     ctx + ": H5Dcreate2")),
            file_, child_path(name), comm_);
  d.write_strings(s);
  return d;
}

std::vector<std::string> Location::read_strings(const std::string& name) const { return dataset(name).read_strings(); }

}  // namespace meshmoe::h5
