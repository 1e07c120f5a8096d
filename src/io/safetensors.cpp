#include "io/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.hpp"
#include "core/quoted.hpp"
#include "io/output_file.hpp"

namespace meshmoe {

static_assert(std::endian::native == std::endian::little, "safetensors' little-endian bytes are written as in memory");

namespace {

constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // the specification's limit on N

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A JSON reader for the header's grammar: objects, arrays, strings, non-negative integers.
struct Json {
  enum Kind { Object, Array, String, Number } kind = Object;
  std::vector<std::pair<std::string, Json>> members;  // Object, in order
  std::vector<Json> items;                            // Array
  std::string str;                                    // String
  uint64_t num = 0;                                   // Number
  const Json* get(const std::string& k) const {
    for (const auto& [key, v] : members)
      if (key == k) return &v;
    return nullptr;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}
  Json document() {
    Json v = value();
    skip();
    if (i_ != s_.size()) fail("text after the JSON object");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("header byte " + std::to_string(i_) + ": " + what);
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    skip();
    if (i_ >= s_.size() || s_[i_] != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  Json value() {
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      skip();
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, v;
      for (;;) {
        skip();
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value());
        skip();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      ++i_;
      v.kind = Json::Array;
      skip();
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, v;
      for (;;) {
        v.items.push_back(value());
        skip();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::String;
      v.str = string();
      return v;
    }
    if (c >= '0' && c <= '9') {
      v.kind = Json::Number;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        if (v.num > (UINT64_MAX - 9) / 10) fail("number too large");
        v.num = v.num * 10 + uint64_t(s_[i_++] - '0');
      }
      return v;
    }
    fail(std::string("unexpected '") + c + "'");
  }
  std::string string() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unfinished escape");
      c = s_[i_++];
      switch (c) {
        case '"': case '\\': case '/': out += c; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          unsigned cp = unsigned(std::stoul(s_.substr(i_, 4), nullptr, 16));
          i_ += 4;
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 6 <= s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            const unsigned lo = unsigned(std::stoul(s_.substr(i_ + 2, 4), nullptr, 16));
            i_ += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          // UTF-8 encoding of the code point.
          if (cp < 0x80) out += char(cp);
          else if (cp < 0x800) out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
          else if (cp < 0x10000)
            out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
          else
            out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F)),
                out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
          break;
        }
        default: fail(std::string("unknown escape \\") + c);
      }
    }
    if (i_ >= s_.size()) fail("unfinished string");
    ++i_;
    return out;
  }
  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace

const SafeTensor* SafeTensorsFile::find(const std::string& name) const {
  for (const SafeTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string safetensors_header(const std::vector<SafeTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) json += (first ? "" : ",") + quoted(k) + ":" + quoted(v), first = false;
    json += "}";
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafeTensor& t : tensors) {
    if (!names.insert(t.name).second) throw Error("safetensors: two tensors named '" + t.name + "'");
    if (t.name == "__metadata__") throw Error("safetensors: a tensor cannot be named __metadata__");
    if (elements(t.shape) != int64_t(t.data.size()))
      throw Error("safetensors: tensor '" + t.name + "' holds " + std::to_string(t.data.size()) + " values for its shape");
    const uint64_t end = offset + uint64_t(t.data.size()) * sizeof(float);
    json += (json.size() > 1 ? "," : "") + quoted(t.name) + ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) json += (d ? "," : "") + std::to_string(t.shape[d]);
    json += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t n = json.size();
  std::string header(8, '\0');
  std::memcpy(header.data(), &n, 8);
  return header + json;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(tensors, metadata);
  ReplacingFile out(path);
  const std::string& tmp = out.temporary();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw InputError("cannot create " + tmp + ": " + std::strerror(errno));
  auto put = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const std::string why = std::strerror(errno);
        ::close(fd);
        throw InputError("cannot write " + tmp + ": " + why);
      }
      c += w, n -= size_t(w);
    }
  };
  put(header.data(), header.size());
  for (const SafeTensor& t : tensors) put(t.data.data(), t.data.size() * sizeof(float));
  if (::close(fd) != 0) throw InputError("cannot write " + tmp + ": " + std::strerror(errno));
  out.commit();
}

