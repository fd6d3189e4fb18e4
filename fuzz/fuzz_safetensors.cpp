// Fuzzes the safetensors reader (model/safetensors.h) on arbitrary bytes (SafetensorsFile::from_bytes, which holds
// every check of open()). Allowed outcomes: a validated file or InputError. On success every tensor's bytes are
// read (the float ones converted), and the tensors of dtypes the writer knows are written to a scratch file and
// re-opened: the same names, shapes, metadata and bytes must come back.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/errors.h"
#include "fuzz_util.h"
#include "model/safetensors.h"

namespace {

bool writer_dtype(const std::string& s, mt::DType& t) {
  if (s == "F32") t = mt::DType::F32;
  else if (s == "F64") t = mt::DType::F64;
  else if (s == "BF16") t = mt::DType::BF16;
  else if (s == "F16") t = mt::DType::F16;
  else if (s == "I32") t = mt::DType::I32;
  else return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string copy = mt::fuzz::scratch_path("copy.safetensors");
  mt::SafetensorsFile f;
  try {
    f = mt::SafetensorsFile::from_bytes("fuzz-input", std::vector<char>(data, data + size));
  } catch (const mt::InputError&) {
    return 0;
  }

  std::vector<mt::SafetensorOut> out;
  bool writable = true;
  for (const mt::SafetensorInfo& t : f.tensors()) {
    if (f.find(t.name) != &t) mt::fuzz::property_failed("find() does not return the tensor of that name");
    const int64_t n = mt::SafetensorsFile::numel(t);
    if (n < 0 || t.end < t.begin) mt::fuzz::property_failed("an accepted tensor has an invalid size");
    const unsigned char* bytes = f.data(t);
    volatile unsigned sum = 0;  // touch every byte (ASan checks the range)
    for (uint64_t i = 0; i < t.end - t.begin; ++i) sum = sum + bytes[i];
    if (t.dtype == "F32" || t.dtype == "F64" || t.dtype == "BF16" || t.dtype == "F16") {
      std::vector<double> d(static_cast<size_t>(n));
      std::vector<float> s(static_cast<size_t>(n));
      f.read_as_double(t, d.data(), n);
      f.read_as_float(t, s.data(), n);
    } else {
      try {  // not a float: must be refused
        float x;
        f.read_as_float(t, &x, n);
        mt::fuzz::property_failed("read_as_float accepted dtype " + t.dtype);
      } catch (const mt::InputError&) {
      }
    }
    mt::DType dt;
    if (!writer_dtype(t.dtype, dt)) writable = false;
    out.push_back({t.name, dt, t.shape, bytes});
  }
  if (!writable) return 0;

  try {
    mt::write_safetensors(copy, out, f.metadata());
  } catch (const mt::InputError&) {
    return 0;  // names the writer refuses (e.g. "")
  }
  mt::SafetensorsFile g;
  try {
    g = mt::SafetensorsFile::open(copy);
  } catch (const mt::InputError& e) {
    mt::fuzz::property_failed(std::string("a written file is refused: ") + e.what());
  }
  if (g.metadata() != f.metadata()) mt::fuzz::property_failed("metadata changed in a round trip");
  if (g.tensors().size() != f.tensors().size()) mt::fuzz::property_failed("tensor count changed in a round trip");
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const mt::SafetensorInfo &a = f.tensors()[i], &b = g.tensors()[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.end - a.begin != b.end - b.begin ||
        std::memcmp(f.data(a), g.data(b), a.end - a.begin) != 0)
      mt::fuzz::property_failed("tensor '" + a.name + "' changed in a round trip");
  }
  return 0;
}
