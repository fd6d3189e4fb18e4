// Sends and receives of the shared-memory transport, driven by its communication thread.
//
// A sender copies chunks of its message into the receiver's mailbox for it while slots are free, ringing the
// receiver; the receiver copies them out, into the first posted receive from that sender with the message's tag,
// or into a buffer of its own when none is posted (an "unexpected" message, as MPI keeps them), and rings the
// sender when a slot is free again. So neither side ever blocks the other; messages from one sender with one tag
// are received in the order sent (a receive never takes a newer message while an older one with its tag is
// unclaimed); a send completes once its last chunk is in the mailbox (its buffer may be reused).
#pragma once
#include <deque>
#include <functional>
#include <list>
#include <string>
#include <vector>

#include "comm/queued_communicator.h"
#include "comm/shm_window.h"

namespace mt {

class ShmMessages {
 public:
  // finish(op, start_us) completes an operation (QueuedCommunicator::finish); start_us of a receive is the later
  // of its posting and its message's sending.
  ShmMessages(const ShmWindow& window, int rank, int size, std::string name,
              std::function<void(Op&, double)> finish);

  void post(Op& op);  // a send or a receive
  // Moves chunks both ways, completing what is done; true when anything changed.
  bool progress();
  bool pending() const { return pending_ > 0; }

 private:
  struct Recv {
    Op op;
    double posted_us = 0;
  };
  struct Send {
    Op op;
    int64_t sent = 0;
    double start_us = 0;
  };
  // The message a sender is in the middle of delivering: into a posted receive, or its unexpected buffer (the
  // newest entry of unexpected_[sender]).
  struct Incoming {
    bool to_recv = false;
    Recv recv;
    int64_t bytes = 0, got = 0;
    double send_start_us = 0;
  };
  struct Unexpected {
    int tag = 0;
    std::vector<char> data;
    double send_start_us = 0;
    bool complete = false;
  };

  bool push_sends(int receiver);
  bool pull_messages(int sender);
  void begin_message(int sender, const ShmSlot& s);
  void deliver_unexpected(int sender);
  void deliver(Recv& r, const char* data, int64_t bytes, double send_start_us);
  void check_size(const Recv& r, int64_t bytes) const;
  void complete(Op& op, double start_us);

  const ShmWindow& window_;
  int rank_, size_;
  std::string name_;
  std::function<void(Op&, double)> finish_;
  int pending_ = 0;
  std::vector<std::deque<Send>> sends_;             // per receiver, in issue order
  std::list<Recv> posted_;                          // receives not yet matched, in issue order
  std::vector<Incoming> incoming_;                  // per sender
  std::vector<std::deque<Unexpected>> unexpected_;  // per sender, in arrival order
  std::vector<uint64_t> produced_, consumed_;       // slots filled per receiver, emptied per sender
};

}  // namespace mt
