// A streaming 64-bit checksum of a byte stream: FNV-1a over little-endian 8-byte words, each step folded with a
// shift, the tail bytes one by one and the length mixed in at the end. Fast enough to check gigabytes at the
// speed of memory; catches truncation, bit flips and misplaced blocks. Not a cryptographic hash. The value does
// not depend on how the stream is split into update() calls.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mt {

class Checksum64 {
 public:
  void update(const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    total_ += n;
    while (n > 0 && pending_ > 0 && pending_ < 8) {  // complete a word started by an earlier call
      buf_[pending_++] = *p++, --n;
      if (pending_ == 8) word(buf_), pending_ = 0;
    }
    for (; n >= 8; p += 8, n -= 8) word(p);
    std::memcpy(buf_ + pending_, p, n);
    pending_ += n;
  }
  uint64_t value() const {
    uint64_t h = h_;
    for (size_t i = 0; i < pending_; ++i) h = (h ^ buf_[i]) * kPrime;
    return h ^ total_;
  }

 private:
  static constexpr uint64_t kPrime = 0x100000001b3ull;
  void word(const unsigned char* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h_ = (h_ ^ w) * kPrime;
    h_ ^= h_ >> 29;
  }
  uint64_t h_ = 0xcbf29ce484222325ull, total_ = 0;
  unsigned char buf_[8] = {};
  size_t pending_ = 0;
};

}  // namespace mt
