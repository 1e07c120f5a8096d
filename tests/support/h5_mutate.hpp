// Structural mutations of an HDF5 file, for the readers' tests and fuzz target
// (tests/unit/test_h5_mutations.cpp, tests/fuzz/h5_readers_fuzz.cpp): the objects and attributes
// of a valid file changed in rank, shape, type or value, or removed, with the HDF5 C API (no
// h5py, no raw bytes: libhdf5 itself is not under test). Every reader of a file the user hands in
// must answer each with its result or a clean error (docs/ARCHITECTURE.md "Principles" item 6).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace meshmoe::test {

// A place to mutate: a dataset, a group, or an attribute of one ("" object: the root).
struct H5Site {
  enum Kind { Dataset, Group, Attribute } kind;
  std::string object;     // "/params/ln_f.bias", "/" ...
  std::string attribute;  // Attribute only
};

// Every dataset, group (not the root) and attribute of the file, in a fixed order.
std::vector<H5Site> h5_sites(const std::string& path);

// What a mutation does to its site.
enum class H5Mutation : int {
  Remove,       // the object or attribute is deleted
  Scalar,       // replaced by a 0-d one of the same type (an attribute: value 0 or "")
  Reshape,      // a dataset: rank + 1 ([2, dims...]); an attribute: a [3] array
  Shrink,       // a dataset: its first extent 1 (rank 1: [1]); an attribute: a [0]... an empty array
  ToInt8,       // the same shape, type int8 (values 0)
  ToString,     // the same shape, a fixed-length string type
  ToDouble,     // the same shape, type double (values -5)
  Negative,     // an attribute: the integer -5 (a dataset: every value -5 as its own type)
  Huge,         // an attribute: 2^62 (a dataset: every value 1e30 as float)
  NotFinite,    // an attribute: NaN as double (a dataset: NaN everywhere, as float)
  GroupToData,  // a group replaced by a scalar int dataset of its name
  kCount
};
const char* h5_mutation_name(H5Mutation m);

// Applies `m` to `site` of the file at `path` (opened read-write, closed after). Returns false when
// the mutation does not apply to that kind of site (nothing changed). Throws std::runtime_error
// when HDF5 refuses it.
bool h5_mutate(const std::string& path, const H5Site& site, H5Mutation m);

}  // namespace meshmoe::test
