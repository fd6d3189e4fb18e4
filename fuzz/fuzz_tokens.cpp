// Fuzzes the token file loaders (data/tokens.h) on arbitrary bytes written to a scratch file: as a token file
// (nanoGPT raw uint16 or llm.c shard, told apart by the magic number) with several vocabulary sizes, and as
// byte-level text. Allowed outcomes: a stream or InputError. On success every id is in [0, vocab_size), and the
// tokens written back as an llm.c shard and as raw uint16 load back unchanged.
#include <cstdint>
#include <string>
#include <vector>

#include "core/errors.h"
#include "data/tokens.h"
#include "fuzz_util.h"

namespace {

void check_ids(const mt::TokenStream& ts, int vocab) {
  for (int32_t t : ts.tokens)
    if (t < 0 || t >= vocab) mt::fuzz::property_failed("token id " + std::to_string(t) + " outside the vocabulary");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = mt::fuzz::scratch_path("in.bin");
  static const std::string copy = mt::fuzz::scratch_path("copy.bin");
  mt::fuzz::write_file(path, data, size);
  for (int vocab : {65536, 50257, 256, 2}) {
    mt::TokenStream ts;
    try {
      ts = mt::load_token_file(path, vocab);
    } catch (const mt::InputError&) {
      continue;
    }
    if (ts.tokens.empty()) mt::fuzz::property_failed("an empty token stream was accepted");
    check_ids(ts, vocab);
    if (vocab != 65536) continue;
    mt::write_llmc_shard(copy, ts.tokens);
    if (mt::load_token_file(copy, vocab).tokens != ts.tokens) mt::fuzz::property_failed("llm.c shard round trip");
    mt::write_raw_uint16(copy, ts.tokens);
    // Raw tokens may start like a shard (then they are read as one); otherwise they must read back the same.
    try {
      mt::TokenStream back = mt::load_token_file(copy, vocab);
      if (back.description.rfind("raw uint16", 0) == 0 && back.tokens != ts.tokens)
        mt::fuzz::property_failed("raw uint16 round trip");
    } catch (const mt::InputError&) {
    }
  }
  for (int vocab : {256, 255}) {
    try {
      mt::TokenStream ts = mt::load_text_file(path, vocab);
      if (ts.tokens.size() != size) mt::fuzz::property_failed("text length differs from the file's bytes");
      check_ids(ts, vocab);
    } catch (const mt::InputError&) {
    }
  }
  return 0;
}
