// Safetensors reader/writer and sharded Checkpoint: bit-exact round trips, every malformed-input
// error (one line, naming file and tensor), atomic writes, NaN/Inf detection, and the `twell
// inspect` CLI failing cleanly on broken files.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>

#include "core/atomic_file.h"
#include "core/io_test_util.h"
#include "model/llama_test_util.h"
#include "twell/io/config.h"
#include "twell/io/safetensors.h"

namespace twell {
namespace {

using io::Checkpoint;
using io::SafetensorsFile;
using test::expect_error;
using test::read_file;
using test::write_file;
using Named = std::vector<std::pair<std::string, TensorView>>;

Tensor random_bits(DType dtype, Shape shape, uint32_t seed) {
  Tensor t(dtype, std::move(shape));
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.view().data);
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return t;
}

Tensor f32_tensor(Shape shape, std::vector<float> values) {
  Tensor t = Tensor::of<float>(std::move(shape));
  std::memcpy(t.ptr<float>(), values.data(), values.size() * sizeof(float));
  return t;
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// A file with a hand-written header and `data_bytes` zero bytes of data.
std::string raw_file(std::string header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data_bytes, '\0');
}

void expect_parse_error(const std::string& bytes, std::initializer_list<std::string> fragments) {
  expect_error(
      [&] {
        SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                               "mem.safetensors");
      },
      fragments);
}

class Safetensors : public test::ScratchDirTest {};

TEST_F(Safetensors, RoundTripsEveryDtypeBitExactWithMetadata) {
  Tensor bf = random_bits(DType::bf16, {3, 5}, 1);  // random bits: includes NaN payloads
  Tensor half = random_bits(DType::f16, {7}, 2);
  Tensor f32 = random_bits(DType::f32, {2, 3, 4}, 3);
  Tensor scalar = f32_tensor({}, {1.5f});
  Tensor empty(DType::bf16, {0, 9});
  Tensor i64 = random_bits(DType::i64, {3}, 4);
  const Named tensors = {{"b.bf16", bf},     {"h.f16", half},  {"a.f32", f32},
                         {"scalar", scalar}, {"empty", empty}, {"ids", i64}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"note", "a \"quoted\" value"}};
  const std::string file = path("model.safetensors");
  io::write_safetensors(file, tensors, metadata);

  SafetensorsFile f = SafetensorsFile::open(file);
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (const auto& [name, original] : tensors) {
    ASSERT_TRUE(f.has(name)) << name;
    TensorView v = f.view(name);
    EXPECT_TRUE(same_bytes(v, original)) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype), 0u)
        << name << " misaligned";
    Tensor copy = f.read_as(name, original.dtype);
    EXPECT_TRUE(same_bytes(copy, original)) << name;
  }
  // File order: by offset, back to back, 8-byte dtypes first.
  const auto& list = f.tensors();
  EXPECT_EQ(list.front().dtype, DType::i64);
  for (size_t i = 1; i < list.size(); ++i)
    EXPECT_EQ(list[i].begin, list[i - 1].end) << list[i].name;
  const std::string bytes = read_file(file);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data section not 8-aligned";
  EXPECT_EQ(bytes.size(), 8 + header_len + list.back().end);
}

TEST_F(Safetensors, ReadAsConvertsBetweenFloatDtypes) {
  Tensor f32 = f32_tensor({2, 3}, {1.0f, -2.5f, 3.14159f, 1e-3f, 65504.0f, 1e30f});
  Tensor bf(DType::bf16, {2, 3});
  for (int i = 0; i < 6; ++i) bf.ptr<bf16>()[i] = bf16(f32.ptr<float>()[i]);
  Tensor ints = Tensor::of<int32_t>({2});
  Tensor huge = f32_tensor({2}, {1.0f, 3.4e38f});  // past bf16's largest finite value (3.39e38)
  Tensor small = f32_tensor({5}, {1.0f, -2.5f, 3.14159f, 1e-3f, 65504.0f});  // within f16's range
  const std::string file = path("conv.safetensors");
  io::write_safetensors(file, {{"f32", f32}, {"bf16", bf}, {"ints", ints}, {"huge", huge}, {"small", small}});
  SafetensorsFile f = SafetensorsFile::open(file);

  Tensor as_bf16 = f.read_as("f32", DType::bf16);
  Tensor back_to_f32 = f.read_as("bf16", DType::f32);
  for (int i = 0; i < 6; ++i) {
    const float x = f32.ptr<float>()[i];
    EXPECT_EQ(as_bf16.ptr<bf16>()[i].bits, float_to_bf16_bits(x)) << i;
    EXPECT_EQ(back_to_f32.ptr<float>()[i], round_bf16(x)) << i;
  }
  Tensor as_f16 = f.read_as("small", DType::f16);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(static_cast<const uint16_t*>(as_f16.view().data)[i], float_to_f16_bits(f32.ptr<float>()[i])) << i;
  expect_error([&] { f.read_as("ints", DType::f32); },
               {"conv.safetensors", "'ints'", "I32", "F32"});
  // A finite value the narrower type cannot hold is refused, not turned into Inf.
  expect_error([&] { f.read_as("huge", DType::bf16); },
               {"conv.safetensors", "'huge'", "element 1", "overflows BF16", "F32 in the file"});
  expect_error([&] { f.read_as("f32", DType::f16); }, {"'f32'", "element 5", "overflows F16"});
  // F64 converts too, through f32 as PyTorch converts it; past f32's range it is refused.
  Tensor f64(DType::f64, {3});
  const double doubles[3] = {1.0 / 3, -2.5e-30, 1e300};
  for (int i = 0; i < 3; ++i) static_cast<double*>(f64.view().data)[i] = doubles[i];
  io::write_safetensors(path("f64.safetensors"), {{"d", f64}});
  SafetensorsFile g = SafetensorsFile::open(path("f64.safetensors"));
  expect_error([&] { g.read_as("d", DType::f32); }, {"'d'", "element 2", "overflows F32", "F64 in the file"});
  expect_error([&] { g.check_finite("d"); }, {"'d'", "element 2", "overflows F32", "F64 in the file"});  // inspect's scan
  Tensor two(DType::f64, {2});
  for (int i = 0; i < 2; ++i) static_cast<double*>(two.view().data)[i] = doubles[i];
  io::write_safetensors(path("f64.safetensors"), {{"d", two}});
  SafetensorsFile h = SafetensorsFile::open(path("f64.safetensors"));
  const Tensor d32 = h.read_as("d", DType::f32), d16 = h.read_as("d", DType::bf16);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(d32.ptr<float>()[i], static_cast<float>(doubles[i])) << i;
    EXPECT_EQ(d16.ptr<bf16>()[i].bits, float_to_bf16_bits(static_cast<float>(doubles[i]))) << i;
  }
  expect_error([&] { f.view("nope"); }, {"conv.safetensors", "no tensor named 'nope'"});
}

