// Safetensors reader (validating, mmap), atomic writer and sharded Checkpoint (safetensors.h).
#include "twell/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "atomic_file.h"
#include "json_util.h"

namespace twell::io {

using json = nlohmann::json;

namespace {

// Real headers are a few hundred KB even for thousands of tensors; more is a corrupt length.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

constexpr DType kAllDTypes[] = {DType::bf16, DType::f16, DType::f32, DType::f64,
                                DType::u8,   DType::i32, DType::u32, DType::i64};

[[noreturn]] void fail(const std::string& file, const std::string& message) {
  throw Error(str(file, ": ", message));
}

[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor,
                              const std::string& message) {
  throw Error(str(file, ": tensor '", printable(tensor), "': ", message));
}

// The bits of a tensor of `shape` at `bits` an element. Reader and writer alike refuse a shape whose
// non-zero dimensions' product overflows int64 (so that shape_numel() and every prefix product are
// defined even where a later dimension is 0), or whose bits overflow 64. The shape is said cut to 100
// characters (a file's may have any number of dimensions).
uint64_t shape_bits(const std::string& file, const std::string& tensor, const Shape& shape, uint64_t bits) {
  const auto said = [&] { return printable(shape_str(shape), 100); };
  int64_t product = 1;
  for (int64_t d : shape)
    if (d != 0 && __builtin_mul_overflow(product, d, &product))
      fail_tensor(file, tensor, str("shape ", said(), " has more elements than fit in int64"));
  uint64_t total = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(shape_numel(shape)), bits, &total))
    fail_tensor(file, tensor, str("shape ", said(), " needs more bytes than fit in 64 bits"));
  return total;
}

std::string supported_dtype_names() {
  std::string names;
  for (DType t : kAllDTypes) names += (names.empty() ? "" : ", ") + safetensors_dtype_name(t);
  return names;
}

// The dtypes of the safetensors format that twell does not read, with their bits an element; a
// tensor of one is listed and its bytes checked (elements · bits / 8, whole bytes), and refused when read.
constexpr std::pair<const char*, uint64_t> kUnreadDTypes[] = {
    {"BOOL", 8}, {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16},
    {"U16", 16}, {"U64", 64}, {"C64", 64},    {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}};

std::string known_dtype_names() {
  std::string names = supported_dtype_names();
  for (const auto& [name, bits] : kUnreadDTypes) names += str(", ", name);
  return names;
}

// Reads a non-negative JSON integer that fits int64 (a shape dimension or an offset).
bool get_non_negative(const json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(v);
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = j.get<int64_t>();
    return true;
  }
  return false;
}

