// Tests of the safetensors reader and writer (and the O_DIRECT file writer under it): round trips of every written
// dtype with metadata, the exact byte layout the reference implementation writes (checked without Python), every
// malformed header refused with InputError naming the file and tensor, and random truncations / byte flips that must
// never crash.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/direct_file.h"
#include "core/dtype.h"
#include "core/errors.h"
#include "core/json.h"
#include "core/philox.h"
#include "model/safetensors.h"
#include "test_support.h"

using namespace mt;
using mt::test::require_input_error;

namespace {
std::string tmp_path(const std::string& name) { return mt::test::tmp_path("st", name); }

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file from a header text and a data section, with the true header length.
std::string make_file(const std::string& header, const std::string& data) { return u64le(header.size()) + header + data; }

std::string valid_file_bytes() {
  std::vector<float> w = {1.5f, -2.25f, 3.0f, 0.125f, 1e-3f, -7.0f};
  std::vector<uint16_t> h = {float_to_bf16(0.5f), float_to_bf16(-3.0f)};
  std::vector<int32_t> ids = {1, -2, 3};
  std::string p = tmp_path("valid.safetensors");
  write_safetensors(p,
                    {{"w", DType::F32, {2, 3}, w.data()},
                     {"h", DType::BF16, {2}, h.data()},
                     {"ids", DType::I32, {3}, ids.data()}},
                    {{"format", "pt"}});
  return read_file(p);
}

}  // namespace

TEST_CASE("safetensors: round trip of F32, BF16, F16, F64 and I32 tensors with metadata") {
  std::vector<float> f32 = {0.0f, -1.0f, 3.14159f, 1e-30f, 65504.0f, -0.0f};
  std::vector<float> ref = {0.1f, -2.5f, 3.0f, 1e-3f, 1000.5f, -7.75f, 0.0f, 42.0f};
  std::vector<uint16_t> bf16, f16;
  for (float x : ref) {
    bf16.push_back(float_to_bf16(x));
    f16.push_back(float_to_fp16(x));
  }
  std::vector<double> f64 = {1.0 / 3.0, -2.0, 1e-300};
  std::vector<int32_t> i32 = {7, -8, 2147483647, -2147483647 - 1};
  float scalar = 2.5f;
  std::string p = tmp_path("round.safetensors");
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "quote \" backslash \\ newline \n é"}};
  write_safetensors(p,
                    {{"h.0.attn.c_attn.weight", DType::F32, {2, 3}, f32.data()},
                     {"bf", DType::BF16, {2, 2, 2}, bf16.data()},
                     {"half", DType::F16, {8}, f16.data()},
                     {"dbl", DType::F64, {3}, f64.data()},
                     {"ints", DType::I32, {4}, i32.data()},
                     {"scalar", DType::F32, {}, &scalar},
                     {"empty", DType::F32, {0, 5}, nullptr}},
                    meta);
  CHECK_FALSE(std::filesystem::exists(p + ".tmp"));
  SafetensorsFile f = SafetensorsFile::open(p);
  CHECK(f.metadata() == meta);
  REQUIRE(f.tensors().size() == 7);
  CHECK(f.tensors()[0].name == "h.0.attn.c_attn.weight");  // header order is kept
  CHECK(f.find("missing") == nullptr);

  const SafetensorInfo* w = f.find("h.0.attn.c_attn.weight");
  REQUIRE(w);
  CHECK(w->dtype == "F32");
  CHECK(w->shape == std::vector<int64_t>({2, 3}));
  std::vector<float> out(6);
  f.read_as_float(*w, out.data(), 6);
  CHECK(std::memcmp(out.data(), f32.data(), 6 * sizeof(float)) == 0);  // bit-exact, -0.0 included

  std::vector<float> o8(8);
  f.read_as_float(*f.find("bf"), o8.data(), 8);
  for (int i = 0; i < 8; ++i) CHECK(o8[static_cast<size_t>(i)] == bf16_to_float(bf16[static_cast<size_t>(i)]));
  std::vector<double> d8(8);
  f.read_as_double(*f.find("half"), d8.data(), 8);
  for (int i = 0; i < 8; ++i) CHECK(d8[static_cast<size_t>(i)] == fp16_to_float(f16[static_cast<size_t>(i)]));
  std::vector<double> d3(3);
  f.read_as_double(*f.find("dbl"), d3.data(), 3);
  CHECK(d3 == f64);
  float sc = 0;
  CHECK(SafetensorsFile::numel(*f.find("scalar")) == 1);
  f.read_as_float(*f.find("scalar"), &sc, 1);
  CHECK(sc == 2.5f);
  CHECK(SafetensorsFile::numel(*f.find("empty")) == 0);
  f.read_as_float(*f.find("empty"), nullptr, 0);

  const SafetensorInfo* ints = f.find("ints");
  REQUIRE(ints);
  CHECK(ints->dtype == "I32");
  std::vector<int32_t> iout(4);
  std::memcpy(iout.data(), f.data(*ints), 16);
  CHECK(iout == i32);
  require_input_error([&] { f.read_as_float(*ints, out.data(), 4); }, {p, "ints", "I32"});
  require_input_error([&] { f.read_as_float(*w, out.data(), 5); }, {p, "h.0.attn.c_attn.weight", "6 elements"});
}

