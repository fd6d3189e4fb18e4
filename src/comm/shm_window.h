// The layout of the shared-memory transport's MPI-3 window, as its collectives (shm_communicator.cpp) and its
// sends and receives (shm_messages.cpp) see it. Each rank owns one segment:
//   Control     its bell (the futex word its communication thread sleeps on), its barrier counter and what its
//               current collective is (compared by every rank after the collective's first barrier)
//   two halves  for collective rounds, which alternate between them
//   mailboxes   one per sender (itself included): `slots` slots of `slot_bytes`, filled by that sender in ring
//               order and emptied by this rank in the same order (one producer, one consumer)
#pragma once
#include <atomic>
#include <cstdint>
#include <vector>

namespace mt {

// What a collective is on one rank: ranks that disagree are out of step (a desync), which the transport reports
// instead of reducing mismatched buffers.
struct ShmCollective {
  int32_t kind = 0, dtype = 0, reduce = 0, root = 0;
  int64_t count = 0;
  uint64_t seq = 0;  // the communicator's operation number
  bool operator==(const ShmCollective& o) const {
    return kind == o.kind && dtype == o.dtype && reduce == o.reduce && root == o.root && count == o.count;
  }
};

struct alignas(64) ShmControl {
  std::atomic<uint32_t> bell{0};
  alignas(64) std::atomic<uint64_t> passed{0};  // barriers this rank has entered
  // The collective whose first barrier is barrier k, at [k % 2]: written before the barrier is entered (a peer
  // reads it once the barrier has passed, and cannot be two barriers ahead before this rank reads its).
  ShmCollective collective[2];
};

struct alignas(64) ShmSlot {
  std::atomic<uint32_t> full{0};  // 1: written by the sender, not yet emptied by the receiver
  int32_t tag = 0;
  int64_t msg_bytes = 0, offset = 0, chunk_bytes = 0;
  double send_start_us = 0;  // when the sender started the message (the receive's start for the emulation)

  char* data() { return reinterpret_cast<char*>(this) + sizeof(ShmSlot); }
};

struct ShmWindow {
  std::vector<char*> segment;  // every rank's segment, mapped into this process
  int64_t half_bytes = 0;      // one collective half (a multiple of 64)
  int64_t slot_bytes = 0;      // payload of one slot
  int64_t slot_stride = 0;     // header + payload, a multiple of 64
  int slots = 0;               // per mailbox

  static int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
  int64_t segment_bytes(int ranks) const {
    return round_up(static_cast<int64_t>(sizeof(ShmControl)) + 2 * half_bytes + ranks * slot_stride * slots, 4096);
  }
  ShmControl& control(int q) const { return *reinterpret_cast<ShmControl*>(segment[q]); }
  char* half(int q, uint64_t round) const {
    return segment[q] + sizeof(ShmControl) + static_cast<int64_t>(round % 2) * half_bytes;
  }
  // Slot `index` (mod slots) of the mailbox in `receiver`'s segment that `sender` fills.
  ShmSlot& slot(int receiver, int sender, uint64_t index) const {
    char* box = segment[receiver] + sizeof(ShmControl) + 2 * half_bytes + sender * slot_stride * slots;
    return *reinterpret_cast<ShmSlot*>(box + static_cast<int64_t>(index % slots) * slot_stride);
  }
};

}  // namespace mt
