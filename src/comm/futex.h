// Sleeping on a 32-bit word until another thread or process changes it (Linux futex). The word may live in memory
// shared between processes (the shared-memory backend's bells), so the calls are not FUTEX_PRIVATE.
#pragma once
#include <atomic>
#include <cstdint>

namespace mt {

// Sleeps while *word == expected, at most timeout_us (< 0: no limit). Returns at once if the word differs;
// may also return spuriously, so callers re-check their condition.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, double timeout_us);

// Wakes every thread sleeping on *word (in any process that maps it).
void futex_wake_all(std::atomic<uint32_t>* word);

// The usual pattern: bump the word, then wake its sleepers.
inline void ring(std::atomic<uint32_t>* bell) {
  bell->fetch_add(1, std::memory_order_acq_rel);
  futex_wake_all(bell);
}

}  // namespace mt