TEST_CASE("safetensors: a write that fails says why (the errno text) and leaves no file behind") {
  // The temporary file the writer opens is a link to /dev/full, whose writes fail with ENOSPC: a full disk.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_full_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "w.safetensors").string();
  fs::create_symlink("/dev/full", path + ".tmp");
  const float v[4] = {1, 2, 3, 4};
  std::string what;
  try {
    write_safetensors(path, {{"w", DType::F32, {4}, v}}, {});
  } catch (const std::exception& e) {
    what = e.what();
  }
  CHECK_THAT(what, Catch::Matchers::Contains("w.safetensors.tmp") && Catch::Matchers::Contains("No space left on device"));
  CHECK_FALSE(fs::exists(fs::symlink_status(path + ".tmp")));
  CHECK_FALSE(fs::exists(path));
  fs::remove_all(dir);
}

TEST_CASE("DirectFileWriter: a file of any length holds exactly the bytes written, past the page cache or through it") {
  // Lengths at the edges of the 4096-byte alignment and the 8 MiB buffer, written in uneven pieces, on the temporary
  // directory's filesystem (O_DIRECT on a disk: the padded tail cut back) and on /dev/shm (tmpfs) where there is
  // one, whichever way its kernel takes the file.
  namespace fs = std::filesystem;
  const size_t kMiB8 = size_t(8) << 20;
  std::vector<std::string> dirs = {fs::temp_directory_path().string()};
  if (fs::is_directory("/dev/shm")) dirs.push_back("/dev/shm");
  for (const std::string& dir : dirs)
    for (size_t n : {size_t(0), size_t(1), size_t(4095), size_t(4096), size_t(4097), kMiB8 - 1, kMiB8,
                     kMiB8 + 4097}) {
      std::string bytes(n, '\0');
      for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
      const std::string path = dir + "/meshtrain_direct_" + std::to_string(::getpid()) + "_" + std::to_string(n);
      DirectFileWriter w(path);
      REQUIRE(w.ok());
      for (size_t at = 0, piece = 1; at < n; at += piece, piece = piece * 3 + 7)
        REQUIRE(w.write(bytes.data() + at, std::min(piece, n - at)));
      INFO(dir << ", " << n << " bytes, " << (w.direct() ? "O_DIRECT" : "page cache"));
      CHECK(w.close());
      CHECK(w.bytes() == n);
      CHECK(read_file(path) == bytes);
      fs::remove(path);
    }
}

