// Sends and receives of the shared-memory transport (shm_messages.h).
#include "comm/shm_messages.h"

#include <algorithm>
#include <cstring>

#include "comm/futex.h"
#include "core/check.h"
#include "core/dtype.h"

namespace mt {

ShmMessages::ShmMessages(const ShmWindow& window, int rank, int size, std::string name,
                         std::function<void(Op&, double)> finish)
    : window_(window), rank_(rank), size_(size), name_(std::move(name)), finish_(std::move(finish)),
      sends_(size), incoming_(size), unexpected_(size), produced_(size, 0), consumed_(size, 0) {}

void ShmMessages::post(Op& op) {
  ++pending_;
  if (op.kind == CommKind::Send) {
    Send s;
    s.start_us = trace_clock_us();
    s.op = std::move(op);
    sends_[s.op.peer].push_back(std::move(s));
    return;
  }
  Recv r;
  r.posted_us = trace_clock_us();
  r.op = std::move(op);
  // The oldest message from that sender with that tag, already here (or arriving), is this receive's.
  auto& queue = unexpected_[r.op.peer];
  for (auto it = queue.begin(); it != queue.end(); ++it)
    if (it->tag == r.op.tag) {
      if (!it->complete) break;  // still arriving: matched when complete (deliver_unexpected)
      deliver(r, it->data.data(), static_cast<int64_t>(it->data.size()), it->send_start_us);
      queue.erase(it);
      return;
    }
  posted_.push_back(std::move(r));
}

bool ShmMessages::progress() {
  bool progressed = false;
  for (int d = 0; d < size_; ++d) progressed |= push_sends(d);
  for (int s = 0; s < size_; ++s) progressed |= pull_messages(s);
  return progressed;
}

void ShmMessages::complete(Op& op, double start_us) {
  --pending_;
  finish_(op, start_us);
}

void ShmMessages::check_size(const Recv& r, int64_t bytes) const {
  const int64_t es = static_cast<int64_t>(dtype_size(r.op.a.dtype()));
  CHECK(bytes == static_cast<int64_t>(r.op.a.nbytes()), "recv on '{}' from {} tag {}: expected {} elements, got {}",
        name_, r.op.peer, r.op.tag, r.op.a.numel(), bytes / es);
}

void ShmMessages::deliver(Recv& r, const char* data, int64_t bytes, double send_start_us) {
  check_size(r, bytes);
  if (bytes > 0) std::memcpy(r.op.a.data(), data, bytes);
  complete(r.op, std::max(r.posted_us, send_start_us));
}

// Fills free slots of receiver d's mailbox with the pending sends to d, in order.
bool ShmMessages::push_sends(int d) {
  bool progressed = false;
  auto& queue = sends_[d];
  while (!queue.empty()) {
    Send& s = queue.front();
    ShmSlot& h = window_.slot(d, rank_, produced_[d]);
    if (h.full.load(std::memory_order_acquire)) break;
    const int64_t total = static_cast<int64_t>(s.op.a.nbytes());
    const int64_t chunk = std::min(window_.slot_bytes, total - s.sent);
    if (chunk > 0) std::memcpy(h.data(), static_cast<const char*>(s.op.a.data()) + s.sent, chunk);
    h.tag = s.op.tag;
    h.msg_bytes = total;
    h.offset = s.sent;
    h.chunk_bytes = chunk;
    h.send_start_us = s.start_us;
    h.full.store(1, std::memory_order_release);
    ring(&window_.control(d).bell);
    ++produced_[d];
    s.sent += chunk;
    progressed = true;
    if (s.sent == total) {  // the data is in the mailbox: the buffer may be reused
      complete(s.op, s.start_us);
      queue.pop_front();
    }
  }
  return progressed;
}

// Empties the slots sender s has filled in this rank's mailbox, in order.
bool ShmMessages::pull_messages(int s) {
  bool progressed = false;
  Incoming& in = incoming_[s];
  for (;;) {
    ShmSlot& h = window_.slot(rank_, s, consumed_[s]);
    if (!h.full.load(std::memory_order_acquire)) break;
    if (h.offset == 0) begin_message(s, h);
    char* into = in.to_recv ? static_cast<char*>(in.recv.op.a.data()) : unexpected_[s].back().data.data();
    if (h.chunk_bytes > 0) std::memcpy(into + h.offset, h.data(), h.chunk_bytes);
    in.got += h.chunk_bytes;
    h.full.store(0, std::memory_order_release);
    ring(&window_.control(s).bell);
    ++consumed_[s];
    progressed = true;
    if (in.got == in.bytes) {
      if (in.to_recv) {
        complete(in.recv.op, std::max(in.recv.posted_us, in.send_start_us));
        in.recv = Recv();
      } else {
        unexpected_[s].back().complete = true;
        deliver_unexpected(s);
      }
    }
  }
  return progressed;
}

// A new message from s: into the first posted receive from s with its tag, unless an older message from s with
// that tag is still unclaimed (that one is the receive's); otherwise into an unexpected buffer.
void ShmMessages::begin_message(int s, const ShmSlot& h) {
  Incoming& in = incoming_[s];
  in = Incoming();
  in.bytes = h.msg_bytes;
  in.send_start_us = h.send_start_us;
  const bool older = std::any_of(unexpected_[s].begin(), unexpected_[s].end(),
                                 [&](const Unexpected& u) { return u.tag == h.tag; });
  if (!older)
    for (auto it = posted_.begin(); it != posted_.end(); ++it)
      if (it->op.peer == s && it->op.tag == h.tag) {
        check_size(*it, h.msg_bytes);
        in.to_recv = true;
        in.recv = std::move(*it);
        posted_.erase(it);
        return;
      }
  Unexpected u;
  u.tag = h.tag;
  u.data.resize(static_cast<size_t>(h.msg_bytes));
  u.send_start_us = h.send_start_us;
  unexpected_[s].push_back(std::move(u));
}

// Hands complete unexpected messages from s to receives posted meanwhile, oldest first per tag.
void ShmMessages::deliver_unexpected(int s) {
  auto& queue = unexpected_[s];
  for (auto it = queue.begin(); it != queue.end() && it->complete;) {
    const int tag = it->tag;
    auto r = std::find_if(posted_.begin(), posted_.end(),
                          [&](const Recv& x) { return x.op.peer == s && x.op.tag == tag; });
    if (r == posted_.end()) {
      ++it;
      continue;
    }
    Recv recv = std::move(*r);
    posted_.erase(r);
    deliver(recv, it->data.data(), static_cast<int64_t>(it->data.size()), it->send_start_us);
    it = queue.erase(it);
  }
}

}  // namespace mt
