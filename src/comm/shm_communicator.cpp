// The shared-memory transport (shm_communicator.h).
//
// Window layout: each rank owns one segment of the group's MPI_Win_allocate_shared window:
//   Control     its bell (the futex word its communication thread sleeps on) and its barrier counter
//   two halves  of sizes.half_bytes each: collective rounds alternate between them
//   mailboxes   one per sender (itself included): sizes.slots slots of sizes.slot_bytes, filled by that sender
//               in ring order, emptied by this rank in the same order (one producer, one consumer)
//
// Collectives: every rank runs the same rounds in the same order (their number depends only on the sizes), and a
// barrier numbers them (ranks publish how many they have passed). A round of all_reduce:
//   copy in     each rank copies its input into its current half, cut in p pieces (piece q: part of shard q);
//   barrier     (the first one of an operation is the arrival handshake: the op's start for the emulation)
//   reduce      rank q adds piece q of every rank's half, in rank order, and writes it into its own piece q;
//   barrier
//   copy out    each rank copies piece q of rank q's half into its output, for every q.
// reduce_scatter stops after the reduce (into its output), all_gather and broadcast need one barrier per round.
// Why no trailing barrier: a round writes into half r % 2, and a rank reaches round r + 2 only after every rank
// has passed a barrier of round r + 1, which each one entered after finishing its reads of round r.
//
// Sends and receives: a sender copies chunks of its message into the receiver's mailbox for it while slots are
// free; the receiver copies them out, into the first posted receive from that sender with the message's tag, or
// into a buffer of its own when none is posted (an "unexpected" message, as MPI keeps them), so neither side ever
// blocks the other. Messages from one sender with one tag are received in the order they were sent.
#include "comm/shm_communicator.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <vector>

#include "comm/comm_util.h"
#include "comm/futex.h"
#include "comm/queued_communicator.h"
#include "core/check.h"
#include "core/dtype.h"

namespace mt {
namespace {

struct alignas(64) Control {
  std::atomic<uint32_t> bell{0};
  alignas(64) std::atomic<uint64_t> passed{0};  // barriers this rank has entered
};

struct alignas(64) SlotHeader {
  std::atomic<uint32_t> full{0};  // 1: written by the sender, not yet emptied by the receiver
  int32_t tag = 0;
  int64_t msg_bytes = 0, offset = 0, chunk_bytes = 0;
  double send_start_us = 0;  // when the sender started the message (the receive's start for the emulation)
};

int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// Reduces p ranks' pieces. The order of the additions is a pairwise tree over ranks, split at the largest power of
// two below the count ((r0 + r1) + (r2 + r3), ((r0 + r1) + (r2 + r3)) + (r4 + r5), ...): the order of MPICH's
// recursive doubling, so that a hierarchical all-reduce (pairs inside nodes, then across) and the flat one agree
// bit for bit, and more accurate than a running sum. 16-bit values are added in fp32 and rounded after every
// addition (as MPI's and NCCL's 16-bit sums are).
class Reducer {
 public:
  // Kept by the communicator across operations, so its buffers are allocated once.
  void set(DType dtype, ReduceOp op) {
    dtype_ = dtype;
    max_ = op == ReduceOp::Max;
  }

  // out[i] = the reduction of src[0][i] .. src[p-1][i]; out may be one of the sources.
  void reduce(const std::vector<const char*>& src, void* out, int64_t n) {
    if (n <= 0) return;
    result_.resize(static_cast<size_t>(n));
    tree(src, 0, static_cast<int>(src.size()), result_.data(), n, 0);
    for (int64_t i = 0; i < n; ++i) store(out, i, result_[i]);
  }

 private:
  float load(const void* p, int64_t i) const {
    switch (dtype_) {
      case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
      case DType::F16: return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
      default: return static_cast<const float*>(p)[i];
    }
  }
  void store(void* p, int64_t i, float x) const {
    switch (dtype_) {
      case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(x); break;
      case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_fp16(x); break;
      default: static_cast<float*>(p)[i] = x; break;
    }
  }
  float round(float x) const {
    switch (dtype_) {
      case DType::BF16: return bf16_to_float(float_to_bf16(x));
      case DType::F16: return fp16_to_float(float_to_fp16(x));
      default: return x;
    }
  }

