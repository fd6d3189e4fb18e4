// Tests of the data layer: token file formats and their refusals, the synthetic corpus (its sampled
// log-likelihood matches the computed entropy rate), the batcher's mesh invariance and shuffle epochs, and the
// GPT-2 BPE tokenizer on a handmade vocabulary (tokenizer_hf checks it against Hugging Face's tokenizers).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/errors.h"
#include "data/batcher.h"
#include "data/bpe_tokenizer.h"
#include "data/synthetic.h"
#include "data/tokens.h"
#include "test_support.h"

using namespace mt;
using mt::test::require_input_error;

namespace {
std::string tmp_path(const std::string& name) { return mt::test::tmp_path("data", name); }

void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void put_i32(std::vector<unsigned char>& b, size_t at, int32_t v) {
  for (int i = 0; i < 4; ++i) b[at + static_cast<size_t>(i)] = static_cast<unsigned char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xff);
}

}  // namespace

TEST_CASE("token files: raw uint16 and llm.c shards round trip") {
  std::vector<int32_t> toks = {0, 1, 255, 256, 50256, 65535, 7};
  std::string raw = tmp_path("raw.bin"), shard = tmp_path("shard.bin");
  write_raw_uint16(raw, toks);
  write_llmc_shard(shard, toks);
  CHECK(read_file(raw).size() == 2 * toks.size());
  CHECK(read_file(shard).size() == 1024 + 2 * toks.size());
  TokenStream a = load_token_file(raw, 65536);
  TokenStream b = load_token_file(shard, 65536);
  CHECK(a.tokens == toks);
  CHECK(b.tokens == toks);
  CHECK(b.description.find("llm.c") != std::string::npos);
  // Little-endian on disk, whatever the host: token 256 is bytes 00 01.
  auto bytes = read_file(raw);
  CHECK(bytes[6] == 0x00);
  CHECK(bytes[7] == 0x01);
}

TEST_CASE("token files: every malformed file is refused with InputError naming the file") {
  std::vector<int32_t> toks = {1, 2, 3, 4, 5};
  std::string p = tmp_path("bad.bin");

  require_input_error([&] { load_token_file(tmp_path("does_not_exist.bin"), 256); }, {"does_not_exist.bin"});
  require_input_error([&] { load_token_file(std::filesystem::path(p).parent_path().string(), 256); },
                      {"directory"});

  write_file(p, {});
  require_input_error([&] { load_token_file(p, 256); }, {p, "empty"});

  write_file(p, {1, 0, 2});
  require_input_error([&] { load_token_file(p, 256); }, {p, "odd length"});

  write_raw_uint16(p, {1, 2, 300, 4});
  require_input_error([&] { load_token_file(p, 256); }, {p, "300", "position 2", "vocab_size 256"});

  write_llmc_shard(p, toks);
  auto good = read_file(p);

  auto b = good;
  put_i32(b, 4, 2);  // version
  write_file(p, b);
  require_input_error([&] { load_token_file(p, 256); }, {p, "version 2"});

  b = good;
  b.pop_back();
  b.pop_back();  // one token short of the header's count
  write_file(p, b);
  require_input_error([&] { load_token_file(p, 256); }, {p, "5 tokens", "truncated"});

  b = good;
  b.push_back(9);
  b.push_back(0);  // one token too many
  write_file(p, b);
  require_input_error([&] { load_token_file(p, 256); }, {p, "trailing"});

  b.assign(good.begin(), good.begin() + 100);  // magic, but shorter than the header
  write_file(p, b);
  require_input_error([&] { load_token_file(p, 256); }, {p, "header"});

  b = good;
  put_i32(b, 8, -3);
  write_file(p, b);
  require_input_error([&] { load_token_file(p, 256); }, {p, "negative"});

  write_llmc_shard(p, {});
  require_input_error([&] { load_token_file(p, 256); }, {p, "no tokens"});

  write_llmc_shard(p, {3, 2, 1, 999});
  require_input_error([&] { load_token_file(p, 512); }, {p, "999", "position 3", "vocab_size 512"});
  CHECK(load_token_file(p, 1000).tokens.size() == 4);
}

