// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): a counter-based RNG. Any
// element's random value is a pure function of (key, counter), so each rank can draw exactly its own shard
// of a parameter and every mesh starts from the same full weights.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace mt {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

inline PhiloxCounter philox4x32(PhiloxCounter c, PhiloxKey k) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(M0) * c[0];
    uint64_t p1 = static_cast<uint64_t>(M1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += W0;
    k[1] += W1;
  }
  return c;
}

// FNV-1a: a stable 64-bit hash of a parameter's global name (part of the RNG key).
inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// A uniform in (0, 1) from 32 random bits (never 0, so log() is safe).
inline double uniform_open01(uint32_t bits) { return (static_cast<double>(bits) + 0.5) * (1.0 / 4294967296.0); }

// Element `index` of the stream (seed, stream): a standard normal via Box-Muller on one Philox block.
inline double philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  PhiloxKey key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  PhiloxCounter ctr{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), static_cast<uint32_t>(stream),
                    static_cast<uint32_t>(stream >> 32)};
  PhiloxCounter r = philox4x32(ctr, key);
  double u1 = uniform_open01(r[0]), u2 = uniform_open01(r[1]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Element `index` of the stream (seed, stream): 32 uniform random bits.
inline uint32_t philox_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  PhiloxKey key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  PhiloxCounter ctr{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), static_cast<uint32_t>(stream),
                    static_cast<uint32_t>(stream >> 32)};
  return philox4x32(ctr, key)[0];
}

}  // namespace mt