TEST_F(Safetensors, CheckpointOpensFileOrDirectory) {
  Tensor w = random_bits(DType::bf16, {4, 4}, 5);
  io::write_safetensors(path("model.safetensors"), {{"w", w}}, {{"format", "pt"}});
  for (const std::string& p : {dir_, path("model.safetensors")}) {
    Checkpoint c = Checkpoint::open(p);
    ASSERT_TRUE(c.has("w")) << p;
    EXPECT_FALSE(c.has("v"));
    EXPECT_TRUE(same_bytes(c.view("w"), w));
    EXPECT_EQ(c.metadata().at("format"), "pt");
  }
  std::filesystem::create_directories(path("empty"));
  expect_error([&] { Checkpoint::open(path("empty")); },
               {"empty", "neither model.safetensors nor model.safetensors.index.json"});
  expect_error([&] { Checkpoint::open(path("absent")); }, {"absent", "No such file"});
  std::filesystem::create_directories(path("torch_bin"));
  std::ofstream(path("torch_bin/pytorch_model.bin")) << "x";
  expect_error([&] { Checkpoint::open(path("torch_bin")); },
               {"neither model.safetensors", "does not read pytorch_model.bin", "safe_serialization=True"});
  std::filesystem::create_directories(path("shards"));  // shards without their index
  for (const char* name : {"model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors"})
    io::write_safetensors(path(std::string("shards/") + name), {{name, w}});
  expect_error([&] { Checkpoint::open(path("shards")); },
               {"neither model.safetensors", "it holds 2 other .safetensors files, e.g. "
                "'model-00001-of-00002.safetensors': shards are read through the model.safetensors.index.json"});
}

// Two shards and an index written by hand, as HuggingFace lays them out.
class ShardedCheckpoint : public test::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    io::write_safetensors(path("model-00001-of-00002.safetensors"), {{"a", a_}, {"b", b_}});
    io::write_safetensors(path("model-00002-of-00002.safetensors"), {{"c", c_}});
  }
  void write_index(const std::string& weight_map) {
    write_file(path("model.safetensors.index.json"),
               "{\"metadata\": {\"total_size\": 184, \"format\": \"pt\"},\n \"weight_map\": {" +
                   weight_map + "}}");
  }
  const std::string kGoodMap =
      "\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\","
      " \"c\": \"model-00002-of-00002.safetensors\"";
  Tensor a_ = random_bits(DType::bf16, {8, 4}, 6);
  Tensor b_ = random_bits(DType::f32, {4}, 7);
  Tensor c_ = random_bits(DType::bf16, {4, 16}, 8);
};

// A directory with both model.safetensors and an index is read from the single file, as
// transformers reads it.
TEST_F(ShardedCheckpoint, TheSingleFileComesBeforeTheIndex) {
  write_index(kGoodMap);
  io::write_safetensors(path("model.safetensors"), {{"only", b_}});
  Checkpoint c = Checkpoint::open(dir_);
  ASSERT_EQ(c.tensors().size(), 1u);
  EXPECT_EQ(c.tensors()[0].name, "only");
  EXPECT_EQ(Checkpoint::open(path("model.safetensors.index.json")).tensors().size(), 3u);  // named, it is read
}

TEST_F(ShardedCheckpoint, MergesShardsInNameOrder) {
  write_index(kGoodMap);
  for (const std::string& p : {dir_, path("model.safetensors.index.json")}) {
    Checkpoint c = Checkpoint::open(p);
    ASSERT_EQ(c.tensors().size(), 3u);
    EXPECT_EQ(c.tensors()[0].name, "a");
    EXPECT_EQ(c.tensors()[2].name, "c");
    EXPECT_EQ(c.files().size(), 2u);
    EXPECT_TRUE(same_bytes(c.view("a"), a_));
    EXPECT_TRUE(same_bytes(c.view("b"), b_));
    EXPECT_TRUE(same_bytes(c.read_as("c", DType::bf16), c_));
    EXPECT_NE(c.file_of("c").path().find("model-00002-of-00002"), std::string::npos);
    EXPECT_EQ(c.metadata().at("total_size"), "184");
    EXPECT_EQ(c.metadata().at("format"), "pt");
  }
}

