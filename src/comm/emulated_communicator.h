// Network emulation as a wrapper around any Communicator (comm.emulate.*): every operation of the inner
// communicator is held back until its start plus what the alpha-beta model of its algorithm predicts on the
// emulated link (predict_us in comm_options.h), so overlap, compression and topology experiments mean something
// on one machine. The inner communicator runs the real operation at full speed; a timer thread of the wrapper
// completes the handle at the emulated end, sleeping meanwhile, so the emulated delay costs no CPU. See
// docs/comm.md, "Network emulation".
#pragma once
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace mt {

// `inner` must not be used by anyone else (the wrapper numbers operations as the inner does). node_of[i]: the
// emulated node of group rank i (emulated_nodes()): a collective over a group spanning nodes uses the inter-node
// link, a send or receive the link to its peer. The wrapper keeps inner's name.
std::unique_ptr<Communicator> wrap_emulation(std::unique_ptr<Communicator> inner, std::vector<int> node_of,
                                             const CommOptions& opts);

}  // namespace mt
