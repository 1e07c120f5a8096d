// HDF5 layer: RAII handles over the C API of parallel HDF5 (1.10), typed whole-dataset I/O for
// serial use, collective sharded hyperslab I/O for parallel use, attributes, and extendible
// (time-series) datasets. Every HDF5 failure becomes a meshmoe::Error whose message holds our
// context (file, object path) and HDF5's own error stack (function name + description).
//
// Serial vs parallel: a File opened with a communicator uses the MPI-IO driver; then every call
// that creates or changes metadata (create_group, create_dataset, set_attr, resize, append) and
// every sharded read/write is collective: all ranks of the communicator call it with the same
// arguments (the data block of a sharded call excepted). Whole-dataset write/read and append on
// a parallel file are also collective; every rank passes the same data and rank 0's is written.
// For independent reads (each rank reading its own part when it likes, e.g. a data loader), open
// the file serially and read-only on every rank instead. The communicator must outlive the File. A Dataset or Group may outlive its File object: the
// file closes (collectively, when parallel) when the last of them is destroyed.
//
// Shapes, offsets and counts are int64 (same as ParamInfo); element types supported: float,
// double, int32_t, int64_t, uint16_t, uint32_t, uint8_t, and std::string (variable-length UTF-8,
// serial whole-dataset I/O and attributes only).
#pragma once
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace meshmoe::h5 {

using Dims = std::vector<int64_t>;

// ---------------------------------------------------------------------------------------------
// Errors

// Turns HDF5's automatic error printing off for this process (idempotent; done by every File
// open/create, call it yourself before using raw HDF5 calls elsewhere).
void init_errors();
// Text of the current HDF5 error stack ("H5Fopen: unable to open file; H5FD_sec2_open: ...")
// and clears it. Empty when the stack is empty.
std::string error_stack();
// Throws Error("<context>: <error_stack()>") when status < 0; returns status otherwise.
int64_t check(int64_t status, const std::string& context);

// ---------------------------------------------------------------------------------------------
// Element types

// HDF5 native memory type of T (H5T_NATIVE_FLOAT, ...); a compile error for unsupported T.
template <typename T>
hid_t native_type();
template <> inline hid_t native_type<float>() { return H5T_NATIVE_FLOAT; }
template <> inline hid_t native_type<double>() { return H5T_NATIVE_DOUBLE; }
template <> inline hid_t native_type<int32_t>() { return H5T_NATIVE_INT32; }
template <> inline hid_t native_type<int64_t>() { return H5T_NATIVE_INT64; }
template <> inline hid_t native_type<uint16_t>() { return H5T_NATIVE_UINT16; }
template <> inline hid_t native_type<uint32_t>() { return H5T_NATIVE_UINT32; }
template <> inline hid_t native_type<uint8_t>() { return H5T_NATIVE_UINT8; }

template <typename T>
inline constexpr bool is_numeric_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t> ||
    std::is_same_v<T, int64_t> || std::is_same_v<T, uint16_t> || std::is_same_v<T, uint32_t> ||
    std::is_same_v<T, uint8_t>;

// ---------------------------------------------------------------------------------------------
// RAII handle: owns one hid_t, move-only, closes it (H5Idec_ref) on destruction.

class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();                                             // closes (errors ignored)
  hid_t release() { return std::exchange(id_, H5I_INVALID_HID); }  // gives up ownership

 private:
  hid_t id_ = H5I_INVALID_HID;
};

class PropList : public Handle {
 public:
  PropList() = default;
  explicit PropList(hid_t cls);  // H5Pcreate(cls), e.g. H5P_DATASET_CREATE
};

class Dataspace : public Handle {
 public:
  Dataspace() = default;
  explicit Dataspace(hid_t id) : Handle(id) {}
  static Dataspace scalar();
  // max_dims entries of -1 mean unlimited; empty max_dims = fixed size.
  static Dataspace simple(const Dims& dims, const Dims& max_dims = {});
  Dims dims() const;
  Dims max_dims() const;
  int64_t rank() const;
  // Selects the block [offset, offset + count); a block with any count 0 selects none.
  void select_block(const Dims& offset, const Dims& count);
  void select_none();
};

struct Location;  // File or Group