// Validates one header entry (everything that does not involve other tensors).
TensorInfo parse_entry(const std::string& file, const std::string& name, const json& entry,
                       uint64_t data_size) {
  if (!entry.is_object())
    fail_tensor(file, name, str("header entry must be an object, got ", entry.type_name()));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key)) fail_tensor(file, name, str("header entry has no '", key, "'"));

  TensorInfo t;
  t.name = name;
  const json& dtype = entry["dtype"];
  if (!dtype.is_string())
    fail_tensor(file, name, str("dtype must be a string, got ", dtype.type_name()));
  t.file_dtype = dtype.get<std::string>();
  t.readable = false;
  uint64_t bits = 0;  // an element's
  for (DType d : kAllDTypes) {
    if (t.file_dtype == safetensors_dtype_name(d)) {
      t.dtype = d;
      t.readable = true;
      bits = 8 * dtype_size(d);
    }
  }
  for (const auto& [unread, unread_bits] : kUnreadDTypes)
    if (t.file_dtype == unread) bits = unread_bits;
  if (bits == 0)
    fail_tensor(file, name,
                str("unknown dtype '", printable(t.file_dtype), "' (safetensors' are ", known_dtype_names(),
                    "; twell reads ", supported_dtype_names(), ")"));

  const json& shape = entry["shape"];
  const std::string shape_text = printable(shape.dump(), 100);
  if (!shape.is_array()) fail_tensor(file, name, str("shape must be an array, got ", shape_text));
  constexpr size_t kMaxRank = 64;  // no model has more; a header's million 1s would make messages and tables huge
  if (shape.size() > kMaxRank)
    fail_tensor(file, name, str("shape has ", shape.size(), " dimensions; twell reads at most ", kMaxRank));
  for (const json& dim : shape) {
    int64_t d = 0;
    if (!get_non_negative(dim, &d))
      fail_tensor(file, name, str("shape must hold non-negative integers, got ", shape_text));
    t.shape.push_back(d);
  }
  uint64_t needed = shape_bits(file, name, t.shape, bits);  // bits, then bytes
  // Whole bytes only, as the reference reader (MisalignedSlice): an odd count of 4-bit values is refused.
  if (needed % 8 != 0)
    fail_tensor(file, name, str(t.numel(), " ", printable(t.file_dtype), " elements do not fill whole bytes"));

  const json& offsets = entry["data_offsets"];
  int64_t begin = 0, end = 0;
  if (!offsets.is_array() || offsets.size() != 2 || !get_non_negative(offsets[0], &begin) ||
      !get_non_negative(offsets[1], &end) || begin > end)
    fail_tensor(file, name,
                str("data_offsets must be [begin, end] with 0 <= begin <= end, got ",
                    printable(offsets.dump(), 100)));
  t.begin = static_cast<uint64_t>(begin);
  t.end = static_cast<uint64_t>(end);
  if (t.end > data_size)
    fail_tensor(file, name,
                str("data ends at byte ", t.end, " but the file's data section has ", data_size,
                    " bytes (truncated file?)"));
  needed /= 8;
  if (t.nbytes() != needed)
    fail_tensor(
        file, name,
        str("holds ", t.nbytes(), " bytes (data_offsets [", t.begin, ", ", t.end, "]) but ",
            printable(t.file_dtype), " ", printable(shape_str(t.shape), 100), " needs ", needed, " bytes"));
  return t;
}

// Element access by memcpy: tensors in a file need not be aligned.
float load_float(const uint8_t* p, DType t) {
  uint16_t h;
  float f;
  switch (t) {
    case DType::bf16:
      std::memcpy(&h, p, 2);
      return bf16_bits_to_float(h);
    case DType::f16:
      std::memcpy(&h, p, 2);
      return f16_bits_to_float(h);
    case DType::f32:
      std::memcpy(&f, p, 4);
      return f;
    default:
      TWELL_FAIL("load_float: not a 16/32-bit float dtype: ", dtype_name(t));
  }
}

void store_float(uint8_t* p, DType t, float v) {
  uint16_t h;
  switch (t) {
    case DType::bf16:
      h = float_to_bf16_bits(v);
      std::memcpy(p, &h, 2);
      return;
    case DType::f16:
      h = float_to_f16_bits(v);
      std::memcpy(p, &h, 2);
      return;
    case DType::f32:
      std::memcpy(p, &v, 4);
      return;
    default:
      TWELL_FAIL("store_float: not a 16/32-bit float dtype: ", dtype_name(t));
  }
}

// True when the element's exponent bits are all ones (NaN or Inf).
bool element_non_finite(const uint8_t* p, DType t) {
  switch (t) {
    case DType::bf16:
    case DType::f16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      uint16_t mask = t == DType::bf16 ? 0x7f80u : 0x7c00u;
      return (h & mask) == mask;
    }
    case DType::f32: {
      uint32_t u;
      std::memcpy(&u, p, 4);
      return (u & 0x7f800000u) == 0x7f800000u;
    }
    case DType::f64: {
      uint64_t u;
      std::memcpy(&u, p, 8);
      return (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
    }
    default:
      return false;
  }
}

std::string index_str(const Shape& shape, int64_t flat);

// Element `i` of `t` holds the finite `v`, which `to` cannot hold: read as it, it would be Inf.
[[noreturn]] void fail_overflow(const std::string& file, const std::string& name, const TensorInfo& t, int64_t i,
                                double v, DType to) {
  fail_tensor(file, name,
              str("element ", i, " (index ", index_str(t.shape, i), ") is ", v, ", which overflows ",
                  safetensors_dtype_name(to), " (", safetensors_dtype_name(t.dtype), " in the file)"));
}