TEST_CASE("text files are read as bytes, and vocab_size must be at least 256") {
  std::string p = tmp_path("text.txt");
  write_file(p, {'h', 'i', 0xC3, 0xA9, '\n'});  // "hi\u00e9\n" in UTF-8
  TokenStream t = load_text_file(p, 256);
  CHECK(t.tokens == std::vector<int32_t>({'h', 'i', 0xC3, 0xA9, '\n'}));
  require_input_error([&] { load_text_file(p, 128); }, {p, "256"});
  write_file(p, {});
  require_input_error([&] { load_text_file(p, 256); }, {p, "empty"});
  require_input_error([&] { load_text_file(tmp_path("missing.txt"), 256); }, {"missing.txt"});
}

TEST_CASE("synthetic corpus: chain structure, determinism and ids") {
  SyntheticCorpus a = make_synthetic_corpus(1234, 256), a2 = make_synthetic_corpus(1234, 256);
  SyntheticCorpus b = make_synthetic_corpus(1235, 256);
  CHECK(a.next == a2.next);
  CHECK(a.prob == a2.prob);
  CHECK(a.entropy_rate_nats == a2.entropy_rate_nats);
  CHECK((a.next != b.next || a.prob != b.prob));
  CHECK(a.entropy_rate_nats != b.entropy_rate_nats);
  for (int s = 0; s < a.vocab_size; ++s) {
    double sum = 0;
    for (int j = 0; j < a.successors; ++j) {
      int32_t n = a.next[static_cast<size_t>(s * a.successors + j)];
      CHECK(n >= 0);
      CHECK(n < a.vocab_size);
      CHECK(n != s);
      for (int k = 0; k < j; ++k) CHECK(a.next[static_cast<size_t>(s * a.successors + k)] != n);
      sum += a.prob[static_cast<size_t>(s * a.successors + j)];
    }
    CHECK(sum == Approx(1.0).margin(1e-12));
  }
  // Far below ln V: a model visibly learns the process.
  CHECK(a.entropy_rate_nats > 0.7);
  CHECK(a.entropy_rate_nats < 1.6);
  CHECK(a.entropy_rate_nats < 0.5 * std::log(256.0));

  auto s1 = sample_synthetic_tokens(a, 7, 5000), s2 = sample_synthetic_tokens(a, 7, 5000);
  auto s3 = sample_synthetic_tokens(a, 8, 5000), shorter = sample_synthetic_tokens(a, 7, 1234);
  CHECK(s1 == s2);
  CHECK(s1 != s3);
  CHECK(std::equal(shorter.begin(), shorter.end(), s1.begin()));  // a prefix of a longer sample
  CHECK(s1[0] == 0);
  for (int32_t t : s1) {
    REQUIRE(t >= 0);
    REQUIRE(t < 256);
  }
  require_input_error([] { make_synthetic_corpus(1, 4); }, {"vocab_size"});
}

TEST_CASE("synthetic corpus: sampled log-likelihood matches the computed entropy rate") {
  // The average of -log p(next | cur) over n sampled tokens estimates the entropy rate. Its standard error
  // is about sd(-log p) * sqrt(tau / n) ~ 0.8 * sqrt(2 / 1e6) ~ 1e-3 nats, ten times tighter than the 1%
  // tolerance, so the test checks the computed rate without being flaky (and it is deterministic anyway).
  for (int V : {64, 256}) {
    SyntheticCorpus c = make_synthetic_corpus(1234, V);
    const int64_t n = 1000000;
    auto toks = sample_synthetic_tokens(c, 1234, n);
    double nll = 0;
    for (int64_t i = 0; i + 1 < n; ++i) {
      const int32_t cur = toks[static_cast<size_t>(i)], nxt = toks[static_cast<size_t>(i + 1)];
      double p = 0;
      for (int j = 0; j < c.successors; ++j)
        if (c.next[static_cast<size_t>(cur * c.successors + j)] == nxt) p = c.prob[static_cast<size_t>(cur * c.successors + j)];
      REQUIRE(p > 0);  // every transition sampled is a transition of the chain
      nll -= std::log(p);
    }
    nll /= static_cast<double>(n - 1);
    INFO("V " << V << ": entropy rate " << c.entropy_rate_nats << " nats, sampled " << nll);
    CHECK(std::fabs(nll - c.entropy_rate_nats) < 0.01 * c.entropy_rate_nats);
    // Printed for docs/data.md: the entropy rate of the default config's corpus.
    std::printf("synthetic corpus seed 1234 vocab %d: entropy rate %.6f nats (sampled %.6f; ln V = %.4f)\n", V,
                c.entropy_rate_nats, nll, std::log(static_cast<double>(V)));
  }
}