TEST_F(ShardedCheckpoint, MissingShardIsNamed) {
  write_index(kGoodMap);
  std::filesystem::remove(path("model-00002-of-00002.safetensors"));
  expect_error([&] { Checkpoint::open(dir_); },
               {"model.safetensors.index.json", "shard 'model-00002-of-00002.safetensors'", "'c'",
                "missing"});
}

TEST_F(ShardedCheckpoint, TensorListedButAbsentFromItsShard) {
  write_index(kGoodMap + ", \"lm_head.weight\": \"model-00002-of-00002.safetensors\"");
  expect_error([&] { Checkpoint::open(dir_); },
               {"model.safetensors.index.json", "'lm_head.weight'", "no such tensor"});
}

TEST_F(ShardedCheckpoint, DuplicatesAndUnlistedTensorsAreRejected) {
  io::write_safetensors(path("model-00002-of-00002.safetensors"), {{"c", c_}, {"a", a_}});
  write_index(kGoodMap);
  expect_error([&] { Checkpoint::open(dir_); },
               {"model.safetensors.index.json", "tensor 'a'", "model-00001", "model-00002"});
  // said as two shards whichever the index names (mapped to the second, the first's copy was "in shard
  // 1 but the index maps it to 2")
  write_index("\"a\": \"model-00002-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\","
              " \"c\": \"model-00002-of-00002.safetensors\"");
  expect_error([&] { Checkpoint::open(dir_); },
               {"tensor 'a' is in both shard '", "'model-00001-of-00002.safetensors'",
                "'model-00002-of-00002.safetensors'"});
  write_index(kGoodMap);

  io::write_safetensors(path("model-00002-of-00002.safetensors"), {{"c", c_}, {"extra", a_}});
  expect_error([&] { Checkpoint::open(dir_); }, {"index.json", "'extra'", "does not list"});

  write_index(kGoodMap + ", \"a\": \"model-00001-of-00002.safetensors\"");
  expect_error([&] { Checkpoint::open(dir_); }, {"index.json", "key 'a' twice"});

  write_file(path("model.safetensors.index.json"), "{\"metadata\": {}}");
  expect_error([&] { Checkpoint::open(dir_); }, {"index.json", "weight_map"});
}

// A shard is a file beside the index: no path, no "." or "..", no NUL (which would cut the name short and open
// another file).
TEST_F(ShardedCheckpoint, ShardNamesAreFileNamesBesideTheIndex) {
  for (const std::string& name : {std::string("sub/x.safetensors"), std::string(".."), std::string("."),
                                  std::string("model-00002-of-00002.safetensors\\u0000zzz")}) {
    SCOPED_TRACE(name);
    write_index(kGoodMap + ", \"d\": \"" + name + "\"");
    expect_error([&] { Checkpoint::open(dir_); }, {"index.json", "must be a file name in the index's directory"});
  }
}

TEST_F(Safetensors, TruncatedFileIsReportedAtEveryCut) {
  Tensor w = random_bits(DType::f32, {16, 8}, 9);
  Tensor v = random_bits(DType::bf16, {32}, 10);
  const std::string good = path("good.safetensors");
  io::write_safetensors(good, {{"model.layers.0.mlp.up_proj.weight", w}, {"norm", v}});
  const std::string bytes = read_file(good);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const size_t data_start = 8 + header_len;

  const std::string cut_file = path("cut.safetensors");
  for (size_t cut : {size_t{0}, size_t{3}, size_t{7}}) {
    write_file(cut_file, bytes.substr(0, cut));
    expect_error([&] { SafetensorsFile::open(cut_file); }, {cut_file, "too short", "truncated"});
  }
  for (size_t cut : {size_t{8}, size_t{20}, data_start - 1}) {
    write_file(cut_file, bytes.substr(0, cut));
    expect_error([&] { SafetensorsFile::open(cut_file); },
                 {cut_file, "header length", "truncated"});
  }
  // Inside the data: f32 tensors are stored before bf16 ones, and entries are checked in name
  // order, so the first tensor reported is the first by name whose bytes were cut off.
  for (size_t cut : {data_start, data_start + 100, bytes.size() - 1}) {
    write_file(cut_file, bytes.substr(0, cut));
    const std::string lost =
        cut < data_start + w.nbytes() ? "model.layers.0.mlp.up_proj.weight" : "norm";
    expect_error([&] { SafetensorsFile::open(cut_file); },
                 {cut_file, "tensor '" + lost + "'", "data ends at byte", "truncated file?"});
    expect_error([&] { Checkpoint::open(cut_file); }, {cut_file, "tensor '" + lost + "'"});
  }
}

TEST(SafetensorsParse, BadHeaderLength) {
  std::string huge(8, '\0');
  huge[5] = 1;  // 2^40
  expect_parse_error(huge + "{}", {"mem.safetensors", "not a safetensors file", "1099511627776", "limit"});
  std::string past = raw_file("{}", 0);
  past[0] = 10;
  expect_parse_error(past, {"mem.safetensors", "runs past the end", "10 bytes"});
}