std::string index_str(const Shape& shape, int64_t flat) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shape_str(idx);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string safetensors_dtype_name(DType t) {
  std::string name = dtype_name(t);  // "bf16" -> "BF16": our names are safetensors' in lower case
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

// ---- SafetensorsFile -------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::parse(const uint8_t* data, size_t size, std::string name) {
  if (size < 8)
    fail(name, str("file has ", size,
                   " bytes, too short for the 8-byte header length (truncated file?)"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];  // little endian
  if (header_len > kMaxHeaderBytes)
    fail(name, str("not a safetensors file? Its first 8 bytes, read as the header length, say ", header_len,
                   " bytes, over the ", kMaxHeaderBytes, "-byte limit"));
  if (header_len > size - 8)
    fail(name, str("header length ", header_len, " runs past the end of the file (", size,
                   " bytes) (truncated file?)"));

  const char* header = reinterpret_cast<const char*>(data + 8);
  // The format's rule (the safetensors library's InvalidHeaderStart): no byte-order mark or space first.
  if (header_len == 0 || header[0] != '{')
    fail(name, str("not a safetensors file? Its header must start with '{', got ",
                   header_len == 0 ? std::string("nothing")
                                   : printable(std::string(header, std::min<uint64_t>(header_len, 16)), 40)));
  // Three levels suffice: {tensor: {"shape": [..]}}; a little slack for odd metadata.
  json root = detail::parse_json_strict(header, header + header_len, name, "header", 4);
  if (!root.is_object()) fail(name, str("header must be a JSON object, got ", root.type_name()));

  SafetensorsFile f;
  f.path_ = std::move(name);
  f.data_section_ = data + 8 + header_len;
  f.data_size_ = size - 8 - header_len;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;  // as the safetensors library reads it: no metadata
      if (!value.is_object())
        fail(f.path_, str("__metadata__ must be an object, got ", value.type_name()));
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string())
          fail(f.path_, str("__metadata__ must map keys to strings; '", printable(mkey),
                            "' holds a ", mvalue.type_name()));
        f.metadata_[mkey] = mvalue.get<std::string>();
      }
      continue;
    }
    f.tensors_.push_back(parse_entry(f.path_, key, value, f.data_size_));
  }

  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Sorted by begin, tensors are disjoint iff each starts at or after the furthest end so far, and
  // they cover the data section without a hole iff each starts at the furthest end so far and the
  // last ends with the file (the format's rule, which the reference implementation enforces).
  uint64_t furthest_end = 0;
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo& t : f.tensors_) {
    if (furthest && t.begin < furthest_end)
      fail_tensor(
          f.path_, t.name,
          str("bytes [", t.begin, ", ", t.end, ") overlap tensor '", printable(furthest->name),
              "' at bytes [", furthest->begin, ", ", furthest->end, ")"));
    if (t.begin > furthest_end)
      fail(f.path_, str("bytes [", furthest_end, ", ", t.begin, ") of the data section belong to no tensor (",
                        "before '", printable(t.name), "'); a safetensors file has no holes"));
    if (t.end >= furthest_end) {
      furthest_end = t.end;
      furthest = &t;
    }
  }
  if (furthest_end != f.data_size_)
    fail(f.path_, str("the data section has ", f.data_size_ - furthest_end, " bytes after the last tensor's end (",
                      furthest_end, " of ", f.data_size_, "); a safetensors file ends with its last tensor"));
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; it is then refused below as not a
  // regular file (the flag changes nothing for a regular file's mapping).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, str("cannot open: ", std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    static const uint8_t nothing[8] = {};
    parse(nothing, size, path);  // throws the "too short" error
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int mmap_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED)
    fail(path, str("cannot map ", size, " bytes: ", std::strerror(mmap_errno)));
  std::shared_ptr<const uint8_t> mapping(
      static_cast<const uint8_t*>(base),
      [size](const uint8_t* p) { ::munmap(const_cast<uint8_t*>(p), size); });
  SafetensorsFile f = parse(mapping.get(), size, path);
  f.mapping_ = std::move(mapping);
  return f;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail(path_, str("no tensor named '", printable(name), "'"));
  return tensors_[it->second];
}