TEST_CASE("batcher: sequential windows follow the contract formula") {
  std::vector<int32_t> toks(1000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>(i);
  const int T = 16, GB = 8;
  Batcher b(&toks, T, GB, DataOrder::Sequential, 1);
  const int64_t N = 1000, M = N - T - 1;
  for (int64_t s = 0; s < 20; ++s)
    for (int64_t g = 0; g < GB; ++g) CHECK(b.window_offset(s, g) == ((s * GB + g) * T) % M);
  // Targets are inputs shifted by one, and inputs start at the window offset.
  std::vector<int32_t> in(GB * T), tg(GB * T);
  b.fill(3, 0, GB, in.data(), tg.data());
  for (int g = 0; g < GB; ++g) {
    CHECK(in[static_cast<size_t>(g * T)] == b.window_offset(3, g));
    for (int t = 0; t < T; ++t) CHECK(tg[static_cast<size_t>(g * T + t)] == in[static_cast<size_t>(g * T + t)] + 1);
  }
}

TEST_CASE("batcher: wrap-around stays in bounds and follows the modulus") {
  std::vector<int32_t> toks(50);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>(i);
  const int T = 8, GB = 3;
  Batcher b(&toks, T, GB, DataOrder::Sequential, 1);
  const int64_t M = 50 - T - 1;  // 41
  std::vector<int32_t> in(GB * T), tg(GB * T);
  bool wrapped = false;
  for (int64_t s = 0; s < 40; ++s) {
    b.fill(s, 0, GB, in.data(), tg.data());
    for (int g = 0; g < GB; ++g) {
      int64_t o = b.window_offset(s, g);
      CHECK(o == ((s * GB + g) * T) % M);
      CHECK(o + T < 50);  // the last target tokens[o + T] exists
      if ((s * GB + g) * T >= M) wrapped = true;
      for (int t = 0; t < T; ++t) {
        CHECK(in[static_cast<size_t>(g * T + t)] == o + t);
        CHECK(tg[static_cast<size_t>(g * T + t)] == o + t + 1);
      }
    }
  }
  CHECK(wrapped);
  // Large steps do not overflow.
  int64_t big = 1000000000000LL;
  CHECK(b.window_offset(big, 2) == static_cast<int64_t>((static_cast<unsigned __int128>(big * GB + 2) * T) % M));
}

TEST_CASE("batcher: any split of a global batch reads the same tokens") {
  std::vector<int32_t> toks = sample_synthetic_tokens(make_synthetic_corpus(3, 64), 3, 4000);
  const int T = 32, GB = 8;
  for (DataOrder order : {DataOrder::Sequential, DataOrder::Shuffle}) {
    INFO(name_of(order));
    Batcher whole(&toks, T, GB, order, 42);
    for (int64_t step : {0, 1, 5, 17, 40}) {
      std::vector<int32_t> in(GB * T), tg(GB * T);
      whole.fill(step, 0, GB, in.data(), tg.data());
      for (int t = 0; t < GB * T; ++t)
        if (t % T != T - 1) CHECK(tg[static_cast<size_t>(t)] == in[static_cast<size_t>(t + 1)]);
      // Every micro-batch size dividing the batch, in fresh batchers (as on other ranks) and in a shared one.
      for (int mb : {1, 2, 4}) {
        Batcher other(&toks, T, GB, order, 42);
        std::vector<int32_t> in2(GB * T), tg2(GB * T);
        for (int first = GB - mb; first >= 0; first -= mb)  // reversed order: no hidden state may matter
          other.fill(step, first, mb, in2.data() + first * T, tg2.data() + first * T);
        CHECK(in2 == in);
        CHECK(tg2 == tg);
      }
      std::vector<int32_t> a(GB * T), at(GB * T);
      Batcher split(&toks, T, GB, order, 42);
      split.fill(step, 0, 4, a.data(), at.data());
      split.fill(step + 100, 0, 1, a.data(), at.data());  // touch another epoch in between
      split.fill(step, 0, 4, a.data(), at.data());
      split.fill(step, 4, 4, a.data() + 4 * T, at.data() + 4 * T);
      CHECK(a == in);
      CHECK(at == tg);
    }
  }
}

TEST_CASE("batcher: shuffle visits every window exactly once per epoch") {
  std::vector<int32_t> toks(1000, 0);
  const int T = 10, GB = 7;
  const int64_t K = (1000 - T - 1) / T;  // 98 windows per epoch
  Batcher b(&toks, T, GB, DataOrder::Shuffle, 99);
  Batcher c(&toks, T, GB, DataOrder::Shuffle, 100);
  std::vector<int64_t> epoch0, epoch1, other0;
  for (int64_t w = 0; w < 3 * K; ++w) {
    int64_t o = b.window_offset(w / GB, w % GB);
    REQUIRE(o % T == 0);
    REQUIRE(o >= 0);
    REQUIRE(o + T + 1 <= 1000);
    if (w < K) epoch0.push_back(o / T);
    else if (w < 2 * K) epoch1.push_back(o / T);
    if (w < K) other0.push_back(c.window_offset(w / GB, w % GB) / T);
    if (w % K == K - 1) {
      std::vector<int64_t> seen;
      for (int64_t v = w - K + 1; v <= w; ++v) seen.push_back(b.window_offset(v / GB, v % GB) / T);
      std::sort(seen.begin(), seen.end());
      for (int64_t k = 0; k < K; ++k) REQUIRE(seen[static_cast<size_t>(k)] == k);
    }
  }
  CHECK(epoch0 != epoch1);  // each epoch has its own order
  CHECK(epoch0 != other0);  // and the seed matters
  std::vector<int64_t> identity(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) identity[static_cast<size_t>(k)] = k;
  CHECK(epoch0 != identity);
}

// A bad data.order is refused where the config is read (tests/test_config.cpp).
TEST_CASE("batcher: refuses streams too short to read") {
  std::vector<int32_t> toks(17, 1);
  Batcher short_seq(&toks, 16, 4, DataOrder::Sequential, 1);  // built fine (an unused stream may be short) ...
  std::vector<int32_t> in(4 * 16), tg(4 * 16);
  require_input_error([&] { short_seq.fill(0, 0, 4, in.data(), tg.data()); }, {"17 tokens", "seq_len 16"});
  require_input_error([&] { short_seq.window_offset(0, 0); }, {"17 tokens", "seq_len 16"});  // ... but never read
  std::vector<int32_t> none;
  Batcher empty(&none, 16, 4, DataOrder::Sequential, 1);
  require_input_error([&] { empty.window_offset(0, 0); }, {"0 tokens"});
  std::vector<int32_t> ok(18, 1);
  Batcher b(&ok, 16, 4, DataOrder::Sequential, 1);
  CHECK(b.window_offset(5, 3) == 0);  // N - T - 1 = 1: the only window
  Batcher short_shuffle(&ok, 16, 4, DataOrder::Shuffle, 1);
  require_input_error([&] { short_shuffle.window_offset(0, 0); }, {"shuffle", "18 tokens"});
  std::vector<int32_t> ok2(33, 1);
  Batcher s(&ok2, 16, 4, DataOrder::Shuffle, 1);
  CHECK(s.window_offset(7, 1) == 0);
}

namespace {
// GPT-2's bytes_to_unicode, written again here: byte b's character as UTF-8.
std::string byte_char(int b) {
  static std::vector<std::string> chars = [] {
    std::vector<std::string> out(256);
    int next = 0;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
      const int cp = printable ? c : 256 + next++;
      out[c] = cp < 0x80 ? std::string(1, char(cp))
                         : std::string{char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    }
    return out;
  }();
  return chars[b];
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

// A vocabulary of the 256 bytes (id = byte; "zz" in skip_byte's place), then Gt, he, Gthe (G: the space's
// character) and <|endoftext|>; merges G t, h e, Gt he.
std::string write_tokenizer(const std::string& dir, int skip_byte = -1) {
  std::filesystem::create_directories(dir);
  const std::string sp = byte_char(' ');
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b)
    vocab += json_string(b == skip_byte ? std::string("zz") : byte_char(b)) + ": " + std::to_string(b) + ", ";
  vocab += json_string(sp + "t") + ": 256, \"he\": 257, " + json_string(sp + "the") + ": 258, \"<|endoftext|>\": 259}";
  std::ofstream(dir + "/vocab.json") << vocab;
  std::ofstream(dir + "/merges.txt") << "#version: 0.2\n" << sp << " t\nh e\n" << sp << "t he\n";
  return dir + "/vocab.json";
}
}  // namespace

TEST_CASE("GPT-2 tokenizer: GPT-2's pre-tokenizer pieces, merges by rank, bytes back", "[tokenizer]") {
  const BpeTokenizer t = BpeTokenizer::load(write_tokenizer(tmp_path("bpe")));
  CHECK(t.vocab_size() == 260);
  using V = std::vector<int32_t>;
  CHECK(t.encode(" the") == V{258});                      // G t -> Gt, h e -> he, Gt he -> Gthe
  CHECK(t.encode("the") == V{'t', 257});                  // no space: t stays alone
  CHECK(t.encode("he's") == V{257, '\'', 's'});          // a contraction is a piece of its own
  CHECK(t.encode("a  b") == V{'a', ' ', ' ', 'b'});       // the second space joins b, the first stays alone
  CHECK(t.encode("x\n\ny") == V{'x', '\n', '\n', 'y'});  // \s+(?!\S), then \s+
  CHECK(t.encode("7up!?") == V{'7', 'u', 'p', '!', '?'});
  CHECK(t.encode("\xC3\xA9") == V{0xC3, 0xA9});             // a letter's two bytes
  CHECK(t.encode("a<|endoftext|> the") == V{'a', 259, 258});
  CHECK(t.decode({258, '\'', 's', 259}) == " the's<|endoftext|>");
  CHECK(t.decode(t.encode("ROMEO: I'll go -- \xC3\xA9t\xC3\xA9!\n")) == "ROMEO: I'll go -- \xC3\xA9t\xC3\xA9!\n");
  require_input_error([&] { t.decode({260}); }, {"token id 260", "260 tokens"});
  // A folder holding vocab.json and merges.txt reads the same.
  CHECK(BpeTokenizer::load(tmp_path("bpe")).encode(" the the") == V{258, 258});
}

TEST_CASE("GPT-2 tokenizer: malformed files are refused naming the file", "[tokenizer]") {
  require_input_error([&] { BpeTokenizer::load(write_tokenizer(tmp_path("bpe_no_byte"), 'q')); },
                      {"bpe_no_byte", "not byte-level", "byte 113"});
  const std::string dir = tmp_path("bpe_bad");
  write_tokenizer(dir);
  std::ofstream(dir + "/vocab.json") << "{\"a\": 0,}";
  require_input_error([&] { BpeTokenizer::load(dir + "/vocab.json"); }, {"bpe_bad/vocab.json", "not valid JSON"});
  write_tokenizer(dir);
  std::filesystem::remove(dir + "/merges.txt");
  require_input_error([&] { BpeTokenizer::load(dir + "/vocab.json"); }, {"merges.txt"});
  std::ofstream(dir + "/tokenizer.json") << "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}";
  require_input_error([&] { BpeTokenizer::load(dir); }, {"tokenizer.json", "BPE"});
  // Another text pipeline would give other ids without a word: Llama 3's split pattern, a prefix space.
  const std::string model = "\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}";
  std::ofstream(dir + "/tokenizer.json") << "{" << model << ", \"pre_tokenizer\": {\"type\": \"Sequence\", "
                                            "\"pretokenizers\": []}}";
  require_input_error([&] { BpeTokenizer::load(dir); }, {"tokenizer.json", "pre_tokenizer is not GPT-2's"});
  std::ofstream(dir + "/tokenizer.json") << "{" << model << ", \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
                                            "\"add_prefix_space\": true}}";
  require_input_error([&] { BpeTokenizer::load(dir); }, {"pre_tokenizer is not GPT-2's"});
  std::ofstream(dir + "/tokenizer.json") << "{" << model << ", \"normalizer\": {\"type\": \"Lowercase\"}, "
                                            "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}";
  require_input_error([&] { BpeTokenizer::load(dir); }, {"normalizer"});
  require_input_error([&] { BpeTokenizer::load(tmp_path("no_such_tokenizer.json")); }, {"no_such_tokenizer.json"});
}