TEST(SafetensorsParse, HeaderMustBeAJsonObject) {
  expect_parse_error(raw_file("{not json}", 0), {"mem.safetensors", "header is not valid JSON"});
  // The header starts with '{' (the format's rule): an array, a byte-order mark, a space, nothing.
  expect_parse_error(raw_file("[1, 2]    ", 0), {"mem.safetensors", "must start with '{'", "[1, 2]"});
  expect_parse_error(raw_file("\xef\xbb\xbf{}", 0), {"mem.safetensors", "must start with '{'"});
  expect_parse_error(raw_file("  {}", 0), {"mem.safetensors", "must start with '{'"});
  expect_parse_error(raw_file("", 0), {"mem.safetensors", "must start with '{', got nothing"});
  expect_parse_error(raw_file("{\"a\": \"\xff\"}", 0), {"mem.safetensors", "not valid JSON"});
  expect_parse_error(raw_file("{\"x\": [[[[[[1]]]]]]}", 0), {"mem.safetensors", "nests deeper"});
  expect_parse_error(
      raw_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]},"
               " \"w\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [4, 8]}}",
               8),
      {"mem.safetensors", "key 'w' twice"});
  expect_parse_error(raw_file("{\"__metadata__\": {\"n\": 3}}", 0),
                     {"mem.safetensors", "__metadata__", "'n'", "number"});
  const std::string null_metadata = raw_file("{\"__metadata__\": null}", 0);  // the safetensors library takes it
  EXPECT_TRUE(SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(null_metadata.data()), null_metadata.size(),
                                     "mem.safetensors")
                  .metadata()
                  .empty());
}

// Safetensors dtypes twell does not read (FP8, complex, sub-byte floats) are listed with their bytes
// checked; the file opens, and only reading such a tensor is refused, naming it.
TEST(SafetensorsParse, DtypesNotReadAreListedAndRefusedOnRead) {
  const std::string bytes = raw_file(
      "{\"a\": {\"dtype\": \"F8_E4M3\", \"shape\": [2, 3], \"data_offsets\": [0, 6]},"
      " \"b\": {\"dtype\": \"F4\", \"shape\": [4], \"data_offsets\": [6, 8]},"
      " \"c\": {\"dtype\": \"C64\", \"shape\": [1], \"data_offsets\": [8, 16]},"
      " \"d\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [16, 20]}}",
      20);
  const SafetensorsFile f =
      SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem.safetensors");
  ASSERT_EQ(f.tensors().size(), 4u);
  for (const char* name : {"a", "b", "c"}) {
    SCOPED_TRACE(name);
    const io::TensorInfo& t = f.info(name);
    EXPECT_FALSE(t.readable);
    const std::string dtype = name == std::string("a") ? "F8_E4M3" : name == std::string("b") ? "F4" : "C64";
    EXPECT_EQ(t.file_dtype, dtype);
    const std::initializer_list<std::string> what = {"mem.safetensors", str("tensor '", name, "'"),
                                                     str("dtype '", dtype, "' is not one twell reads"), "BF16"};
    expect_error([&] { f.view(name); }, what);
    expect_error([&] { f.read_as(name, DType::f32); }, what);
    expect_error([&] { f.check_finite(name); }, what);
  }
  EXPECT_EQ(f.info("a").shape, (Shape{2, 3}));
  EXPECT_TRUE(f.info("d").readable);
  EXPECT_EQ(f.info("d").file_dtype, "F32");
  EXPECT_EQ(f.read_as("d", DType::f32).ptr<float>()[0], 0.0f);
  // Still bounded by the file and by its neighbours.
  expect_parse_error(raw_file("{\"a\": {\"dtype\": \"F4\", \"shape\": [4], \"data_offsets\": [0, 9]}}", 8),
                     {"tensor 'a'", "truncated"});
}

