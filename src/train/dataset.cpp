// Building the run's train/validation token streams from the config.
#include "train/dataset.h"

#include <fmt/format.h>

#include "core/errors.h"
#include "data/synthetic.h"

namespace mt {

namespace {
TokenStream load_stream(const Config& cfg, const std::string& path) {
  if (cfg.data.source == DataSource::Text) return load_text_file(path, cfg.model.vocab_size);
  return load_token_file(path, cfg.model.vocab_size);
}

// Splits off the last `fraction` of `all` as validation (none when fraction is 0).
void split_tail(TokenStream& all, double fraction, TokenStream& val) {
  const int64_t n = static_cast<int64_t>(all.tokens.size());
  const int64_t n_val = static_cast<int64_t>(n * fraction);
  if (n_val <= 0) return;
  val.tokens.assign(all.tokens.end() - n_val, all.tokens.end());
  all.tokens.resize(n - n_val);
  val.description = fmt::format("held-out tail of {} tokens", n_val);
}
}  // namespace

Dataset load_dataset(const Config& cfg) {
  Dataset d;
  if (cfg.data.source == DataSource::Synthetic) {
    SyntheticCorpus corpus = make_synthetic_corpus(cfg.train.seed, cfg.model.vocab_size);
    d.entropy_rate_nats = corpus.entropy_rate_nats;
    d.train.tokens = sample_synthetic_tokens(corpus, cfg.train.seed, cfg.data.synthetic_tokens);
    d.train.description = fmt::format("synthetic Markov corpus (vocab {}, seed {}): {} tokens, entropy rate {:.4f} nats",
                                      cfg.model.vocab_size, cfg.train.seed, d.train.tokens.size(),
                                      corpus.entropy_rate_nats);
    split_tail(d.train, cfg.data.val_fraction, d.val);
  } else {
    d.train = load_stream(cfg, cfg.data.path);
    if (!cfg.data.val_path.empty()) d.val = load_stream(cfg, cfg.data.val_path);
    else split_tail(d.train, cfg.data.val_fraction, d.val);
  }
  const int64_t need = int64_t(cfg.model.seq_len) + 2;
  if (static_cast<int64_t>(d.train.tokens.size()) < need)
    input_error("data: the training stream has {} tokens; model.seq_len={} needs at least {}", d.train.tokens.size(),
                cfg.model.seq_len, need);
  if (cfg.train.eval_every > 0 && static_cast<int64_t>(d.val.tokens.size()) < need)
    input_error("data: the validation stream has {} tokens; model.seq_len={} needs at least {} (set data.val_path "
                "or data.val_fraction, or train.eval_every=0)",
                d.val.tokens.size(), cfg.model.seq_len, need);
  return d;
}

}  // namespace mt