const TensorInfo& SafetensorsFile::readable_info(const std::string& name) const {
  const TensorInfo& t = info(name);
  if (!t.readable)
    fail_tensor(path_, name, str("dtype '", printable(t.file_dtype), "' is not one twell reads (it reads ",
                                 supported_dtype_names(), ")"));
  return t;
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const TensorInfo& t = readable_info(name);
  return TensorView(const_cast<uint8_t*>(data_section_ + t.begin), t.dtype, t.shape);
}

Tensor SafetensorsFile::read_as(const std::string& name, DType dtype) const {
  const TensorInfo& t = readable_info(name);
  const uint8_t* src = data_section_ + t.begin;
  Tensor out(dtype, t.shape);
  auto* dst = static_cast<uint8_t*>(out.view().data);
  if (t.dtype == dtype) {
    if (t.nbytes()) std::memcpy(dst, src, t.nbytes());
    return out;
  }
  auto convertible = [](DType d) { return d == DType::bf16 || d == DType::f16 || d == DType::f32; };
  if (!(convertible(t.dtype) || t.dtype == DType::f64) || !convertible(dtype))
    fail_tensor(path_, name,
                str("cannot convert ", safetensors_dtype_name(t.dtype), " to ", safetensors_dtype_name(dtype),
                    " (conversions are from BF16, F16, F32 or F64 to BF16, F16 or F32)"));
  const size_t in_size = dtype_size(t.dtype), out_size = dtype_size(dtype);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    // F64 is rounded to f32 first, as PyTorch converts it to bf16 and f16 (through float).
    double v = 0;
    if (t.dtype == DType::f64) {
      std::memcpy(&v, src + i * in_size, 8);
    } else {
      v = load_float(src + i * in_size, t.dtype);
    }
    store_float(dst + i * out_size, dtype, static_cast<float>(v));
    // A finite value past the narrower type's range would become Inf: refused, as Inf in the file is.
    if (std::isfinite(v) && !std::isfinite(load_float(dst + i * out_size, dtype)))
      fail_overflow(path_, name, t, i, v, dtype);
  }
  return out;
}

void SafetensorsFile::check_finite(const std::string& name) const {
  const TensorInfo& t = readable_info(name);
  int64_t bad = first_non_finite(view(name));
  if (bad < 0 && t.dtype == DType::f64) {
    const uint8_t* p = data_section_ + t.begin;
    for (int64_t i = 0; i < t.numel(); ++i) {
      double v;
      std::memcpy(&v, p + i * 8, 8);
      if (std::isinf(static_cast<float>(v))) fail_overflow(path_, name, t, i, v, DType::f32);  // as read_as would
    }
  }
  if (bad < 0) return;
  const uint8_t* element = data_section_ + t.begin + bad * dtype_size(t.dtype);
  double v = 0;
  if (t.dtype == DType::f64) {
    std::memcpy(&v, element, 8);
  } else {
    v = load_float(element, t.dtype);
  }
  fail_tensor(path_, name,
              str("element ", bad, " (index ", index_str(t.shape, bad), ") is ",
                  non_finite_name(v), " (", t.numel(), " elements, ",
                  safetensors_dtype_name(t.dtype), ")"));
}

int64_t first_non_finite(const TensorView& t) {
  check_device(t, Device::cpu, "first_non_finite");
  check_contiguous(t, "first_non_finite");
  if (!dtype_is_float(t.dtype)) return -1;
  const auto* p = static_cast<const uint8_t*>(t.data);
  const size_t size = dtype_size(t.dtype);
  const int64_t n = t.numel();
  // Blocks scanned without a branch an element (the compiler vectorises them: a model's weights, or a
  // benchmark's outputs, are gigabytes), then the first bad block's elements one by one.
  const auto any_in = [&](auto word, auto mask, int64_t begin, int64_t end) {
    using Word = decltype(word);
    bool any = false;
    for (int64_t i = begin; i < end; ++i) {
      Word w;
      std::memcpy(&w, p + i * sizeof(Word), sizeof(Word));
      any |= (w & mask) == mask;
    }
    return any;
  };
  constexpr int64_t kBlock = 4096;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    const bool any = t.dtype == DType::bf16  ? any_in(uint16_t{}, uint16_t{0x7f80u}, begin, end)
                     : t.dtype == DType::f16 ? any_in(uint16_t{}, uint16_t{0x7c00u}, begin, end)
                     : t.dtype == DType::f32 ? any_in(uint32_t{}, uint32_t{0x7f800000u}, begin, end)
                     : t.dtype == DType::f64 ? any_in(uint64_t{}, uint64_t{0x7ff0000000000000ull}, begin, end)
                                             : true;  // another float dtype: element by element
    if (!any) continue;
    for (int64_t i = begin; i < end; ++i)
      if (element_non_finite(p + i * size, t.dtype)) return i;
  }
  return -1;
}