TEST(SafetensorsParse, EntryFieldsAreChecked) {
  auto entry = [](const std::string& fields, size_t data) {
    return raw_file("{\"bad.weight\": {" + fields + "}}", data);
  };
  const std::initializer_list<std::string> names = {"mem.safetensors", "tensor 'bad.weight'"};
  auto expect = [&](const std::string& fields, size_t data, const std::string& what) {
    SCOPED_TRACE(fields);
    expect_parse_error(entry(fields, data), names);
    expect_parse_error(entry(fields, data), {what});
  };
  expect("\"shape\": [2], \"data_offsets\": [0, 8]", 8, "no 'dtype'");
  expect("\"dtype\": \"F32\", \"data_offsets\": [0, 8]", 8, "no 'shape'");
  expect("\"dtype\": \"F32\", \"shape\": [2]", 8, "no 'data_offsets'");
  expect("\"dtype\": \"F8_E4M3\", \"shape\": [2], \"data_offsets\": [0, 3]", 3,
         "holds 3 bytes (data_offsets [0, 3]) but F8_E4M3 [2] needs 2 bytes");
  expect("\"dtype\": \"I16\", \"shape\": [3], \"data_offsets\": [0, 2]", 2, "I16 [3] needs 6 bytes");
  expect("\"dtype\": \"F6_E2M3\", \"shape\": [4], \"data_offsets\": [0, 2]", 2, "F6_E2M3 [4] needs 3 bytes");
  // Sub-byte elements must fill whole bytes, as the safetensors library requires (its MisalignedSlice).
  expect("\"dtype\": \"F6_E2M3\", \"shape\": [3], \"data_offsets\": [0, 3]", 3,
         "3 F6_E2M3 elements do not fill whole bytes");
  expect("\"dtype\": \"F4\", \"shape\": [3], \"data_offsets\": [0, 2]", 2, "3 F4 elements do not fill whole bytes");
  expect("\"dtype\": 5, \"shape\": [2], \"data_offsets\": [0, 8]", 8, "dtype must be a string");
  expect("\"dtype\": \"f32\", \"shape\": [2], \"data_offsets\": [0, 8]", 8, "unknown dtype 'f32'");
  expect("\"dtype\": \"\", \"shape\": [2], \"data_offsets\": [0, 8]", 8, "unknown dtype ''");
  expect("\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 8]", 8, "non-negative");
  expect("\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]", 8, "non-negative");
  expect("\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4], \"data_offsets\": [0, 8]", 8,
         "int64");
  expect("\"dtype\": \"F32\", \"shape\": [2305843009213693952, 2], \"data_offsets\": [0, 8]", 8,
         "64 bits");
  expect("\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]", 8,
         "holds 8 bytes (data_offsets [0, 8]) but F32 [3] needs 12 bytes");
  std::string ones = "1";
  for (int i = 0; i < 64; ++i) ones += ", 1";  // 65 dimensions
  expect("\"dtype\": \"F32\", \"shape\": [" + ones + "], \"data_offsets\": [0, 4]", 4,
         "shape has 65 dimensions; twell reads at most 64");
  expect("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]", 8, "begin <= end");
  expect("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]", 8, "[begin, end]");
  expect("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 4,
         "data ends at byte 8 but the file's data section has 4 bytes");
  // Zero-size tensors with a huge dimension are fine.
  const std::string ok = entry(
      "\"dtype\": \"F32\", \"shape\": [1152921504606846976, 4, 0], "
      "\"data_offsets\": [0, 0]",
      0);
  SafetensorsFile f =
      SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(ok.data()), ok.size(), "ok");
  EXPECT_EQ(f.view("bad.weight").numel(), 0);
}

TEST(SafetensorsParse, OverlappingTensorsAreRejected) {
  const std::string bytes = raw_file(
      "{\"first\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
      " \"second\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [12, 20]}}",
      20);
  expect_parse_error(bytes, {"mem.safetensors", "tensor 'second'", "overlap tensor 'first'"});
}

// The data section is the tensors' bytes and nothing else (the format's rule): a gap between two
// tensors, or bytes after the last, could hide another file inside this one.
TEST(SafetensorsParse, HolesAndTrailingBytesAreRejected) {
  const std::string gap = raw_file(
      "{\"first\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
      " \"second\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [32, 40]}}",
      40);
  expect_parse_error(gap, {"mem.safetensors", "bytes [16, 32) of the data section belong to no tensor", "'second'"});
  const std::string trailing =
      raw_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 72);
  expect_parse_error(trailing, {"mem.safetensors", "64 bytes after the last tensor's end (8 of 72)"});
  expect_parse_error(raw_file("{}", 8), {"8 bytes after the last tensor's end (0 of 8)"});
}

TEST(SafetensorsParse, ControlCharactersInNamesStayOnOneLine) {
  expect_parse_error(
      raw_file("{\"a\\nb\": {\"dtype\": \"X\", \"shape\": [], \"data_offsets\": [0, 4]}}", 4),
      {"tensor 'a\\nb'"});
}

// A program that asked for it (the CLI) loses no temporary to a Ctrl-C or a kill mid-write: the signal
// removes the temporaries being written, then ends the process as it would have. A committed file stays.
TEST_F(Safetensors, ASignalMidWriteRemovesTheTemporary) {
  const std::string kept = path("kept.json"), cut = path("cut.safetensors");
  for (const int sig : {SIGINT, SIGTERM}) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      io::detail::remove_temporaries_on_signals();
      io::detail::write_file_atomically(kept, "{}");
      io::detail::AtomicFile a(cut), b(cut);  // two writers at once
      a.write("half", 4), b.write("half", 4);
      ::raise(sig);
      ::_exit(0);  // not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << status;
    EXPECT_EQ(listing(), std::vector<std::string>{"kept.json"}) << "a temporary outlived the signal";
    EXPECT_EQ(read_file(kept), "{}");
  }
}

