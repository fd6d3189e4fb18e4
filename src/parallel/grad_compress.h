// Compressed data-parallel gradient reduction (comm.compress; docs/compression.md): the options, one compressor
// per gradient bucket (int8 block quantisation, top-k sparsification, PowerSGD), each with error feedback, and
// the small pure functions they are built from (exposed for the tests).
//
// Every compressor turns "this rank's fp32 gradients of one bucket" into "the average over the dp group of every
// rank's decoded contribution", computed identically on every rank (same inputs, same order of operations), so
// the replicas stay bit-identical. Error feedback: each rank keeps a residual e laid out like the bucket; a step
// sends C(g + e) and keeps e' = (g + e) - D(C(g + e)), the part of its own input that did not get through, so
// nothing is lost for good, only delayed: sum over steps of what a rank sent = sum of its gradients - e.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/param_table.h"
#include "parallel/compress_method.h"

namespace mt {

struct Bucket;

// comm.compress and its parameters. none and bf16 are the plain all-reduce (bf16: wire dtype BF16, the
// precision.grad_reduce=bf16 path); int8, topk and powersgd are the compressors below.
struct CompressOptions {
  CompressMethod method = CompressMethod::None;
  double topk_fraction = 0.01;  // topk: fraction of each bucket's elements a rank sends, in (0, 1]
  int powersgd_rank = 4;        // powersgd: rank of each matrix's approximation
  uint64_t seed = 0;            // powersgd: key of the random initial Q (the same on every rank of the group)
  // int8, topk: with tp > 1, parameters that several tp ranks hold copies of (replicated ones, Llama's k and v
  // under n_kv_head < tp) are encoded apart from the rest of their bucket, as a message of their own. Their copies
  // must stay equal, and these encodings span whole buckets, whose other parameters (the tp shards) differ between
  // the tp ranks. (powersgd encodes each matrix alone: its copies stay equal.)
  bool tp_copies_apart = false;
};

// True for int8, topk and powersgd (their own encoding and error-feedback state); false for none and bf16.
bool compress_with_feedback(CompressMethod method);

// ---- int8: blocks of kInt8Block elements, one fp32 scale each, symmetric, round to nearest ----
constexpr int64_t kInt8Block = 256;
// I32 words one rank contributes for a bucket of n elements: ceil(n / kInt8Block) scales (fp32 bits), then the
// n int8 codes packed four to a word (the last word zero-padded).
int64_t int8_wire_words(int64_t n);
// Encodes x[0, len) (len <= kInt8Block): scale = max|x| / 127, code[i] = round(x[i] / scale) in [-127, 127]
// (all zero when max|x| = 0). A non-finite max gives scale NaN, so the decoded average is not finite.
float int8_encode_block(const float* x, int64_t len, int8_t* code);

// ---- topk: the k = topk_count(n, f) entries of largest magnitude ----
// ceil(f * n), at least 1 for n > 0, at most n (f * n is taken with a 1e-9 slack, so 0.01 * 300 gives 3).
int64_t topk_count(int64_t n, double fraction);
// Indices (ascending) of the k entries of x[0, n) of largest |x|; ties go to the lower index, NaN counts as
// infinite. scratch is resized to n.
void topk_select(const float* x, int64_t n, int64_t k, std::vector<float>& scratch, std::vector<int32_t>& idx);

// ---- powersgd ----
// A parameter PowerSGD compresses: viewed as rows x cols (rows = dim 0, cols = the rest), offset relative to the
// bucket's begin, approximated at rank `rank`.
struct LowRankMatrix {
  std::string name;
  int64_t offset = 0, rows = 0, cols = 0;
  int rank = 0;
};
// An element range of the bucket sent uncompressed (1-D parameters, matrices not worth compressing). Elements
// no parameter covers (the table's alignment padding, always zero) are neither sent nor changed.
struct ElementRange {
  int64_t offset = 0, numel = 0;  // relative to the bucket's begin
};
struct PowerSgdLayout {
  std::vector<LowRankMatrix> matrices;
  std::vector<ElementRange> uncompressed;
  int64_t p_numel = 0, q_numel = 0, u_numel = 0;  // sum of rows*rank, cols*rank, uncompressed elements
};
// A parameter of >= 2 dimensions is compressed when (rows + cols) * rank < rows * cols, i.e. when P and Q are
// smaller than the matrix; everything else in the bucket is batched into one uncompressed all-reduce.
PowerSgdLayout powersgd_layout(const ParamTable& table, const Bucket& bucket, int rank);
// Modified Gram-Schmidt, two passes ("twice is enough"), on the columns of the row-major rows x cols matrix a:
// afterwards the columns are orthonormal, except that a column left with less than 1e-4 of its norm once the
// previous columns are projected out (numerically in their span, or zero) is set to zero, and a column that
// holds an inf or NaN is set to NaN (so a non-finite gradient stays visible). Returns the number of zeroed
// columns; vanished[j] (if given, size cols) tells which.
int orthonormalize_columns(float* a, int64_t rows, int cols, std::vector<bool>* vanished = nullptr);

// PowerSGD's state besides the residual, per compressed matrix, viewed where it lives: Q (cols x rank, row-major;
// the warm start of the next step, the same on every rank of the group) and how many times it was drawn (redraws
// continue that count). Checkpoints save and restore it through these views.
struct LowRankState {
  std::string name;  // the parameter's
  Tensor q;
  uint64_t* draws = nullptr;
};

// ---- one bucket's compressor ----
// The reducer calls, per step: launch() from the backward pass's hook when the bucket's gradients are final
// (adds the residual, encodes, keeps the new residual, issues the first collectives); then, in finish(),
// exchange() on every bucket, then complete() on every bucket (wait, decode: the bucket's gradients become the
// group average). All collectives go to one communicator in the same order on every rank.
class BucketCompressor {
 public:
  virtual ~BucketCompressor() = default;
  virtual void launch() = 0;
  virtual void exchange() {}
  virtual void complete() = 0;
  // Forgets the error-feedback state (residual zero, PowerSGD's Q redrawn): after a step whose averaged
  // gradients were not finite (an fp16 overflow the optimizer skips), the residual holds inf or NaN.
  virtual void reset() = 0;
  // Payload bytes this rank contributes per step: the sum of CommEvent::bytes of the collectives it issues.
  virtual int64_t wire_bytes() const = 0;
  // Bytes kept from one step to the next besides the residual (PowerSGD's Q), and scratch buffers.
  virtual int64_t state_bytes() const { return 0; }
  virtual std::vector<LowRankState> low_rank_state() { return {}; }
  virtual int64_t buffer_bytes() const = 0;
};

// grads, residual: this bucket's fp32 gradients and its residual (both `bucket.numel()` elements, views into the
// reducer's flat buffers). topk_scratch: shared by the buckets of one reducer (only used inside launch()).
std::unique_ptr<BucketCompressor> make_int8_compressor(Communicator& dp, const Tensor& grads, const Tensor& residual);
std::unique_ptr<BucketCompressor> make_topk_compressor(Communicator& dp, const Tensor& grads, const Tensor& residual,
                                                       double fraction,
                                                       std::shared_ptr<std::vector<float>> topk_scratch);
std::unique_ptr<BucketCompressor> make_powersgd_compressor(Communicator& dp, const Tensor& grads,
                                                           const Tensor& residual, PowerSgdLayout layout,
                                                           uint64_t seed);

// True when every element of the fp32 tensor is finite.
bool all_finite(const Tensor& t);

}  // namespace mt
