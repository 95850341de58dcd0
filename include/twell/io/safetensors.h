// Safetensors checkpoints: a validating reader (mmap, zero copy), an atomic writer, and a
// Checkpoint that merges a HuggingFace sharded checkpoint (model.safetensors.index.json) into one
// tensor list.
//
// File layout (https://github.com/huggingface/safetensors): 8-byte little-endian header length N,
// N bytes of JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"k": "v"}}, then the data section; offsets are relative to its start.
//
// Every malformed input is reported as one twell::Error line that names the file and, where one
// is involved, the tensor, e.g.
//   model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight': data ends at byte 1234 but
//   the file's data section has 1000 bytes (truncated file?)
// These errors carry no source location: they describe the input, not a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "twell/tensor.h"

namespace twell::io {

// Safetensors' name for a dtype ("BF16", "F32", ...).
std::string safetensors_dtype_name(DType t);

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;  // meaningful only when `readable`
  // The dtype as the file names it ("BF16", "F8_E4M3", ...), and whether twell reads it (then `dtype`
  // is it). A tensor of another dtype (FP8, BOOL, I16, ...) is listed and its bytes bounded, but
  // view(), read_as() and check_finite() refuse it: a checkpoint that carries one twell does not
  // need still opens.
  std::string file_dtype;
  bool readable = true;
  Shape shape;
  uint64_t begin = 0;  // byte offsets within the data section, [begin, end)
  uint64_t end = 0;

  int64_t numel() const { return shape_numel(shape); }
  uint64_t nbytes() const { return end - begin; }
  bool readable_float() const { return readable && dtype_is_float(dtype); }  // BF16, F16, F32 or F64
};

// One safetensors file, validated on open. Views point into the read-only mapping (or the
// caller's buffer for parse()) and stay valid while any copy of this object lives; never write
// through them. Tensor data is aligned to its element size when the file was written with
// aligned offsets (ours and HuggingFace's are); read_as() and check_finite() work either way.
class SafetensorsFile {
 public:
  // Maps `path` read-only.
  static SafetensorsFile open(const std::string& path);
  // Parses an in-memory file without copying it: `data` must outlive the result.
  // `name_for_errors` stands for the file name in error messages.
  static SafetensorsFile parse(const uint8_t* data, size_t size, std::string name_for_errors);

  const std::string& path() const { return path_; }
  // Tensors in file order (sorted by data offset).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // throws if absent

  TensorView view(const std::string& name) const;
  // Copy converted to `dtype`: from BF16, F16, F32 or F64 to BF16, F16 or F32 (rounding to nearest
  // even; F64 through f32, as PyTorch does), or a plain copy when the dtypes match. A finite value
  // that `dtype` cannot hold is an error, not Inf.
  Tensor read_as(const std::string& name, DType dtype) const;
  // Throws if the tensor holds NaN or Inf, naming it and the first bad element; for F64, also a finite
  // value past F32's range, which every read of it (read_as to F32 or BF16) would refuse.
  void check_finite(const std::string& name) const;

 private:
  const TensorInfo& readable_info(const std::string& name) const;  // info(), or throws if not readable

  std::string path_;
  std::shared_ptr<const uint8_t> mapping_;  // owns the mmap (empty for parse())
  const uint8_t* data_section_ = nullptr;
  uint64_t data_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (host, contiguous, unique non-empty names) atomically: to
// `<path>.tmp.<pid>`, fsync, rename over `path`; on failure the temporary is removed and an
// existing `path` is left as it was. The header is padded with spaces so the data section starts
// at a multiple of 8 bytes; tensors are stored largest element size first (stable otherwise),
// back to back, so each starts at a multiple of its element size. There are no gaps between
// tensors because HuggingFace's reader rejects them.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Index of the first NaN/Inf element of a contiguous host tensor of a float dtype, or -1 (also -1
// for integer dtypes). Reads elements with memcpy, so any alignment is fine.
int64_t first_non_finite(const TensorView& t);

// A checkpoint: one .safetensors file, or a directory holding model.safetensors or a sharded
// model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: shard file}}), or
// the path of such an index. Every shard is opened and cross-checked against the index.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  // All tensors, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // A single file's __metadata__, or the index's "metadata" (non-string values as JSON text).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  const SafetensorsFile& file_of(const std::string& name) const;  // the shard holding `name`

  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const { return file_of(name).info(name); }
  TensorView view(const std::string& name) const { return file_of(name).view(name); }
  Tensor read_as(const std::string& name, DType dtype) const {
    return file_of(name).read_as(name, dtype);
  }
  void check_finite(const std::string& name) const { file_of(name).check_finite(name); }

 private:
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> where_;  // tensor name -> index into files_
  std::map<std::string, std::string> metadata_;
};

}  // namespace twell::io