TEST_F(Safetensors, WriteIsAtomic) {
  const std::string file = path("model.safetensors");
  Tensor w = random_bits(DType::bf16, {4, 4}, 11);
  io::write_safetensors(file, {{"w", w}});
  const std::string before = read_file(file);
  io::write_safetensors(file, {{"w", w}});  // overwrite in place
  EXPECT_EQ(read_file(file), before);

  expect_error(
      [&] {
        io::write_safetensors(file, {{"x", w}, {"x", w}});
      },
      {file, "tensor 'x'", "twice"});
  TensorView strided = w.view();
  strided.strides = {1, 4};
  expect_error([&] { io::write_safetensors(file, {{"t", strided}}); }, {file, "'t'", "contiguous"});
  TensorView on_device = w.view();
  on_device.device = Device::cuda;
  expect_error([&] { io::write_safetensors(file, {{"d", on_device}}); }, {file, "'d'", "device"});
  expect_error([&] { io::write_safetensors(file, {{"__metadata__", w}}); }, {file, "reserved"});
  // A shape the reader would refuse is refused before writing (its element count overflowed to 0 and
  // the file replaced the old one), also where a zero dimension makes it empty.
  for (const Shape& shape : {Shape{int64_t{1} << 32, int64_t{1} << 32, 2}, Shape{int64_t{1} << 40, int64_t{1} << 40, 0}}) {
    TensorView huge = w.view();
    huge.shape = shape;
    huge.strides.clear();
    expect_error([&] { io::write_safetensors(file, {{"huge", huge}}); }, {file, "'huge'", "more elements than fit in int64"});
  }
  EXPECT_EQ(read_file(file), before) << "a failed write clobbered the old file";
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"}) << "temporary left behind";

  // A write that fails half way (the temporary is abandoned) leaves the target untouched.
  {
    io::detail::AtomicFile partial(file);
    partial.write("garbage", 7);
    EXPECT_TRUE(std::filesystem::exists(partial.temp_path()));
  }
  EXPECT_EQ(read_file(file), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});

  expect_error(
      [&] {
        io::write_safetensors(path("no/such/dir/x.safetensors"), {{"w", w}});
      },
      {"no/such/dir/x.safetensors", "its directory does not exist"});

  // Through a symbolic link the file it names is replaced and the link stays; a FIFO (as a
  // device such as /dev/null would be) is refused and left as it was, not replaced by a file.
  std::filesystem::create_symlink(file, path("link.safetensors"));
  io::detail::write_file_atomically(path("link.safetensors"), "through the link");
  EXPECT_TRUE(std::filesystem::is_symlink(path("link.safetensors")));
  EXPECT_EQ(read_file(file), "through the link");
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  expect_error([&] { io::detail::write_file_atomically(path("fifo"), "x"); }, {"fifo", "not a regular file"});
  EXPECT_TRUE(std::filesystem::is_fifo(path("fifo")));
  // Read, a FIFO is refused at once too, not waited on for a writer.
  expect_error([&] { io::SafetensorsFile::open(path("fifo")); }, {"fifo", "not a regular file"});
  std::filesystem::create_symlink(path("fifo"), path("fifo_link"));
  expect_error([&] { io::detail::write_file_atomically(path("fifo_link"), "x"); },
               {"fifo_link", "a link to what is not a regular file"});
  std::filesystem::create_symlink(path("missing"), path("dangling"));
  expect_error([&] { io::detail::write_file_atomically(path("dangling"), "x"); },
               {"dangling", "a symbolic link to nothing that exists"});
  // A replaced file keeps its permissions (a 0600 file is not made readable by everyone).
  ASSERT_EQ(::chmod(file.c_str(), 0600), 0);
  io::detail::write_file_atomically(file, "private");
  struct stat st;
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  // Two writers of one path in one process each commit what they wrote: their temporaries have
  // names of their own (one was "<path>.tmp.<pid>", and the second writer removed the first's).
  {
    io::detail::AtomicFile a(file), b(file);
    EXPECT_NE(a.temp_path(), b.temp_path());
    a.write("AAAAAAAA", 8);
    b.write("BB", 2);
    a.commit();
    EXPECT_EQ(read_file(file), "AAAAAAAA");
    b.commit();
    EXPECT_EQ(read_file(file), "BB");
  }
  // Another writer's temporary (a crashed one's, say) is left alone, not removed or written.
  const std::string temp = file + ".tmp." + std::to_string(::getpid());
  write_file(temp, "someone else's");
  io::detail::write_file_atomically(file, "again");
  EXPECT_EQ(read_file(file), "again");
  EXPECT_EQ(read_file(temp), "someone else's");
}

TEST_F(Safetensors, NonFiniteValuesAreFoundAndNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Tensor has_nan = f32_tensor({2, 3}, {0, 1, 2, 3, 4, nan});
  Tensor has_inf(DType::bf16, {4});
  has_inf.ptr<bf16>()[2] = bf16(-inf);
  Tensor finite = f32_tensor({2}, {1e38f, -1e38f});
  Tensor ints = Tensor::of<int32_t>({3});
  EXPECT_EQ(io::first_non_finite(has_nan), 5);
  EXPECT_EQ(io::first_non_finite(has_inf), 2);
  EXPECT_EQ(io::first_non_finite(finite), -1);
  EXPECT_EQ(io::first_non_finite(ints), -1);
  // Across and inside the scan's blocks of 4096, in every float dtype, the first bad element found.
  for (const DType t : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    Tensor big(t, {3, 4097});  // zeros: finite
    EXPECT_EQ(io::first_non_finite(big), -1);
    auto* bytes = static_cast<uint8_t*>(big.view().data);
    for (const int64_t at : {int64_t{12290}, int64_t{8192}, int64_t{4095}, int64_t{0}}) {
      std::memset(bytes + at * dtype_size(t), 0xff, dtype_size(t));  // a NaN in every dtype
      EXPECT_EQ(io::first_non_finite(big), at) << dtype_name(t);
    }
  }

  io::write_safetensors(
      path("model.safetensors"),
      {{"layer.nan", has_nan}, {"layer.inf", has_inf}, {"ok", finite}, {"ids", ints}});
  Checkpoint c = Checkpoint::open(dir_);
  expect_error([&] { c.check_finite("layer.nan"); },
               {"model.safetensors", "tensor 'layer.nan'", "element 5", "[1, 2]", "NaN"});
  expect_error([&] { c.check_finite("layer.inf"); }, {"tensor 'layer.inf'", "element 2", "-Inf"});
  c.check_finite("ok");
  c.check_finite("ids");
}