// ---- writer ----------------------------------------------------------------------------------

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const auto& [name, view] : tensors) {
    if (name.empty()) fail(path, "a tensor has an empty name");
    if (name == "__metadata__") fail(path, "'__metadata__' is reserved and cannot name a tensor");
    if (!names.insert(name).second) fail_tensor(path, name, "name given twice");
    if (view.device != Device::cpu)
      fail_tensor(path, name, "is a device tensor; copy it to the host first");
    for (int64_t d : view.shape)
      if (d < 0)
        fail_tensor(path, name, str("negative dimension in shape ", shape_str(view.shape)));
    shape_bits(path, name, view.shape, 8 * dtype_size(view.dtype));  // the reader's rule, before the write
    if (!view.is_contiguous())
      fail_tensor(path, name, str("is not contiguous (shape ", shape_str(view.shape), ")"));
    if (view.data == nullptr && view.numel() != 0) fail_tensor(path, name, "has no data");
  }

  // Largest element size first, so that every tensor starts at a multiple of its element size.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].second.dtype) > dtype_size(tensors[b].second.dtype);
  });

  json header = json::object();
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto& [name, view] = tensors[i];
    header[name] = {{"dtype", safetensors_dtype_name(view.dtype)},
                    {"shape", view.shape},
                    {"data_offsets", {offset, offset + view.nbytes()}}};
    offset += view.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception&) {
    fail(path, "tensor names and metadata must be valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-aligned

  uint8_t length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  detail::AtomicFile file(path);
  file.write(length, sizeof length);
  file.write(text.data(), text.size());
  for (size_t i : order) file.write(tensors[i].second.data, tensors[i].second.nbytes());
  file.commit();
}

// ---- Checkpoint ------------------------------------------------------------------------------

Checkpoint Checkpoint::open(const std::string& path) {
  if (!exists(path)) fail(path, str("cannot open: ", std::strerror(errno)));
  std::string file = path;
  if (detail::is_directory(path)) {
    // As transformers looks: the single file first, then the index.
    const std::string single = path + "/model.safetensors", index = path + "/model.safetensors.index.json";
    if (exists(single)) {
      file = single;
    } else if (errno != ENOENT) {
      fail(single, str("cannot open: ", std::strerror(errno)));
    } else if (exists(index)) {
      file = index;
    } else if (errno != ENOENT) {
      fail(index, str("cannot open: ", std::strerror(errno)));
    } else if (std::string link = detail::dangling_link(single); !link.empty()) {
      fail(path, link);
    } else if (std::string index_link = detail::dangling_link(index); !index_link.empty()) {
      fail(path, index_link);
    } else {
      const bool has_bin = exists(path + "/pytorch_model.bin") || exists(path + "/pytorch_model.bin.index.json");
      // Other .safetensors files: shards without their index, or one file of another name.
      std::string others;
      size_t n_others = 0;
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(path, ec))
        if (entry.path().extension() == ".safetensors") {
          const std::string name = entry.path().filename().string();
          if (n_others++ == 0 || name < others) others = name;  // the first by name
        }
      fail(path, str("directory holds neither model.safetensors nor model.safetensors.index.json",
                     has_bin ? " (twell does not read pytorch_model.bin: re-save the model with transformers' "
                               "save_pretrained(dir, safe_serialization=True))"
                     : n_others == 1
                         ? str(" (it holds '", printable(others, 120), "': a checkpoint of one file is read as "
                               "model.safetensors)")
                     : n_others > 1
                         ? str(" (it holds ", n_others, " other .safetensors files, e.g. '", printable(others, 120),
                               "': shards are read through the model.safetensors.index.json saved with them)")
                         : std::string()));
    }
  }

  Checkpoint c;
  c.path_ = path;
  if (!ends_with(file, ".index.json")) {
    c.files_.push_back(SafetensorsFile::open(file));
    c.tensors_ = c.files_[0].tensors();
    c.metadata_ = c.files_[0].metadata();
    for (const TensorInfo& t : c.tensors_) c.where_[t.name] = 0;
  } else {
    const std::string text = detail::read_text_file(file);
    json index = detail::parse_json_strict(text.data(), text.data() + text.size(), file, "index");
    if (!index.is_object()) fail(file, str("index must be a JSON object, got ", index.type_name()));
    if (index.contains("metadata")) {
      if (!index["metadata"].is_object())
        fail(file, str("'metadata' must be an object, got ", index["metadata"].type_name()));
      for (const auto& [key, value] : index["metadata"].items())
        c.metadata_[key] = value.is_string() ? value.get<std::string>() : value.dump();
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      fail(file, "index has no 'weight_map' object");
    const json& weight_map = index["weight_map"];

    // Shards in order of first mention, each opened once.
    std::map<std::string, size_t> shard_index;
    std::vector<std::string> shard_names;
    for (const auto& [tensor, shard] : weight_map.items()) {
      if (!shard.is_string())
        fail(file, str("weight_map: tensor '", printable(tensor), "' maps to a ", shard.type_name(),
                       ", expected a shard file name"));
      const std::string& shard_name = shard.get_ref<const std::string&>();
      if (shard_index.count(shard_name)) continue;
      if (shard_name.empty() || shard_name == "." || shard_name == ".." ||
          shard_name.find_first_of(std::string("/\0", 2)) != std::string::npos)
        fail(file, str("shard name '", printable(shard_name),
                       "' must be a file name in the index's directory"));
      const std::string shard_path = detail::parent_dir(file) + "/" + shard_name;
      if (!exists(shard_path))
        fail(file, str("shard '", printable(shard_name), "' (holding tensor '", printable(tensor),
                       "') is missing: ", printable(shard_path), ": ", std::strerror(errno)));
      shard_index[shard_name] = shard_names.size();
      shard_names.push_back(shard_name);
      c.files_.push_back(SafetensorsFile::open(shard_path));
    }

    // Every shard's names first: a tensor in two shards is said as such, whichever the index names.
    for (size_t i = 0; i < c.files_.size(); ++i) {
      for (const TensorInfo& t : c.files_[i].tensors()) {
        const auto [seen, first] = c.where_.emplace(t.name, i);
        if (!first)
          fail(file, str("tensor '", printable(t.name), "' is in both shard '",
                         printable(shard_names[seen->second]), "' and shard '", printable(shard_names[i]), "'"));
      }
    }
    for (size_t i = 0; i < c.files_.size(); ++i) {
      for (const TensorInfo& t : c.files_[i].tensors()) {
        auto listed = weight_map.find(t.name);
        if (listed == weight_map.end())
          fail(file, str("shard '", printable(shard_names[i]), "' holds tensor '", printable(t.name),
                         "' which the index does not list"));
        if (listed->get_ref<const std::string&>() != shard_names[i])
          fail(file,
               str("tensor '", printable(t.name), "' is in shard '", printable(shard_names[i]),
                   "' but the index maps it to '", printable(listed->get<std::string>()), "'"));
        c.tensors_.push_back(t);
      }
    }
    for (const auto& [tensor, shard] : weight_map.items())
      if (!c.where_.count(tensor))
        fail(file, str("tensor '", printable(tensor), "' is mapped to shard '",
                       printable(shard.get<std::string>()), "' but that file has no such tensor"));
  }
  std::sort(c.tensors_.begin(), c.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return c;
}

const SafetensorsFile& Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(path_, str("no tensor named '", printable(name), "'"));
  return files_[it->second];
}

}  // namespace twell::io