  // out = the reduction of ranks [lo, hi).
  void tree(const std::vector<const char*>& src, int lo, int hi, float* out, int64_t n, size_t depth) {
    if (hi - lo == 1) {
      if (dtype_ == DType::F32)
        std::memcpy(out, src[lo], static_cast<size_t>(n) * 4);
      else
        for (int64_t i = 0; i < n; ++i) out[i] = load(src[lo], i);
      return;
    }
    int span = 1;
    while (span * 2 < hi - lo) span *= 2;
    tree(src, lo, lo + span, out, n, depth + 1);
    if (scratch_.size() <= depth) scratch_.resize(depth + 1);
    std::vector<float>& right = scratch_[depth];
    right.resize(static_cast<size_t>(n));
    tree(src, lo + span, hi, right.data(), n, depth + 1);
    const float* r = right.data();
    if (max_)
      for (int64_t i = 0; i < n; ++i) out[i] = r[i] > out[i] ? r[i] : out[i];
    else if (dtype_ == DType::F32)
      for (int64_t i = 0; i < n; ++i) out[i] += r[i];
    else
      for (int64_t i = 0; i < n; ++i) out[i] = round(out[i] + r[i]);
  }

  DType dtype_ = DType::F32;
  bool max_ = false;
  std::vector<float> result_;
  std::vector<std::vector<float>> scratch_;  // one per tree level
};

class ShmCommunicator : public QueuedCommunicator {
 public:
  ShmCommunicator(MPI_Comm comm, const std::string& name, const CommOptions& opts, const ShmSizes& sizes, int rank,
                  int size)
      : QueuedCommunicator(name, rank, size, opts, INT64_MAX), sizes_(sizes) {
    CHECK(sizes.half_bytes >= 64 * size && sizes.slot_bytes >= 64 && sizes.slots >= 1,
          "shared-memory sizes: half {} bytes for {} ranks, slots {} x {} bytes", sizes.half_bytes, size,
          sizes.slots, sizes.slot_bytes);
    MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    half_ = round_up(sizes.half_bytes, 64);
    slot_ = round_up(static_cast<int64_t>(sizeof(SlotHeader)) + sizes.slot_bytes, 64);
    mailbox_ = slot_ * sizes.slots;
    const int64_t segment = round_up(static_cast<int64_t>(sizeof(Control)) + 2 * half_ + size * mailbox_, 4096);
    MPI_Info info;
    MPI_CHECK(MPI_Info_create(&info));
    MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true"));  // each segment page-aligned, near its owner
    void* mine = nullptr;
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));  // a clear message instead of MPI's abort
    const int rc = MPI_Win_allocate_shared(segment, 1, info, comm_, &mine, &win_);
    CHECK(rc == MPI_SUCCESS, "communicator '{}': the shared-memory transport could not allocate {:.1f} MiB of shared "
          "memory per rank (MPI error {}); is /dev/shm large enough (containers: --shm-size)? comm.backend=mpi "
          "avoids it", name, segment / 1048576.0, rc);
    MPI_CHECK(MPI_Info_free(&info));
    std::memset(mine, 0, static_cast<size_t>(segment));
    new (mine) Control();
    segments_.resize(size);
    for (int q = 0; q < size; ++q) {
      MPI_Aint bytes = 0;
      int disp = 0;
      void* base = nullptr;
      MPI_CHECK(MPI_Win_shared_query(win_, q, &bytes, &disp, &base));
      segments_[q] = static_cast<char*>(base);
    }
    MPI_CHECK(MPI_Barrier(comm_));  // every segment is initialised before any thread looks at it
    sends_.resize(size);
    incoming_.resize(size);
    unexpected_.resize(size);
    produced_.assign(size, 0);
    consumed_.assign(size, 0);
    start(&control(rank).bell);
  }