// ---- the CLI on broken files -----------------------------------------------------------------

struct CliResult {
  int exit_code = -1;
  int signal = 0;
  std::string out, err;
};

class InspectCli : public test::ScratchDirTest {
 protected:
  CliResult inspect(const std::string& args) {
    const std::string out = path("stdout.txt"), err = path("stderr.txt");
    const std::string cmd =
        std::string("'") + TWELL_CLI_PATH + "' inspect " + args + " >'" + out + "' 2>'" + err + "'";
    const int status = std::system(cmd.c_str());
    CliResult r;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    r.out = read_file(out);
    r.err = read_file(err);
    return r;
  }

  // Non-zero exit, no signal, exactly one stderr line "twell: error: ..." containing `fragment`.
  void expect_clean_failure(const CliResult& r, const std::string& fragment) {
    EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal;
    EXPECT_NE(r.exit_code, 0);
    EXPECT_LT(r.exit_code, 128) << "exit code looks like a crash";
    EXPECT_EQ(r.err.rfind("twell: error: ", 0), 0u) << r.err;
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.back(), '\n');
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
  }
};

// A tensor of a dtype twell does not read is listed, and --check-finite says it did not scan it.
TEST_F(InspectCli, ListsDtypesItDoesNotReadAndSaysTheyWereNotScanned) {
  io::write_safetensors(path("model.safetensors"), {{"scale", Tensor(DType::u8, {4})}, {"w", f32_tensor({1}, {1})}});
  test::retype(path("model.safetensors"), "U8", "F8_E4M3");
  const CliResult r = inspect("--check-finite '" + path("model.safetensors") + "'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("F8_E4M3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("finite: all 1 float tensors hold only finite values"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("finite: not scanned: 1 F8_E4M3 (dtypes twell does not read)"), std::string::npos) << r.out;
}

// Names and metadata from the file are printed escaped and cut: a newline in a name forged a line
// ("finite: ..."), a megabyte-long name padded every row to its width.
TEST_F(InspectCli, NamesFromTheFileCannotForgeLinesOrWidenTheTable) {
  Tensor a = f32_tensor({1}, {1});
  io::write_safetensors(path("x.safetensors"),
                        {{"w\nfinite: all 20 float tensors hold only finite values", a},
                         {std::string(100000, 'n'), a}},
                        {{"note", "\x1b[31mred\nforged line"}});
  const CliResult r = inspect("'" + path("x.safetensors") + "'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("\nfinite: all 20"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("w\\nfinite: all 20"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note = \\x1b[31mred\\nforged line"), std::string::npos) << r.out;
  EXPECT_LT(r.out.size(), 2000u) << "the long name's width";
}

