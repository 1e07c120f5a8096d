// The safetensors file layout (Hugging Face's published specification, "Format"), written and read
// here without the safetensors library:
//
//   8 bytes   N, unsigned little-endian 64-bit: the size of the header
//   N bytes   a UTF-8 JSON object: {"<name>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]},
//             ..., "__metadata__": {"<key>": "<string value>", ...}}, padded with spaces to a
//             multiple of 8 bytes (so that the byte buffer starts aligned)
//   the rest  the byte buffer: every tensor's elements, row-major, little-endian; a tensor's
//             data_offsets are relative to the buffer's start, the tensors tile it without holes
//
// meshmoe writes and reads F32 only (its parameters are fp32; docs/export.md). Writing goes through
// PATH.tmp, fsynced, then renamed, so a reader never sees half a file.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace meshmoe {

struct SafeTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // product(shape) elements, row-major
};

struct SafeTensorsFile {
  std::vector<SafeTensor> tensors;  // in the header's order
  std::map<std::string, std::string> metadata;
  const SafeTensor* find(const std::string& name) const;
};

// The header (8-byte length and the padded JSON) of `tensors` and `metadata`, as written.
std::string safetensors_header(const std::vector<SafeTensor>& tensors, const std::map<std::string, std::string>& metadata);

// Writes `path` (through path.tmp and a rename). Throws InputError when it cannot be written,
// Error when a tensor's data does not have its shape's element count or two tensors share a name.
void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

// Reads a whole file. Throws InputError naming the file and what is wrong (a header that is not
// the specification's JSON, a dtype other than F32, offsets that do not tile the buffer, a
// truncated file).
SafeTensorsFile read_safetensors(const std::string& path);

// True when the file's first bytes are a safetensors header (a length that fits the file, then
// '{'); false for anything else (an HDF5 checkpoint begins with "\x89HDF").
bool is_safetensors_file(const std::string& path);

}  // namespace meshmoe
