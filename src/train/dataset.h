// The run's token streams, from data.source: the synthetic corpus, a token file or a text file, with the
// validation stream from data.val_path or else the held-out tail (data.val_fraction) of the training stream.
#pragma once
#include <string>

#include "data/tokens.h"
#include "train/config.h"

namespace mt {

struct Dataset {
  TokenStream train, val;
  double entropy_rate_nats = -1;  // the synthetic corpus's entropy rate (the best achievable loss), else -1
};

// Throws InputError for a missing or malformed file, ids >= vocab_size, or a stream too short for seq_len.
Dataset load_dataset(const Config& cfg);

}  // namespace mt
