// Data-parallel gradient reduction. The flat gradient buffer is laid out in reverse order of use, so it is cut
// into buckets of about comm.bucket_mb in layout order; during the last micro-batch's backward pass a bucket's
// reduction is launched as soon as every gradient in it is final, and it overlaps the rest of the pass.
//   zero = false: all_reduce(Avg) of each bucket in place: every rank ends with the averaged gradients.
//   zero = true (ZeRO-1): reduce_scatter(Avg) of each bucket in place: this rank ends with the averaged
//   gradients of its shard of every bucket (shard_range over the bucket), in their place in the flat buffer;
//   the rest of the buffer is left unreduced and must not be read.
// With a 16-bit wire dtype (precision.grad_reduce = bf16) each bucket is cast into a staging buffer of that dtype
// when it launches, reduced there (half the bytes of fp32 on the wire) and cast back into the fp32 gradients
// when finish() has waited for it.
// With comm.compress = int8, topk or powersgd (zero = false only) each bucket has a compressor instead
// (grad_compress.h, docs/compression.md): launched from the same hook, finished in finish(), with an
// error-feedback residual per rank that persists across steps.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/param_table.h"
#include "parallel/grad_compress.h"
#include "parallel/grad_sync.h"

namespace mt {

struct Bucket {
  int64_t begin = 0, end = 0;  // elements of the flat buffer
  int64_t numel() const { return end - begin; }
};

// Cuts [0, total_numel) at parameter boundaries, in layout order, into buckets of at most bucket_bytes (a
// parameter larger than that is a bucket on its own; the last bucket runs to total_numel). When the whole does not
// fit in one bucket, the parameters that start within bucket_bytes of either end go into buckets of a quarter of
// that: the first reduction starts earlier in the backward pass and less waits at its end (grad_buckets.cpp).
std::vector<Bucket> make_buckets(const ParamTable& table, int64_t total_numel, size_t elem_bytes,
                                 double bucket_bytes);
constexpr double kEdgeBucketShare = 0.25;  // the size of make_buckets' edge buckets, as a share of bucket_bytes
// The same over the parameters that start in [begin, end), the last bucket running to `end`.
std::vector<Bucket> make_buckets_within(const ParamTable& table, int64_t begin, int64_t end, size_t elem_bytes,
                                        double bucket_bytes);

// `buckets` cut at each of the element offsets `cuts` that falls strictly inside one (into two buckets).
std::vector<Bucket> cut_buckets(const std::vector<Bucket>& buckets, const std::vector<int64_t>& cuts);

class GradReducer : public ChunkGradSync {
 public:
  // wire: the dtype the buckets travel in (the gradients' own dtype, or BF16 / F16 for fp32 gradients).
  GradReducer(Communicator& dp, const Tensor& grads, std::vector<Bucket> buckets, bool zero, DType wire)
      : GradReducer(dp, grads, std::move(buckets), zero, wire, ParamTable{}, CompressOptions{}) {}
  GradReducer(Communicator& dp, const Tensor& grads, std::vector<Bucket> buckets, bool zero)
      : GradReducer(dp, grads, std::move(buckets), zero, grads.dtype()) {}
  // With comm.compress: `table` is the parameter table whose offsets index `grads` (PowerSGD needs each
  // parameter's shape, int8 and topk which parameters tp ranks hold copies of; it is not kept). compress.method:
  //   none      as the constructor above;
  //   bf16      wire dtype BF16 whatever `wire` says (the precision.grad_reduce=bf16 path);
  //   int8, topk, powersgd: fp32 gradients, zero = false and wire = fp32 (the method is the encoding); CHECKed.
  // On a GPU the compressors run on a host copy of the gradients (downloaded as each bucket is launched,
  // uploaded once decoded: the CPU's arithmetic bit for bit); their collectives go to `host_group` where given
  // (an NCCL dp group takes device tensors only), else to dp.
  GradReducer(Communicator& dp, const Tensor& grads, std::vector<Bucket> buckets, bool zero, DType wire,
              const ParamTable& table, const CompressOptions& compress, Communicator* host_group = nullptr);