bool is_safetensors_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  char brace = 0;
  if (!in.read(reinterpret_cast<char*>(&n), 8) || !in.get(brace)) return false;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return !ec && brace == '{' && n >= 2 && n <= kMaxHeader && 8 + n <= size;
}

SafeTensorsFile read_safetensors(const std::string& path) {
  auto bad = [&](const std::string& why) { return InputError("safetensors file " + path + ": " + why); };
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad("cannot be opened");
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw bad("cannot be read: " + ec.message());
  uint64_t n = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&n), 8)) throw bad("shorter than the 8-byte header length");
  if (n > kMaxHeader || 8 + n > size) throw bad("header length " + std::to_string(n) + " does not fit the file (" +
                                                std::to_string(size) + " bytes)");
  std::string text(n, '\0');
  if (!in.read(text.data(), std::streamsize(n))) throw bad("truncated header");
  Json doc;
  try {
    doc = JsonParser(text).document();
  } catch (const Error& e) {
    throw bad(std::string("the header is not valid JSON: ") + e.what());
  }
  if (doc.kind != Json::Object) throw bad("the header is not a JSON object");
  const uint64_t buffer = size - 8 - n;
  SafeTensorsFile f;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, v] : doc.members) {
    if (name == "__metadata__") {
      if (v.kind != Json::Object) throw bad("__metadata__ is not an object");
      for (const auto& [k, s] : v.members) {
        if (s.kind != Json::String) throw bad("__metadata__ value '" + k + "' is not a string");
        f.metadata[k] = s.str;
      }
      continue;
    }
    const Json* dtype = v.get("dtype");
    const Json* shape = v.get("shape");
    const Json* offs = v.get("data_offsets");
    if (v.kind != Json::Object || !dtype || !shape || !offs || dtype->kind != Json::String ||
        shape->kind != Json::Array || offs->kind != Json::Array || offs->items.size() != 2)
      throw bad("tensor '" + name + "' lacks dtype, shape or data_offsets [begin, end]");
    if (dtype->str != "F32")
      throw bad("tensor '" + name + "' is " + dtype->str + "; meshmoe reads F32 tensors only (convert with torch: .float())");
    SafeTensor t;
    t.name = name;
    for (const Json& d : shape->items) {
      if (d.kind != Json::Number) throw bad("tensor '" + name + "': a shape entry is not an integer");
      t.shape.push_back(int64_t(d.num));
    }
    const uint64_t begin = offs->items[0].num, end = offs->items[1].num;
    if (offs->items[0].kind != Json::Number || offs->items[1].kind != Json::Number || begin > end || end > buffer ||
        end - begin != uint64_t(elements(t.shape)) * sizeof(float))
      throw bad("tensor '" + name + "': data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                "] do not hold its shape's F32 values within the " + std::to_string(buffer) + "-byte buffer");
    if (f.find(name)) throw bad("two tensors named '" + name + "'");
    t.data.resize(size_t(elements(t.shape)));
    in.seekg(std::streamoff(8 + n + begin));
    if (!t.data.empty() && !in.read(reinterpret_cast<char*>(t.data.data()), std::streamsize(end - begin)))
      throw bad("truncated in tensor '" + name + "'");
    spans.emplace_back(begin, end);
    f.tensors.push_back(std::move(t));
  }
  // The specification: the tensors tile the byte buffer, no holes, no overlaps.
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [b, e] : spans) {
    if (b != at) throw bad("the tensors' data_offsets leave a hole or overlap at byte " + std::to_string(at));
    at = e;
  }
  if (at != buffer) throw bad("the byte buffer has " + std::to_string(buffer - at) + " bytes no tensor names");
  return f;
}

}  // namespace meshmoe