  ~ShmCommunicator() override {
    stop();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Win_free(&win_);
      MPI_Comm_free(&comm_);
    }
  }

 private:
  // ---- the window
  Control& control(int q) const { return *reinterpret_cast<Control*>(segments_[q]); }
  char* half(int q, uint64_t round) const { return segments_[q] + sizeof(Control) + (round % 2) * half_; }
  // The mailbox in `receiver`'s segment that `sender` fills.
  SlotHeader& slot(int receiver, int sender, uint64_t index) const {
    char* box = segments_[receiver] + sizeof(Control) + 2 * half_ + sender * mailbox_;
    return *reinterpret_cast<SlotHeader*>(box + (index % sizes_.slots) * slot_);
  }
  static char* slot_data(SlotHeader& h) { return reinterpret_cast<char*>(&h) + sizeof(SlotHeader); }

  void on_issue(Op& op) override {
    CHECK(op.a.device() == Device::CPU && op.b.device() == Device::CPU,
          "{} on '{}': the shared-memory transport takes host tensors (device tensors: comm.backend=mpi or nccl)",
          comm_kind_name(op.kind), name());
  }

  // Sleeps until done() holds, progressing sends and receives meanwhile (a peer may wait for them first).
  void wait_until(const std::function<bool()>& done) {
    for (;;) {
      const uint32_t seen = bell()->load(std::memory_order_acquire);
      if (done()) return;
      if (progress_p2p()) continue;
      sleep_on_bell(seen, -1);
    }
  }

  // Every rank enters barrier k (its k-th) and leaves once all have entered it.
  void barrier() {
    const uint64_t k = ++barriers_;
    control(rank()).passed.store(k, std::memory_order_release);
    for (int q = 0; q < size(); ++q)
      if (q != rank()) ring(&control(q).bell);
    wait_until([&] {
      for (int q = 0; q < size(); ++q)
        if (control(q).passed.load(std::memory_order_acquire) < k) return false;
      return true;
    });
  }

  // ---- collectives
  void run_collective(Op& op) override {
    double start = trace_clock_us();
    bool started = false;
    const auto sync = [&] {
      barrier();
      if (!started) start = trace_clock_us(), started = true;  // every rank has arrived
    };
    switch (op.kind) {
      case CommKind::AllReduce: reduce_rounds(op.a, op.a, op.rop, true, sync); break;
      case CommKind::ReduceScatter: reduce_rounds(op.a, op.b, op.rop, false, sync); break;
      case CommKind::AllGather: all_gather(op.a, op.b, sync); break;
      case CommKind::Broadcast: broadcast(op.a, op.peer, sync); break;
      case CommKind::Barrier: sync(); break;
      default: CHECK(false, "send/recv are not collectives");
    }
    if (op.rop == ReduceOp::Avg && size() > 1 && op.kind == CommKind::AllReduce) divide_by_group_size(op.a, size());
    if (op.rop == ReduceOp::Avg && size() > 1 && op.kind == CommKind::ReduceScatter) divide_by_group_size(op.b, size());
    finish(op, start);
  }

  // all_reduce (out = in, every shard copied back) or reduce_scatter (out = this rank's shard).
  void reduce_rounds(const Tensor& in, const Tensor& out, ReduceOp rop, bool all, const std::function<void()>& sync) {
    const int p = size(), me = rank();
    const int64_t n = in.numel(), es = static_cast<int64_t>(dtype_size(in.dtype()));
    if (n == 0) return;
    const int64_t piece = half_ / (p * es);  // elements of one shard per round
    const int64_t rounds = (shard_range(n, p, 0).size() + piece - 1) / piece;
    reducer_.set(in.dtype(), rop);
    char* src = static_cast<char*>(in.data());
    char* dst = static_cast<char*>(out.data());
    std::vector<const char*> parts(p);
    for (int64_t j = 0; j < rounds; ++j, ++round_) {
      const int64_t off = j * piece;
      const auto len = [&](int q) { return std::clamp<int64_t>(shard_range(n, p, q).size() - off, 0, piece); };
      char* mine = half(me, round_);
      for (int q = 0; q < p; ++q)
        std::memcpy(mine + q * piece * es, src + (shard_range(n, p, q).begin + off) * es, len(q) * es);
      sync();
      for (int q = 0; q < p; ++q) parts[q] = half(q, round_) + me * piece * es;
      if (all) {
        reducer_.reduce(parts, mine + me * piece * es, len(me));
        sync();
        for (int q = 0; q < p; ++q)
          std::memcpy(dst + (shard_range(n, p, q).begin + off) * es, half(q, round_) + q * piece * es, len(q) * es);
      } else {
        reducer_.reduce(parts, dst + off * es, len(me));  // the output may alias this round's input: copied already
      }
    }
  }

  void all_gather(const Tensor& in, const Tensor& out, const std::function<void()>& sync) {
    const int p = size(), me = rank();
    const int64_t n = out.numel(), es = static_cast<int64_t>(dtype_size(out.dtype()));
    if (n == 0) return;
    const char* src = static_cast<const char*>(in.data());
    char* dst = static_cast<char*>(out.data());
    // An input inside the output but not at this rank's own shard would be overwritten by other shards.
    const ShardRange own = shard_range(n, p, me);
    const char* a0 = src;
    const char* b0 = dst;
    if (in.nbytes() > 0 && src != dst + own.begin * es && a0 < b0 + out.nbytes() && b0 < a0 + in.nbytes()) {
      copy_.assign(src, src + in.nbytes());
      src = copy_.data();
    }
    const int64_t piece = half_ / es;
    const int64_t rounds = (shard_range(n, p, 0).size() + piece - 1) / piece;
    for (int64_t j = 0; j < rounds; ++j, ++round_) {
      const int64_t off = j * piece;
      const auto len = [&](int q) { return std::clamp<int64_t>(shard_range(n, p, q).size() - off, 0, piece); };
      std::memcpy(half(me, round_), src + off * es, len(me) * es);
      sync();
      for (int q = 0; q < p; ++q)
        if (q != me || dst + (own.begin + off) * es != src + off * es)
          std::memcpy(dst + (shard_range(n, p, q).begin + off) * es, half(q, round_), len(q) * es);
    }
  }

  void broadcast(const Tensor& t, int root, const std::function<void()>& sync) {
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    if (bytes == 0 || size() == 1) return;
    char* data = static_cast<char*>(t.data());
    for (int64_t off = 0; off < bytes; off += half_, ++round_) {
      const int64_t len = std::min(half_, bytes - off);
      if (rank() == root) std::memcpy(half(root, round_), data + off, len);
      sync();
      if (rank() != root) std::memcpy(data + off, half(root, round_), len);
    }
  }

  // ---- sends and receives
  struct Send {
    Op op;
    int64_t sent = 0;
    double start_us = 0;
  };
  struct Recv {
    Op op;
    double posted_us = 0;
  };
  // The message a sender is in the middle of delivering: into a posted receive, or an unexpected buffer.
  struct Incoming {
    bool active = false;
    bool to_recv = false;
    Recv recv;
    int tag = 0;
    int64_t bytes = 0, got = 0;
    double send_start_us = 0;
    std::vector<char> buffer;
  };
  struct Unexpected {
    int tag = 0;
    std::vector<char> data;
    double send_start_us = 0;
    bool complete = false;
  };

  double p2p_poll_us(int) const override { return -1; }  // every change rings the bell: never poll
  bool p2p_pending() const override { return pending_p2p_ > 0; }

  void post_p2p(Op& op) override {
    ++pending_p2p_;
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

  void check_size(const Recv& r, int64_t bytes) const {
    const int64_t es = static_cast<int64_t>(dtype_size(r.op.a.dtype()));
    CHECK(bytes == static_cast<int64_t>(r.op.a.nbytes()), "recv on '{}' from {} tag {}: expected {} elements, got {}",
          name(), r.op.peer, r.op.tag, r.op.a.numel(), bytes / es);
  }

  void deliver(Recv& r, const char* data, int64_t bytes, double send_start_us) {
    check_size(r, bytes);
    if (bytes > 0) std::memcpy(r.op.a.data(), data, bytes);
    complete(r.op, std::max(r.posted_us, send_start_us));
  }

  void complete(Op& op, double start_us) {
    --pending_p2p_;
    finish(op, start_us);
  }

  bool progress_p2p() override {
    bool progressed = false;
    for (int d = 0; d < size(); ++d) progressed |= push_sends(d);
    for (int s = 0; s < size(); ++s) progressed |= pull_messages(s);
    return progressed;
  }

  // Fills free slots of receiver d's mailbox with the pending sends to d, in order.
  bool push_sends(int d) {
    bool progressed = false;
    auto& queue = sends_[d];
    while (!queue.empty()) {
      Send& s = queue.front();
      SlotHeader& h = slot(d, rank(), produced_[d]);
      if (h.full.load(std::memory_order_acquire)) break;
      const int64_t total = static_cast<int64_t>(s.op.a.nbytes());
      const int64_t chunk = std::min(sizes_.slot_bytes, total - s.sent);
      if (chunk > 0) std::memcpy(slot_data(h), static_cast<const char*>(s.op.a.data()) + s.sent, chunk);
      h.tag = s.op.tag;
      h.msg_bytes = total;
      h.offset = s.sent;
      h.chunk_bytes = chunk;
      h.send_start_us = s.start_us;
      h.full.store(1, std::memory_order_release);
      ring(&control(d).bell);
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
  bool pull_messages(int s) {
    bool progressed = false;
    Incoming& in = incoming_[s];
    for (;;) {
      SlotHeader& h = slot(rank(), s, consumed_[s]);
      if (!h.full.load(std::memory_order_acquire)) break;
      if (h.offset == 0) begin_message(s, h);
      char* into = in.to_recv ? static_cast<char*>(in.recv.op.a.data()) : unexpected_[s].back().data.data();
      if (h.chunk_bytes > 0) std::memcpy(into + h.offset, slot_data(h), h.chunk_bytes);
      in.got += h.chunk_bytes;
      h.full.store(0, std::memory_order_release);
      ring(&control(s).bell);
      ++consumed_[s];
      progressed = true;
      if (in.got == in.bytes) {
        in.active = false;
        if (in.to_recv) {
          complete(in.recv.op, std::max(in.recv.posted_us, in.send_start_us));
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
  void begin_message(int s, const SlotHeader& h) {
    Incoming& in = incoming_[s];
    in = Incoming();
    in.active = true;
    in.tag = h.tag;
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
  void deliver_unexpected(int s) {
    auto& queue = unexpected_[s];
    for (auto it = queue.begin(); it != queue.end() && it->complete;) {
      auto r = std::find_if(posted_.begin(), posted_.end(),
                            [&](const Recv& x) { return x.op.peer == s && x.op.tag == it->tag; });
      const bool older_same_tag = std::any_of(queue.begin(), it, [&](const Unexpected& u) { return u.tag == it->tag; });
      if (r == posted_.end() || older_same_tag) {
        ++it;
        continue;
      }
      Recv recv = std::move(*r);
      posted_.erase(r);
      deliver(recv, it->data.data(), static_cast<int64_t>(it->data.size()), it->send_start_us);
      it = queue.erase(it);
    }
  }

  ShmSizes sizes_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<char*> segments_;
  int64_t half_ = 0, slot_ = 0, mailbox_ = 0;

  // Communication thread only.
  uint64_t barriers_ = 0, round_ = 0;
  Reducer reducer_;
  std::vector<char> copy_;
  int pending_p2p_ = 0;
  std::vector<std::deque<Send>> sends_;          // per receiver, in issue order
  std::list<Recv> posted_;                       // receives not yet matched, in issue order
  std::vector<Incoming> incoming_;               // per sender
  std::vector<std::deque<Unexpected>> unexpected_;  // per sender, in arrival order
  std::vector<uint64_t> produced_, consumed_;    // slots filled per receiver, emptied per sender
};

}  // namespace

bool shares_memory(MPI_Comm comm) {
  int size = 0, rank = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int local = 0;
  MPI_CHECK(MPI_Comm_size(node, &local));
  MPI_CHECK(MPI_Comm_free(&node));
  int all = local == size ? 1 : 0, every = 0;
  MPI_CHECK(MPI_Allreduce(&all, &every, 1, MPI_INT, MPI_MIN, comm));
  return every == 1;
}

std::unique_ptr<Communicator> make_shm_transport(MPI_Comm comm, const std::string& name, const CommOptions& opts,
                                                 const ShmSizes& sizes) {
  int rank = 0, size = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  return std::make_unique<ShmCommunicator>(comm, name, opts, sizes, rank, size);
}

}  // namespace mt
