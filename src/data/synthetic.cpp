// The synthetic corpus: a seeded first-order Markov chain (see synthetic.h and docs/data.md). Each token s has
// four distinct successors, never itself: s+1 and s+2 (mod V), which make the chain irreducible (the +1 cycle
// visits every token) and aperiodic (cycles of lengths V and V-1 have gcd 1), so a unique stationary law
// exists; and two further seeded tokens, so the successor structure must be learned. The four probabilities
// are a Dirichlet(1,1,1,1) draw (normalised Exp(1) variables from Philox uniforms): mean entropy per token is
// psi(5) - psi(2) = 1.083 nats, far below ln V, so a model visibly learns the process.
#include "data/synthetic.h"

#include <cmath>
#include <stdexcept>

#include "core/errors.h"
#include "core/philox.h"

namespace mt {

namespace {

constexpr int kSuccessors = 4;

// One Philox block for (seed, a, b) in the domain named by `tag`: four independent 32-bit words.
PhiloxCounter block(uint64_t seed, uint64_t tag, uint64_t a, uint32_t b) {
  PhiloxKey key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint64_t t = tag ^ (static_cast<uint64_t>(b) * 0x9E3779B97F4A7C15ull);
  return philox4x32({static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32), static_cast<uint32_t>(t),
                     static_cast<uint32_t>(t >> 32)},
                    key);
}

}  // namespace

SyntheticCorpus make_synthetic_corpus(uint64_t seed, int vocab_size) {
  if (vocab_size < kSuccessors + 1)
    input_error("data.source=synthetic needs model.vocab_size >= {} (got {})", kSuccessors + 1, vocab_size);
  const int V = vocab_size, S = kSuccessors;
  const uint64_t tag = fnv1a64("meshtrain.synthetic.chain");
  SyntheticCorpus c;
  c.vocab_size = V;
  c.successors = S;
  c.next.assign(static_cast<size_t>(V) * S, 0);
  c.prob.assign(static_cast<size_t>(V) * S, 0.0);
  std::vector<double> entropy(static_cast<size_t>(V));
  for (int s = 0; s < V; ++s) {
    int32_t* nx = &c.next[static_cast<size_t>(s) * S];
    double* pr = &c.prob[static_cast<size_t>(s) * S];
    nx[0] = (s + 1) % V;
    nx[1] = (s + 2) % V;
    // Two more distinct successors (never s), drawn by rejection; the draw index keeps it deterministic.
    int have = 2;
    for (uint32_t round = 1; have < S; ++round) {
      PhiloxCounter r = block(seed, tag, static_cast<uint64_t>(s), round);
      for (int k = 0; k < 4 && have < S; ++k) {
        int32_t cand = static_cast<int32_t>((static_cast<uint64_t>(r[k]) * static_cast<uint64_t>(V)) >> 32);
        bool ok = cand != s;
        for (int j = 0; j < have; ++j) ok = ok && nx[j] != cand;
        if (ok) nx[have++] = cand;
      }
    }
    PhiloxCounter r = block(seed, tag, static_cast<uint64_t>(s), 0);
    double sum = 0;
    for (int j = 0; j < S; ++j) sum += (pr[j] = -std::log(uniform_open01(r[j])));
    double h = 0;
    for (int j = 0; j < S; ++j) {
      pr[j] /= sum;
      h -= pr[j] * std::log(pr[j]);
    }
    entropy[static_cast<size_t>(s)] = h;
  }

  // Stationary law by power iteration on the lazy chain (I + P) / 2: same fixed point as P, and it converges
  // for any irreducible chain. Stop when an iteration moves pi by less than 1e-12 in L1.
  std::vector<double> pi(static_cast<size_t>(V), 1.0 / V), nxt(static_cast<size_t>(V));
  bool converged = false;
  for (int it = 0; it < 10000000 && !converged; ++it) {
    for (int s = 0; s < V; ++s) nxt[static_cast<size_t>(s)] = 0.5 * pi[static_cast<size_t>(s)];
    for (int s = 0; s < V; ++s)
      for (int j = 0; j < S; ++j)
        nxt[static_cast<size_t>(c.next[static_cast<size_t>(s) * S + j])] +=
            0.5 * pi[static_cast<size_t>(s)] * c.prob[static_cast<size_t>(s) * S + j];
    double diff = 0, total = 0;
    for (int s = 0; s < V; ++s) {
      diff += std::fabs(nxt[static_cast<size_t>(s)] - pi[static_cast<size_t>(s)]);
      total += nxt[static_cast<size_t>(s)];
    }
    for (int s = 0; s < V; ++s) pi[static_cast<size_t>(s)] = nxt[static_cast<size_t>(s)] / total;
    converged = diff < 1e-12;
  }
  if (!converged) throw std::runtime_error("synthetic corpus: power iteration for the stationary law did not converge");
  double h = 0;
  for (int s = 0; s < V; ++s) h += pi[static_cast<size_t>(s)] * entropy[static_cast<size_t>(s)];
  c.entropy_rate_nats = h;
  return c;
}

std::vector<int32_t> sample_synthetic_tokens(const SyntheticCorpus& corpus, uint64_t seed, int64_t n) {
  if (n < 0) input_error("synthetic corpus: cannot sample {} tokens", n);
  const int S = corpus.successors;
  const uint64_t tag = fnv1a64("meshtrain.synthetic.sample");
  std::vector<int32_t> out(static_cast<size_t>(n));
  if (n == 0) return out;
  int32_t cur = 0;
  out[0] = cur;
  PhiloxCounter r{};
  // Token i+1 is drawn with uniform number i (word i % 4 of block i / 4): a prefix of a longer sample is the
  // shorter sample, and the stream depends only on (corpus, seed).
  for (int64_t i = 0; i + 1 < n; ++i) {
    if (i % 4 == 0) r = block(seed, tag, static_cast<uint64_t>(i / 4), 0);
    double u = uniform_open01(r[static_cast<size_t>(i % 4)]);
    const double* pr = &corpus.prob[static_cast<size_t>(cur) * S];
    const int32_t* nx = &corpus.next[static_cast<size_t>(cur) * S];
    int j = 0;
    double acc = pr[0];
    while (j + 1 < S && u >= acc) acc += pr[++j];
    cur = nx[j];
    out[static_cast<size_t>(i + 1)] = cur;
  }
  return out;
}

}  // namespace mt