  // Arms the reducer for the coming backward pass: only the step's last micro-batch communicates.
  void begin_micro_batch(bool last) { armed_ = last; }
  // ChunkGradSync: the final pass arms the reducer; with overlap it reports its gradients as they finish.
  bool begin_pass(bool final, bool overlap) override {
    begin_micro_batch(final);
    return final && overlap;
  }
  // The backward pass's hook: launches every bucket that lies inside [0, end) and is not launched yet.
  void grads_ready(int64_t end) override;
  // Launches what is left (all of it when overlap is off) and waits for every bucket.
  void finish();
  // Forgets the compression's error feedback (residuals zero, PowerSGD's Qs redrawn). The trainer calls it after a
  // step the optimizer skipped, on every rank alike: an fp16 overflow leaves inf or NaN in residuals, and a skipped
  // step's gradients should not reach later steps. (Not decided here from this reducer's own averages: the two
  // copies of the tied embedding, on the first and the last stage, must forget together.)
  void reset_feedback();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  bool zero() const { return zero_; }
  DType wire_dtype() const { return wire_.defined() ? wire_.dtype() : grads_.dtype(); }
  CompressMethod compress_method() const { return method_; }
  // Error-feedback residuals (int8, topk, powersgd), laid out like the gradients; undefined otherwise.
  const Tensor& residual() const { return residual_; }
  // PowerSGD's Qs and draw counts, every bucket's (empty for the other methods).
  std::vector<LowRankState> low_rank_state();
  // Payload bytes this rank contributes to the dp collectives per step (what CommEvent::bytes and so
  // metrics.jsonl's comm_bytes count); docs/compression.md gives the formula of each method.
  int64_t wire_bytes_per_step() const;
  // Bytes kept from step to step by the compression (residuals, PowerSGD's Qs), and its scratch buffers.
  int64_t compress_state_bytes() const;
  int64_t compress_buffer_bytes() const;
  // ZeRO-1: this rank's shard of bucket b, relative to the bucket's begin (train/zero_shards.h packs them).
  ShardRange shard(int b) const { return shard_range(buckets_[b].numel(), dp_.size(), dp_.rank()); }

 private:
  void launch(int b);
  void finish_compressed();
  // Bucket b's tp copies between their places in `bucket` (its first element) and `packed` (copy_ranges_'s order);
  // gather_copies zeroes their places.
  void gather_copies(int b, float* bucket, float* packed) const;
  void scatter_copies(int b, const float* packed, float* bucket) const;
  // The gradients the compressors read and write: the host copy of GPU gradients, else the gradients themselves.
  const Tensor& host_grads() const { return staged_.defined() ? staged_ : grads_; }
  Communicator& dp_;
  Tensor grads_;
  Tensor wire_;  // staging buffer laid out like grads_ (16-bit wire only)
  std::vector<Bucket> buckets_;
  bool zero_, armed_ = false;
  int next_ = 0;  // buckets [0, next_) are launched this step
  std::vector<WorkPtr> work_;
  CompressMethod method_ = CompressMethod::None;
  Tensor residual_;  // fp32, like grads_ (methods with error feedback), on the host
  Tensor staged_;    // GPU gradients with a compressor: their host copy, which the compressors read and write
  std::vector<std::unique_ptr<BucketCompressor>> compressors_;  // one per bucket, or none
  // compress.tp_copies_apart: per bucket, the ranges (relative to its begin) of the tp copies, encoded by a
  // compressor of their own (null where the bucket has none): their gradients gathered into copies_[b] and their
  // residual into copy_residual_[b], both zeroed in the bucket meanwhile, so that the bucket's encoding sends
  // nothing of them. Their residual goes back into residual_, where checkpoints find it.
  std::vector<std::vector<ElementRange>> copy_ranges_;
  std::vector<Tensor> copies_, copy_residual_;
  std::vector<std::unique_ptr<BucketCompressor>> copy_compressors_;
  Communicator* group_ = nullptr;  // the compressors' group
  std::shared_ptr<std::vector<float>> topk_scratch_;
};

}  // namespace mt