// Something that carries attributes: File, Group, Dataset.
class Object : public Handle {
 public:
  Object() = default;
  Object(hid_t id, std::string file, std::string path, MPI_Comm comm)
      : Handle(id), file_(std::move(file)), path_(std::move(path)), comm_(comm) {}
  const std::string& file_name() const { return file_; }
  const std::string& path() const { return path_; }  // "/" or "/moe/layer1" or "/moe/layer1/w"
  bool parallel() const { return comm_ != MPI_COMM_NULL; }
  MPI_Comm comm() const { return comm_; }  // MPI_COMM_NULL for a serial file

  // Attributes (replace an existing one of the same name). T: std::string / const char*, a
  // numeric scalar, std::vector<numeric> (a small 1-D array) or std::vector<std::string> (a 1-D
  // array of variable-length UTF-8 strings). Collective on a parallel file.
  template <typename T>
  void set_attr(const std::string& name, const T& value);
  void set_attr(const std::string& name, const char* value) { set_attr(name, std::string(value)); }
  // Reads an attribute, converting numeric types as HDF5 does. T as for set_attr.
  template <typename T>
  T attr(const std::string& name) const;
  bool has_attr(const std::string& name) const;
  std::vector<std::string> attr_names() const;

 protected:
  std::string where(const std::string& what) const;  // "<file>:<path>: <what>"
  void write_attr_raw(const std::string& name, hid_t mem_type, const Dims& dims, const void* data);
  void write_attr_string(const std::string& name, const std::string& value);
  void write_attr_strings(const std::string& name, const std::vector<std::string>& values);
  std::vector<std::string> read_attr_strings(const std::string& name) const;
  // Returns dims of the attribute's dataspace (empty for scalar).
  Dims attr_dims(const std::string& name) const;
  void read_attr_raw(const std::string& name, hid_t mem_type, void* data) const;
  std::string read_attr_string(const std::string& name) const;

  std::string file_;
  std::string path_;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// Options for creating a dataset.
//  - chunk: chunk shape, clipped to the extent along fixed-size dims. Empty = contiguous, unless
//    fletcher32 or an unlimited dim asks for chunks: then the whole array (halved along the
//    leading dims down to <= 1 MiB) is one chunk.
//  - fletcher32: checksum each chunk; a corrupted chunk makes reads fail. Parallel writes of a
//    filtered dataset work in HDF5 >= 1.10.2 with collective I/O, which the sharded path uses.
//    A fixed-size array with a zero extent is stored contiguous and unfiltered (nothing to check).
//  - max_dims: empty = fixed size; -1 entries = unlimited.
struct CreateOptions {
  Dims chunk;
  bool fletcher32 = false;
  Dims max_dims;
};

class Dataset : public Object {
 public:
  using Object::Object;
  Dims shape() const;
  Dims max_dims() const;
  int64_t size() const;  // number of elements
  // The stored type's class and size, e.g. for "is this float32?".
  H5T_class_t type_class() const;
  size_t type_size() const;

  // Whole-dataset I/O (data holds size() elements, row-major).
  template <typename T>
  void write(const T* data);
  template <typename T>
  void write(const std::vector<T>& data);
  template <typename T>
  std::vector<T> read() const;

  // Block I/O: [offset, offset+count) of the logical array. On a parallel file this is ONE
  // collective H5Dwrite/H5Dread (H5FD_MPIO_COLLECTIVE): every rank calls it; a rank with an
  // empty block (any count 0) selects none. `data` holds prod(count) elements, row-major.
  template <typename T>
  void write_block(const Dims& offset, const Dims& count, const T* data);
  template <typename T>
  void read_block(const Dims& offset, const Dims& count, T* data) const;

  // Extendible datasets: changes the extent (within max_dims); shrinking drops trailing rows.
  void resize(const Dims& new_shape);
  // Appends one row along dim 0: `row` holds prod(shape[1:]) elements (1 for a 1-D series).
  // On a parallel file all ranks pass the same row.
  template <typename T>
  void append(const T* row, int64_t n);
  template <typename T>
  void append(const std::vector<T>& row) { append(row.data(), static_cast<int64_t>(row.size())); }
  // Writes one row at index `row` (must be < shape[0]) of an N-D dataset.
  template <typename T>
  void write_row(int64_t row, const T* data, int64_t n);