TEST_F(InspectCli, PrintsConfigTensorsAndTotals) {
  io::ModelConfig cfg;
  cfg.hidden_size = 64;
  cfg.intermediate_size = 176;
  cfg.num_hidden_layers = 1;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 4;
  cfg.head_dim = 16;
  cfg.vocab_size = 100;
  cfg.max_position_embeddings = 128;
  cfg.hidden_act = "relu";
  io::write_config(dir_, cfg);
  Tensor up = random_bits(DType::bf16, {176, 64}, 12);
  Tensor norm = f32_tensor({2}, {1, 1});
  io::write_safetensors(path("model.safetensors"),
                        {{"model.layers.0.mlp.up_proj.weight", up}, {"model.norm.weight", norm}});
  CliResult r = inspect("'" + path("model.safetensors") + "'");  // the whole checkpoint as one file
  expect_clean_failure(r, "twell run and twell eval refuse this checkpoint: ");  // layer 0 lacks tensors
  expect_clean_failure(r, "missing tensor");  // the reason on stderr too, for a script that keeps only it
  EXPECT_NE(r.out.find("hidden 64, intermediate 176"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.layers.0.mlp.up_proj.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[176, 64]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 tensors, 11,266 parameters, 22,536 bytes"), std::string::npos) << r.out;
  // The directory: the same table, then the loader's verdict on the pair (layer 0 lacks tensors),
  // and an error exit for scripts.
  CliResult dir = inspect("'" + dir_ + "'");
  EXPECT_NE(dir.out.find("2 tensors, 11,266 parameters"), std::string::npos) << dir.out;
  EXPECT_NE(dir.out.find("model: twell run and twell eval refuse this checkpoint: "), std::string::npos) << dir.out;
  EXPECT_NE(dir.out.find("missing tensor"), std::string::npos) << dir.out;
  expect_clean_failure(dir, "twell run and twell eval refuse this checkpoint: ");
  expect_clean_failure(dir, "missing tensor");
  // A config twell does not run (YaRN RoPE): said so, and the tensors are still listed.
  write_file(path("config.json"), R"({"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 1,
      "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 128,
      "rope_scaling": {"rope_type": "yarn", "factor": 4}})");
  CliResult yarn = inspect("'" + path("model.safetensors") + "'");
  EXPECT_NE(yarn.out.find("refused: "), std::string::npos) << yarn.out;
  EXPECT_NE(yarn.out.find("'yarn'"), std::string::npos) << yarn.out;
  EXPECT_NE(yarn.out.find("2 tensors, 11,266 parameters"), std::string::npos) << yarn.out;
  expect_clean_failure(yarn, "refuse its config.json");
  // A config.json that is a directory is refused as one (it was "config: none found").
  std::filesystem::remove(path("config.json"));
  std::filesystem::create_directory(path("config.json"));
  CliResult not_file = inspect("'" + dir_ + "'");
  EXPECT_NE(not_file.out.find("config: refused: " + path("config.json") + ": a directory, not a file"),
            std::string::npos) << not_file.out;
  expect_clean_failure(not_file, "refuse its config.json");
}

// A directory whose tensors match its config: said so, exit 0 (with no tokenizer, only where
// --byte-tokenizer can serve the vocabulary).
TEST_F(InspectCli, SaysWhenTheModelLoads) {
  io::ModelConfig c = model::tiny_config("relu", true);
  model::write_hf(dir_, c, model::random_hf_tensors(c, 3));
  const CliResult small = inspect("'" + dir_ + "'");
  expect_clean_failure(small, "too small for --byte-tokenizer");
  // The tokenizer line says the same, not that --byte-tokenizer would serve (the error's "above").
  EXPECT_NE(small.out.find("tokenizer: no tokenizer, and a vocabulary of"), std::string::npos) << small.out;
  EXPECT_EQ(small.out.find("then need --byte-tokenizer"), std::string::npos) << small.out;
  c.vocab_size = 300;
  model::write_hf(dir_, c, model::random_hf_tensors(c, 3));
  CliResult r = inspect("'" + dir_ + "'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tokenizer: none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model: the tensors match config.json"), std::string::npos) << r.out;
  CliResult index = inspect("'" + path("model.safetensors") + "'");  // the whole checkpoint as one file
  EXPECT_NE(index.out.find("model: the tensors match config.json"), std::string::npos) << index.out;
  // An attention bias (another architecture): refused, and --check-finite still scans.
  model::HfTensors hf = model::random_hf_tensors(c, 3);
  hf["model.layers.0.self_attn.q_proj.bias"] = Tensor(DType::f32, {64});
  hf["model.norm.weight"].ptr<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  model::write_hf(dir_, c, hf);
  CliResult bias = inspect("--check-finite '" + dir_ + "'");
  EXPECT_NE(bias.out.find("refuse this checkpoint: "), std::string::npos) << bias.out;
  EXPECT_NE(bias.out.find("q_proj.bias"), std::string::npos) << bias.out;
  EXPECT_NE(bias.out.find("non-finite: "), std::string::npos) << bias.out;
  expect_clean_failure(bias, "refuse this checkpoint: ");
  expect_clean_failure(bias, "q_proj.bias");
  expect_clean_failure(bias, "float tensors hold NaN or Inf");
}

TEST_F(InspectCli, FailsCleanlyOnTruncatedFile) {
  Tensor w = random_bits(DType::bf16, {64, 64}, 13);
  io::write_safetensors(path("full.safetensors"), {{"w", w}});
  const std::string bytes = read_file(path("full.safetensors"));
  for (size_t cut : {size_t{5}, size_t{30}, bytes.size() / 2}) {
    write_file(path("model.safetensors"), bytes.substr(0, cut));
    expect_clean_failure(inspect("'" + path("model.safetensors") + "'"), "model.safetensors");
  }
}

TEST_F(InspectCli, FailsCleanlyOnCorruptedHeader) {
  Tensor w = random_bits(DType::f32, {8}, 14);
  io::write_safetensors(path("model.safetensors"), {{"w", w}});
  std::string bytes = read_file(path("model.safetensors"));
  const size_t at = bytes.find("F32");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 3, "Q32");
  write_file(path("model.safetensors"), bytes);
  expect_clean_failure(inspect("'" + path("model.safetensors") + "'"), "unknown dtype 'Q32'");
  bytes[12] = '\x01';  // control byte inside the JSON
  write_file(path("model.safetensors"), bytes);
  expect_clean_failure(inspect("'" + path("model.safetensors") + "'"), "not valid JSON");
  expect_clean_failure(inspect("'" + path("absent") + "'"), "absent");
  // A file that is no checkpoint is said alone, before any config line; a JSON file names its folder.
  write_file(path("config.json"), "{}");
  const CliResult json = inspect("'" + path("config.json") + "'");
  expect_clean_failure(json, "config.json is a JSON file, not a checkpoint: give its directory (" + dir_ + ")");
  EXPECT_TRUE(json.out.empty()) << json.out;
  write_file(path("notes.txt"), "just some text, long enough to be read as a header length");
  const CliResult text = inspect("'" + path("notes.txt") + "'");
  expect_clean_failure(text, "notes.txt: not a safetensors file");
  EXPECT_TRUE(text.out.empty()) << text.out;
}

TEST_F(InspectCli, CheckFiniteReportsNaN) {
  Tensor w = f32_tensor({2}, {1.0f, std::numeric_limits<float>::quiet_NaN()});
  io::write_safetensors(path("model.safetensors"), {{"bad.weight", w}});
  CliResult plain = inspect("'" + path("model.safetensors") + "'");  // a file: no config.json needed
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  expect_clean_failure(inspect("'" + dir_ + "'"), "need a config.json in a model directory");
  CliResult r = inspect("--check-finite '" + path("model.safetensors") + "'");
  expect_clean_failure(r, "1 of 1 float tensors hold NaN or Inf");
  EXPECT_NE(r.out.find("tensor 'bad.weight': element 1"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace twell
