// CachingAllocator bookkeeping (caching_allocator.h). Host code only, compiled in every build, so its unit
// test runs without a GPU.
#include "core/caching_allocator.h"

#include <utility>

#include "core/check.h"

namespace mt {

CachingAllocator::CachingAllocator(std::function<void*(size_t)> allocate, std::function<void(void*)> release)
    : allocate_(std::move(allocate)), release_(std::move(release)) {}

CachingAllocator::~CachingAllocator() { release_cached(); }

size_t CachingAllocator::round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20, kSmallLimit = size_t(1) << 20;
  if (bytes == 0) bytes = 1;
  if (bytes <= kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lk(mu_);
  void* p = nullptr;
  size_t got = size;
  auto it = cached_.lower_bound(size);
  if (it != cached_.end() && it->first <= 2 * size) {
    got = it->first;
    p = it->second;
    cached_.erase(it);
  } else {
    p = allocate_(size);
    if (!p && !cached_.empty()) {  // fragmented: give the cache back and try once more
      for (auto& [s, q] : cached_) release_(q), reserved_ -= s;
      cached_.clear();
      p = allocate_(size);
    }
    MT_CHECK(p != nullptr,
             "out of device memory allocating {} bytes ({} in use, peak {}, {} held from the driver)", bytes,
             in_use_, peak_, reserved_);
    reserved_ += size;
    ++backend_allocations_;
  }
  handed_out_.emplace(p, got);
  in_use_ += got;
  if (in_use_ > peak_) peak_ = in_use_;
  return p;
}

void CachingAllocator::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = handed_out_.find(p);
  MT_CHECK(it != handed_out_.end(), "release of a pointer this allocator did not hand out");
  in_use_ -= it->second;
  cached_.emplace(it->second, p);
  handed_out_.erase(it);
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [s, q] : cached_) release_(q), reserved_ -= s;
  cached_.clear();
}

}  // namespace mt