  void write_raw(hid_t mem_type, const Dims& offset, const Dims& count, const void* data);
  // As write_raw, but on a parallel file only rank 0 of the communicator writes (the others
  // take part in the collective call selecting none): for data every rank holds.
  void write_raw_root(hid_t mem_type, const Dims& offset, const Dims& count, const void* data);
  void read_raw(hid_t mem_type, const Dims& offset, const Dims& count, void* data) const;
  void write_strings(const std::vector<std::string>& s);
  std::vector<std::string> read_strings() const;
};

class Group;

// Common operations of a File and a Group; names are relative paths ("a/b/c") or absolute
// ("/a/b/c").
class Location : public Object {
 public:
  using Object::Object;
  bool exists(const std::string& name) const;  // link exists and resolves (every path component)
  bool is_group(const std::string& name) const;
  bool is_dataset(const std::string& name) const;
  std::vector<std::string> children() const;   // link names in this group, sorted
  // Creates a group with all missing intermediate groups; returns it (opens when it exists).
  Group create_group(const std::string& name);
  Group group(const std::string& name) const;
  void remove(const std::string& name);  // unlinks (space is not reclaimed)

  // Creates a dataset of element type T (intermediate groups created).
  template <typename T>
  Dataset create_dataset(const std::string& name, const Dims& shape, const CreateOptions& opt = {});
  Dataset create_dataset_raw(const std::string& name, hid_t file_type, const Dims& shape,
                             const CreateOptions& opt);
  // Creates an extendible dataset of shape [0, row_shape...] with unlimited dim 0, chunked
  // [chunk_rows, row_shape...]; append() adds rows.
  template <typename T>
  Dataset create_series(const std::string& name, const Dims& row_shape = {}, int64_t chunk_rows = 256);
  Dataset dataset(const std::string& name) const;

  // Convenience: create + write / open + read a whole dataset.
  template <typename T>
  Dataset write(const std::string& name, const std::vector<T>& data, const Dims& shape,
                const CreateOptions& opt = {});
  template <typename T>
  Dataset write(const std::string& name, const std::vector<T>& data) {
    return write(name, data, Dims{static_cast<int64_t>(data.size())});
  }
  Dataset write_string(const std::string& name, const std::string& s);  // scalar string
  Dataset write_strings(const std::string& name, const std::vector<std::string>& s);
  template <typename T>
  std::vector<T> read(const std::string& name) const {
    return dataset(name).template read<T>();
  }
  std::vector<std::string> read_strings(const std::string& name) const;

 protected:
  std::string child_path(const std::string& name) const;
};

class Group : public Location {
 public:
  using Location::Location;
};

enum class Access { ReadOnly, ReadWrite };

class File : public Location {
 public:
  File() = default;
  // Serial (this process only; other ranks must not touch the file meanwhile).
  static File create(const std::string& path);  // truncates an existing file
  static File open(const std::string& path, Access access = Access::ReadOnly);
  // Parallel: collective over comm, MPI-IO driver.
  static File create(const std::string& path, MPI_Comm comm);
  static File open(const std::string& path, MPI_Comm comm, Access access = Access::ReadOnly);

  void flush();                            // H5Fflush(global); collective on a parallel file
  void close();                            // explicit close (otherwise the destructor closes)

 private:
  File(hid_t id, std::string path, MPI_Comm comm) : Location(id, path, "/", comm) {}
};

// Tests only: how HDF5 actually did the last block read/write of this thread on a parallel file
// (H5D_MPIO_NO_COLLECTIVE after a serial one), to prove the I/O stayed collective.
H5D_mpio_actual_io_mode_t last_io_mode();

// ---------------------------------------------------------------------------------------------
// Template implementations (thin wrappers over the raw calls in h5.cpp).

namespace detail {
inline int64_t product(const Dims& d) {
  int64_t n = 1;
  for (auto x : d) n *= x;
  return n;
}
template <typename T>
struct is_vector : std::false_type {};
template <typename T>
struct is_vector<std::vector<T>> : std::true_type {
  using value_type = T;
};
}  // namespace detail

template <typename T>
void Object::set_attr(const std::string& name, const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    write_attr_string(name, value);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    write_attr_strings(name, value);
  } else if constexpr (detail::is_vector<T>::value) {
    using E = typename detail::is_vector<T>::value_type;
    static_assert(is_numeric_v<E>, "attribute arrays must be of a numeric type");
    write_attr_raw(name, native_type<E>(), Dims{static_cast<int64_t>(value.size())}, value.data());
  } else if constexpr (std::is_same_v<T, int>) {
    int64_t v = value;  // int literals are stored as int64
    write_attr_raw(name, native_type<int64_t>(), Dims{}, &v);
  } else {
    static_assert(is_numeric_v<T>, "unsupported attribute type");
    write_attr_raw(name, native_type<T>(), Dims{}, &value);
  }
}