TEST_CASE("safetensors: the written layout is the reference implementation's") {
  // What Python's safetensors.torch.save_file({"a": torch.tensor([1.0, 2.0])}, f, metadata={"format": "pt"})
  // writes: compact JSON with __metadata__ first, padded with spaces to a multiple of 8, then the raw data.
  std::string header = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  while (header.size() % 8) header += ' ';
  std::string expected = u64le(header.size()) + header;
  float a[2] = {1.0f, 2.0f};
  expected.append(reinterpret_cast<const char*>(a), 8);
  std::string p = tmp_path("golden.safetensors");
  write_safetensors(p, {{"a", DType::F32, {2}, a}}, {{"format", "pt"}});
  CHECK(read_file(p) == expected);

  // A larger file: the structural rules a strict reader (the reference one) enforces.
  std::string bytes = valid_file_bytes();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  CHECK(n % 8 == 0);
  REQUIRE(8 + n <= bytes.size());
  std::string text = bytes.substr(8, n);
  CHECK(text.front() == '{');
  size_t last = text.find_last_not_of(' ');
  CHECK(text[last] == '}');
  Json h = parse_json(text);
  REQUIRE(h.is_object());
  CHECK(h.object.front().first == "__metadata__");
  uint64_t pos = 0;
  for (size_t i = 1; i < h.object.size(); ++i) {
    const Json& e = h.object[i].second;
    REQUIRE(e.get("data_offsets"));
    CHECK(e.get("data_offsets")->array[0].integer == pos);  // packed back to back, no holes
    pos = e.get("data_offsets")->array[1].integer;
  }
  CHECK(pos == bytes.size() - 8 - n);  // the data section holds exactly the tensors
}

TEST_CASE("safetensors: every malformed file is refused with InputError naming the file and tensor") {
  std::string p = tmp_path("bad.safetensors");
  auto refuse = [&](const std::string& bytes, std::vector<std::string> parts) {
    write_file(p, bytes);
    parts.insert(parts.begin(), p);
    require_input_error([&] { SafetensorsFile::open(p); }, parts);
  };
  const std::string d8(8, '\0');  // 8 bytes of data: two F32
  auto one = [](const std::string& entry) { return std::string("{\"t\":") + entry + "}"; };

  require_input_error([&] { SafetensorsFile::open(tmp_path("nope.safetensors")); }, {"nope.safetensors"});
  refuse("", {"shorter than"});
  refuse("abc", {"shorter than"});
  refuse(u64le(0) + d8, {"header length is 0"});
  refuse(u64le(100) + "{}", {"past the end"});
  refuse(u64le(~0ull) + "{}", {"header length"});
  refuse(make_file("{\"t\":", ""), {"not valid JSON"});
  refuse(make_file("{\"t\":{}} x", ""), {"not valid JSON"});
  refuse(make_file("{\"a\":1,\"a\":2}", ""), {"duplicate"});
  refuse(make_file("[1,2]", ""), {"not a JSON object"});
  refuse(make_file(std::string(200, '[') + std::string(200, ']'), ""), {"not valid JSON"});  // depth cap
  refuse(make_file(one("3"), ""), {"'t'", "not an object"});
  refuse(make_file(one(R"({"shape":[2],"data_offsets":[0,8]})"), d8), {"'t'", "dtype"});
  refuse(make_file(one(R"({"dtype":"F32","data_offsets":[0,8]})"), d8), {"'t'", "shape"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[2]})"), d8), {"'t'", "data_offsets"});
  refuse(make_file(one(R"({"dtype":32,"shape":[2],"data_offsets":[0,8]})"), d8), {"'t'", "dtype", "not a string"});
  refuse(make_file(one(R"({"dtype":"F32","shape":"2","data_offsets":[0,8]})"), d8), {"'t'", "shape"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[2],"data_offsets":"0,8"})"), d8), {"'t'", "data_offsets"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,9]})"), d8), {"'t'", "data_offsets"});
  refuse(make_file(one(R"({"dtype":"Q4","shape":[2],"data_offsets":[0,8]})"), d8), {"'t'", "unknown dtype 'Q4'"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), d8), {"'t'", "shape[0]"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"), d8), {"'t'", "shape[0]"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[1e1],"data_offsets":[0,8]})"), d8), {"'t'", "shape[0]"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,-8]})"), d8), {"'t'", "data_offsets[1]"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0.5,8]})"), d8), {"'t'", "data_offsets[0]"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"), d8), {"'t'", "begin 8 > end 0"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), d8), {"'t'", "past the data section"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), d8), {"'t'", "[3]", "F32"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]})"), d8), {"'t'"});
  refuse(make_file(one(R"({"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]})"), d8), {"'t'", "shape[0]"});
  refuse(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8),
         {"overlaps", "'a'", "'b'"});
  refuse(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8), {"'a'", "hole"});
  refuse(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8), {"trailing"});
  refuse(make_file(R"({"__metadata__":["x"]})", ""), {"__metadata__", "not an object"});
  refuse(make_file(R"({"__metadata__":{"k":1}})", ""), {"__metadata__", "'k'", "not a string"});
  refuse(make_file(R"({"__metadata__":{"k":"v"},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})" "\x01", d8),
         {"not valid JSON"});

  // And the well-formed neighbours of those cases are accepted: padding, empty tensors, empty header object.
  CHECK(SafetensorsFile::open((write_file(p, make_file("{}        ", "")), p)).tensors().empty());
  write_file(p, make_file(R"({"__metadata__":{},"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8));
  CHECK(SafetensorsFile::open(p).tensors().size() == 2);
}

