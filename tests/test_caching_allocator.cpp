// The caching allocator's bookkeeping on host memory (the GPU uses the same code with cudaMalloc/cudaFree):
// reuse without new backend calls, size classes, the 2x reuse limit, release on failure, the counters.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>

#include "core/caching_allocator.h"

namespace {
struct Backend {
  std::map<void*, size_t> live;
  int calls = 0;
  size_t limit = size_t(1) << 40;  // bytes the backend will hand out in all
  size_t held = 0;
  mt::CachingAllocator make() {
    return mt::CachingAllocator(
        [this](size_t n) -> void* {
          ++calls;
          if (held + n > limit) return nullptr;
          void* p = std::malloc(n);
          live.emplace(p, n);
          held += n;
          return p;
        },
        [this](void* p) {
          held -= live.at(p);
          live.erase(p);
          std::free(p);
        });
  }
};
}  // namespace

TEST_CASE("caching allocator rounds to size classes", "[alloc]") {
  using A = mt::CachingAllocator;
  CHECK(A::round_size(0) == 512);
  CHECK(A::round_size(1) == 512);
  CHECK(A::round_size(513) == 1024);
  CHECK(A::round_size(size_t(1) << 20) == (size_t(1) << 20));
  CHECK(A::round_size((size_t(1) << 20) + 1) == (size_t(2) << 20));
  CHECK(A::round_size((size_t(5) << 20) + 7) == (size_t(6) << 20));
}

TEST_CASE("caching allocator reuses freed blocks without backend calls", "[alloc]") {
  Backend b;
  {
    auto a = b.make();
    void* p = a.allocate(1000);
    void* q = a.allocate(3 << 20);
    CHECK(b.calls == 2);
    CHECK(a.bytes_in_use() == 1024 + (4 << 20));
    a.release(p);
    a.release(q);
    CHECK(a.bytes_in_use() == 0);
    CHECK(a.peak_bytes_in_use() == 1024 + (4 << 20));
    // A steady-state step makes the same requests again: same blocks, no backend call.
    CHECK(a.allocate(1000) == p);
    CHECK(a.allocate(3 << 20) == q);
    CHECK(b.calls == 2);
    CHECK(a.backend_allocations() == 2);
    // A small request does not take a block more than twice its size class.
    void* r = a.allocate(100);
    CHECK(r != p);
    CHECK(b.calls == 3);
    CHECK(a.bytes_reserved() == 1024 + (4 << 20) + 512);
    a.release(r);
    a.reset_peak();
    CHECK(a.peak_bytes_in_use() == 1024 + (4 << 20));
  }
  CHECK(b.live.size() == 2);  // blocks still handed out at destruction are not freed under their users
  for (auto& [p, n] : b.live) std::free(p);
}

TEST_CASE("caching allocator gives its cache back when the backend runs out", "[alloc]") {
  Backend b;
  b.limit = size_t(6) << 20;
  auto a = b.make();
  void* p = a.allocate(4 << 20);
  a.release(p);  // cached: 4 MiB held, 2 MiB left in the backend
  void* q = a.allocate(5 << 20);  // 6 MiB class: the cached 4 MiB block is too small and must be given back
  CHECK(q != nullptr);
  CHECK(a.bytes_reserved() == (6u << 20));
  CHECK(b.live.size() == 1);
  a.release(q);
  a.release_cached();
  CHECK(b.live.empty());
  CHECK(a.bytes_reserved() == 0);
}
