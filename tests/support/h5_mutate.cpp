#include "support/h5_mutate.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace meshmoe::test {

namespace {

void check(herr_t e, const std::string& what) {
  if (e < 0) throw std::runtime_error("h5_mutate: " + what);
}
hid_t check_id(hid_t id, const std::string& what) {
  if (id < 0) throw std::runtime_error("h5_mutate: " + what);
  return id;
}

struct Closer {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Closer() {
    if (id >= 0) close(id);
  }
};

herr_t visit(hid_t obj, const char* name, const H5O_info_t* info, void* data) {
  auto& sites = *static_cast<std::vector<H5Site>*>(data);
  const std::string path = std::string(name) == "." ? "/" : "/" + std::string(name);
  if (info->type == H5O_TYPE_DATASET) sites.push_back({H5Site::Dataset, path, ""});
  if (info->type == H5O_TYPE_GROUP && path != "/") sites.push_back({H5Site::Group, path, ""});
  const hid_t o = H5Oopen(obj, name, H5P_DEFAULT);
  if (o < 0) return -1;
  for (hsize_t i = 0; i < info->num_attrs; ++i) {
    char attr[1024];
    if (H5Aget_name_by_idx(o, ".", H5_INDEX_NAME, H5_ITER_INC, i, attr, sizeof attr, H5P_DEFAULT) < 0) continue;
    sites.push_back({H5Site::Attribute, path, attr});
  }
  H5Oclose(o);
  return 0;
}

// A type of `kind`: the original's (Scalar), int8, a string, double.
hid_t new_type(H5Mutation m, hid_t original) {
  switch (m) {
    case H5Mutation::ToInt8:
      return H5Tcopy(H5T_NATIVE_INT8);
    case H5Mutation::ToString: {
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, 7);
      return t;
    }
    case H5Mutation::ToDouble:
    case H5Mutation::Huge:
    case H5Mutation::NotFinite:
      return H5Tcopy(H5T_NATIVE_DOUBLE);
    case H5Mutation::Negative:
      return H5Tcopy(H5T_NATIVE_INT64);
    default:
      return H5Tcopy(original);
  }
}

// The values written: zeros, or the mutation's number converted to `type` where it is numeric.
std::vector<unsigned char> fill(H5Mutation m, hid_t type, size_t n) {
  const size_t size = H5Tget_size(type);
  std::vector<unsigned char> bytes(n * size, 0);
  double v = 0;
  if (m == H5Mutation::ToDouble || m == H5Mutation::Negative) v = -5;
  if (m == H5Mutation::Huge) v = std::ldexp(1.0, 62);
  if (m == H5Mutation::NotFinite) v = std::nan("");
  if (v == 0 || n == 0) return bytes;
  if (H5Tget_class(type) == H5T_FLOAT && size == 8)
    for (size_t i = 0; i < n; ++i) std::memcpy(bytes.data() + i * 8, &v, 8);
  else if (H5Tget_class(type) == H5T_INTEGER && size == 8) {
    const int64_t w = std::isfinite(v) ? int64_t(v) : 0;
    for (size_t i = 0; i < n; ++i) std::memcpy(bytes.data() + i * 8, &w, 8);
  }
  return bytes;
}

std::vector<hsize_t> dims_of(hid_t space) {
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> d(size_t(std::max(rank, 0)));
  if (rank > 0) H5Sget_simple_extent_dims(space, d.data(), nullptr);
  return d;
}

// The new dataspace: the mutation's shape from the old one's dims `d`.
hid_t new_space(H5Mutation m, std::vector<hsize_t> d, bool attribute) {
  if (m == H5Mutation::Scalar) return H5Screate(H5S_SCALAR);
  if (m == H5Mutation::Reshape) {
    if (attribute) d = {3};
    else d.insert(d.begin(), 2);
  }
  if (m == H5Mutation::Shrink) {
    if (attribute) d = {0};
    else if (d.empty()) d = {1};
    else d[0] = 1;
  }
  if (attribute && (m == H5Mutation::Negative || m == H5Mutation::Huge || m == H5Mutation::NotFinite))
    return H5Screate(H5S_SCALAR);
  if (d.empty()) return H5Screate(H5S_SCALAR);
  return H5Screate_simple(int(d.size()), d.data(), nullptr);
}

hsize_t points(hid_t space) { return hsize_t(std::max<hssize_t>(H5Sget_simple_extent_npoints(space), 0)); }

}  // namespace