TEST_CASE("safetensors: random truncations and byte flips never crash the reader") {
  // Every mutated file must either open (and then every float tensor must read) or throw InputError; the
  // test would crash or throw something else on an out-of-bounds read or an unchecked assumption.
  const std::string good = valid_file_bytes();
  std::string p = tmp_path("fuzz.safetensors");
  int opened = 0, refused = 0;
  for (uint64_t trial = 0; trial < 3000; ++trial) {
    std::string b = good;
    uint32_t kind = philox_bits(77, trial, 0) % 3;
    if (kind == 0) {
      b.resize(philox_bits(77, trial, 1) % (good.size() + 1));
    } else {
      int flips = 1 + static_cast<int>(philox_bits(77, trial, 1) % 4);
      for (int k = 0; k < flips; ++k) {
        size_t at = philox_bits(77, trial, 2 + 2 * static_cast<uint64_t>(k)) % b.size();
        if (kind == 1 && at > 8 + 40) at = 8 + at % 40;  // mostly the header length and the JSON's start
        b[at] = static_cast<char>(philox_bits(77, trial, 3 + 2 * static_cast<uint64_t>(k)) & 0xff);
      }
    }
    write_file(p, b);
    try {
      SafetensorsFile f = SafetensorsFile::open(p);
      for (const auto& t : f.tensors()) {
        if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16" && t.dtype != "F64") continue;
        std::vector<double> out(static_cast<size_t>(SafetensorsFile::numel(t)));
        f.read_as_double(t, out.data(), SafetensorsFile::numel(t));
      }
      ++opened;
    } catch (const InputError& e) {
      REQUIRE(std::string(e.what()).find(p) != std::string::npos);
      ++refused;
    }
  }
  INFO("opened " << opened << ", refused " << refused);
  CHECK(refused > 1000);
  CHECK(opened > 10);  // flips inside tensor data leave a valid file
}

TEST_CASE("strict JSON parser") {
  Json j = parse_json(R"( {"a":[1,-2,3.5,1e3,true,false,null],"s":"x\u00e9\ud83d\ude00\n","u":18446744073709551615} )");
  REQUIRE(j.is_object());
  const Json* a = j.get("a");
  REQUIRE(a);
  CHECK(a->array[0].is_uint());
  CHECK(a->array[1].signed_integer == -2);
  CHECK_FALSE(a->array[1].is_uint());
  CHECK_FALSE(a->array[2].is_integer);
  CHECK_FALSE(a->array[3].is_integer);
  CHECK(a->array[3].number == 1000.0);
  CHECK(j.get("s")->string == "x\xc3\xa9\xf0\x9f\x98\x80\n");
  CHECK(j.get("u")->integer == 18446744073709551615ull);
  for (const char* bad : {"", "{", "{\"a\":1,}", "[1,]", "01", "1.", "-", "NaN", "\"\\x\"", "\"a\x01\"", "\"\xff\"",
                          "\"\\ud800\"", "{\"a\" 1}", "tru", "[1] 2", "\"\xc0\xaf\""})
    CHECK_THROWS_AS(parse_json(bad), JsonError);
  CHECK(json_quote("a\"b\\c\n\x01") == "\"a\\\"b\\\\c\\n\\u0001\"");
}