template <typename T>
T Object::attr(const std::string& name) const {
  if constexpr (std::is_same_v<T, std::string>) {
    return read_attr_string(name);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return read_attr_strings(name);
  } else if constexpr (detail::is_vector<T>::value) {
    using E = typename detail::is_vector<T>::value_type;
    static_assert(is_numeric_v<E>, "attribute arrays must be of a numeric type");
    T out(static_cast<size_t>(detail::product(attr_dims(name))));
    read_attr_raw(name, native_type<E>(), out.data());
    return out;
  } else {
    static_assert(is_numeric_v<T>, "unsupported attribute type");
    if (detail::product(attr_dims(name)) != 1)
      throw Error(where("attribute '" + name + "' is an array, not a scalar"));
    T v{};
    read_attr_raw(name, native_type<T>(), &v);
    return v;
  }
}

template <typename T>
void Dataset::write(const T* data) {
  Dims s = shape();
  write_raw_root(native_type<T>(), Dims(s.size(), 0), s, data);
}
template <typename T>
void Dataset::write(const std::vector<T>& data) {
  if (static_cast<int64_t>(data.size()) != size())
    throw Error(where("write of " + std::to_string(data.size()) + " elements into a dataset of " +
                      std::to_string(size())));
  write(data.data());
}
template <typename T>
std::vector<T> Dataset::read() const {
  Dims s = shape();
  std::vector<T> out(static_cast<size_t>(detail::product(s)));
  read_raw(native_type<T>(), Dims(s.size(), 0), s, out.data());
  return out;
}
template <typename T>
void Dataset::write_block(const Dims& offset, const Dims& count, const T* data) {
  write_raw(native_type<T>(), offset, count, data);
}
template <typename T>
void Dataset::read_block(const Dims& offset, const Dims& count, T* data) const {
  read_raw(native_type<T>(), offset, count, data);
}
template <typename T>
void Dataset::append(const T* row, int64_t n) {
  Dims s = shape();
  Dims row_count = s;
  row_count[0] = 1;
  if (detail::product(row_count) != n)
    throw Error(where("append of a row of " + std::to_string(n) + " elements; a row has " +
                      std::to_string(detail::product(row_count))));
  Dims grown = s;
  grown[0] += 1;
  resize(grown);
  write_row(s[0], row, n);
}
template <typename T>
void Dataset::write_row(int64_t row, const T* data, int64_t n) {
  Dims s = shape();
  Dims offset(s.size(), 0), count = s;
  offset[0] = row;
  count[0] = 1;
  if (row < 0 || row >= s[0] || detail::product(count) != n)
    throw Error(where("write_row " + std::to_string(row) + " out of range or wrong row length"));
  write_raw_root(native_type<T>(), offset, count, data);
}

template <typename T>
Dataset Location::create_dataset(const std::string& name, const Dims& shape, const CreateOptions& opt) {
  return create_dataset_raw(name, native_type<T>(), shape, opt);
}
template <typename T>
Dataset Location::create_series(const std::string& name, const Dims& row_shape, int64_t chunk_rows) {
  CreateOptions opt;
  Dims shape{0}, chunk{chunk_rows}, max{-1};
  for (auto d : row_shape) {
    shape.push_back(d);
    chunk.push_back(d > 0 ? d : 1);
    max.push_back(d);
  }
  opt.chunk = chunk;
  opt.max_dims = max;
  return create_dataset_raw(name, native_type<T>(), shape, opt);
}
template <typename T>
Dataset Location::write(const std::string& name, const std::vector<T>& data, const Dims& shape,
                        const CreateOptions& opt) {
  if (detail::product(shape) != static_cast<int64_t>(data.size()))
    throw Error(where("dataset '" + name + "': " + std::to_string(data.size()) +
                      " elements do not fill its shape"));
  Dataset d = create_dataset<T>(name, shape, opt);
  d.write(data.data());
  return d;
}

}  // namespace meshmoe::h5