const char* h5_mutation_name(H5Mutation m) {
  static const char* const names[] = {"remove", "scalar", "reshape", "shrink", "int8", "string",
                                      "double", "negative", "huge", "not-finite", "group-to-dataset"};
  const int i = int(m);
  return i >= 0 && i < int(H5Mutation::kCount) ? names[i] : "?";
}

std::vector<H5Site> h5_sites(const std::string& path) {
  const hid_t f = check_id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open " + path);
  Closer fc{f, H5Fclose};
  std::vector<H5Site> sites;
  check(H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_INC, visit, &sites, H5O_INFO_BASIC | H5O_INFO_NUM_ATTRS), "visit " + path);
  return sites;
}

bool h5_mutate(const std::string& path, const H5Site& site, H5Mutation m) {
  const hid_t f = check_id(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), "open " + path);
  Closer fc{f, H5Fclose};
  const std::string& obj = site.object;
  if (site.kind == H5Site::Group) {
    if (m == H5Mutation::Remove) return check(H5Ldelete(f, obj.c_str(), H5P_DEFAULT), "delete " + obj), true;
    if (m != H5Mutation::GroupToData) return false;
    check(H5Ldelete(f, obj.c_str(), H5P_DEFAULT), "delete " + obj);
    const hid_t s = H5Screate(H5S_SCALAR);
    Closer sc{s, H5Sclose};
    const hid_t d = check_id(H5Dcreate2(f, obj.c_str(), H5T_NATIVE_INT64, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "create " + obj);
    Closer dc{d, H5Dclose};
    const int64_t zero = 0;
    check(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &zero), "write " + obj);
    return true;
  }
  if (m == H5Mutation::GroupToData) return false;
  if (site.kind == H5Site::Attribute) {
    const char* a = site.attribute.c_str();
    if (m == H5Mutation::Remove) return check(H5Adelete_by_name(f, obj.c_str(), a, H5P_DEFAULT), "delete attribute"), true;
    hid_t old = check_id(H5Aopen_by_name(f, obj.c_str(), a, H5P_DEFAULT, H5P_DEFAULT), "open attribute");
    const hid_t old_type = H5Aget_type(old), old_space = H5Aget_space(old);
    Closer tc{old_type, H5Tclose}, sc{old_space, H5Sclose};
    const hid_t type = new_type(m, old_type);
    const hid_t space = new_space(m, dims_of(old_space), true);
    Closer ntc{type, H5Tclose}, nsc{space, H5Sclose};
    H5Aclose(old);
    check(H5Adelete_by_name(f, obj.c_str(), a, H5P_DEFAULT), "delete attribute");
    const hid_t na = check_id(H5Acreate_by_name(f, obj.c_str(), a, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                              "create attribute");
    Closer nac{na, H5Aclose};
    if (points(space) == 0) return true;
    if (H5Tis_variable_str(type) > 0) {
      std::vector<const char*> empty(points(space), "");
      check(H5Awrite(na, type, empty.data()), "write attribute");
    } else {
      const std::vector<unsigned char> bytes = fill(m, type, points(space));
      if (!bytes.empty()) check(H5Awrite(na, type, bytes.data()), "write attribute");
    }
    return true;
  }
  // A dataset.
  if (m == H5Mutation::Remove) return check(H5Ldelete(f, obj.c_str(), H5P_DEFAULT), "delete " + obj), true;
  const hid_t old = check_id(H5Dopen2(f, obj.c_str(), H5P_DEFAULT), "open " + obj);
  const hid_t old_type = H5Dget_type(old), old_space = H5Dget_space(old);
  Closer tc{old_type, H5Tclose}, sc{old_space, H5Sclose};
  H5Dclose(old);
  hid_t type = new_type(m, old_type);
  if (m == H5Mutation::Negative && H5Tget_class(old_type) == H5T_FLOAT) H5Tclose(type), type = H5Tcopy(H5T_NATIVE_DOUBLE);
  const hid_t space = new_space(m, dims_of(old_space), false);
  Closer ntc{type, H5Tclose}, nsc{space, H5Sclose};
  check(H5Ldelete(f, obj.c_str(), H5P_DEFAULT), "delete " + obj);
  const hid_t d = check_id(H5Dcreate2(f, obj.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "create " + obj);
  Closer dc{d, H5Dclose};
  if (H5Tis_variable_str(type) > 0) {
    std::vector<const char*> empty(points(space), "");
    if (!empty.empty()) check(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, empty.data()), "write " + obj);
  } else {
    std::vector<unsigned char> bytes = fill(m == H5Mutation::Negative ? H5Mutation::ToDouble : m, type, points(space));
    if (!bytes.empty()) check(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), "write " + obj);
  }
  return true;
}

}  // namespace meshmoe::test
