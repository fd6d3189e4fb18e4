// Bucketed, overlapped data-parallel gradient reduction (see grad_buckets.h).
#include "parallel/grad_buckets.h"

#include <algorithm>
#include <tuple>

#include "comm/flight_recorder.h"

namespace mt {

std::vector<Bucket> make_buckets_within(const ParamTable& table, int64_t begin, int64_t end, size_t elem_bytes,
                                        double bucket_bytes) {
  CHECK(bucket_bytes > 0, "bucket size must be positive");
  std::vector<Bucket> out;
  Bucket cur{begin, begin};
  for (const ParamSpec& p : table.specs()) {
    if (p.offset < begin || p.offset >= end) continue;
    const int64_t last = p.offset + p.numel();
    // Close the current bucket before a parameter that would overflow it (never leaving it empty).
    if (cur.end > cur.begin && double(last - cur.begin) * double(elem_bytes) > bucket_bytes) {
      cur.end = p.offset;
      out.push_back(cur);
      cur.begin = p.offset;
    }
    cur.end = last;
  }
  cur.end = end;
  if (cur.end > cur.begin) out.push_back(cur);
  return out;
}

std::vector<Bucket> make_buckets(const ParamTable& table, int64_t total_numel, size_t elem_bytes,
                                 double bucket_bytes) {
  if (double(total_numel) * double(elem_bytes) <= bucket_bytes)
    return make_buckets_within(table, 0, total_numel, elem_bytes, bucket_bytes);
  // The edges of the layout get buckets of a quarter of the size: the first bucket is launched once a quarter of
  // it is ready, so the link starts early in the backward pass (as PyTorch DDP's small first bucket), and the last
  // one, which waits for the gradients the pass finishes last (the first block and the embeddings) and has no
  // compute left to hide behind, holds a quarter as much. The edges are the parameters that start within
  // bucket_bytes of either end.
  const double per = bucket_bytes / double(elem_bytes);
  int64_t head = total_numel, tail = total_numel;
  for (const ParamSpec& p : table.specs()) {
    if (p.offset < head && double(p.offset) >= per) head = p.offset;
    if (p.offset < tail && double(p.offset) >= double(total_numel) - per) tail = p.offset;
  }
  head = std::min(head, tail);
  std::vector<Bucket> out;
  for (const auto& [begin, end, bytes] : {std::tuple{int64_t{0}, head, bucket_bytes * kEdgeBucketShare},
                                          std::tuple{head, tail, bucket_bytes},
                                          std::tuple{tail, total_numel, bucket_bytes * kEdgeBucketShare}})
    for (const Bucket& b : make_buckets_within(table, begin, end, elem_bytes, bytes)) out.push_back(b);
  return out;
}

std::vector<Bucket> cut_buckets(const std::vector<Bucket>& buckets, const std::vector<int64_t>& cuts) {
  std::vector<Bucket> out;
  for (Bucket b : buckets) {
    std::vector<int64_t> inside;
    for (int64_t c : cuts)
      if (c > b.begin && c < b.end) inside.push_back(c);
    std::sort(inside.begin(), inside.end());
    inside.erase(std::unique(inside.begin(), inside.end()), inside.end());
    for (int64_t c : inside) {
      out.push_back({b.begin, c});
      b.begin = c;
    }
    out.push_back(b);
  }
  return out;
}

GradReducer::GradReducer(Communicator& dp, const Tensor& grads, std::vector<Bucket> buckets, bool zero, DType wire,
                         const ParamTable& table, const CompressOptions& compress, Communicator* host_group)
    : dp_(dp), grads_(grads), buckets_(std::move(buckets)), zero_(zero), method_(compress.method) {
  if (method_ == CompressMethod::BF16 && grads.dtype() == DType::F32) wire = DType::BF16;
  if (compress_with_feedback(method_)) {
    CHECK(!zero, "comm.compress={} needs optim.zero=0 (under ZeRO-1 only none and bf16 apply)", name_of(method_));
    CHECK(grads.dtype() == DType::F32 && wire == DType::F32,
          "comm.compress={} encodes fp32 gradients itself: got {} gradients and wire dtype {} (set "
          "precision.grad_reduce=fp32)", name_of(method_), dtype_name(grads.dtype()), dtype_name(wire));
    // The compressors' loops run on the host: GPU gradients get a host copy to work on.
    if (grads.device() != Device::CPU) staged_ = Tensor::zeros(grads.shape(), DType::F32);
    Communicator& group = host_group ? *host_group : dp_;
    residual_ = Tensor::zeros(grads.shape(), DType::F32);
    if (method_ == CompressMethod::TopK) topk_scratch_ = std::make_shared<std::vector<float>>();
    if (method_ == CompressMethod::PowerSGD)
      CHECK(table.size() > 0 && table.total_numel() <= grads.numel(), "comm.compress=powersgd needs the table of "
            "the parameters whose gradients it reduces: got {} parameters ({} elements) for {} gradients",
            table.size(), table.total_numel(), grads.numel());
    group_ = &group;
    // int8 and topk: a compressor of gradients g with residual e (powersgd, which needs the bucket's layout, is
    // made below).
    auto encoder = [&](const Tensor& g, const Tensor& e) {
      return method_ == CompressMethod::Int8
                 ? make_int8_compressor(group, g, e)
                 : make_topk_compressor(group, g, e, compress.topk_fraction, topk_scratch_);
    };
    for (const Bucket& k : buckets_) {
      std::vector<ElementRange> copies;
      if (compress.tp_copies_apart && method_ != CompressMethod::PowerSGD)
        for (const ParamSpec& s : table.specs())
          if ((s.shard.whole() || s.shard.copies > 1) && s.offset >= k.begin && s.offset < k.end)
            copies.push_back({s.offset - k.begin, s.numel()});
      int64_t n = 0;
      for (const ElementRange& r : copies) n += r.numel;
      copy_ranges_.push_back(std::move(copies));
      copies_.push_back(n ? Tensor::zeros({n}, DType::F32) : Tensor());
      copy_residual_.push_back(n ? Tensor::zeros({n}, DType::F32) : Tensor());
      copy_compressors_.push_back(n ? encoder(copies_.back(), copy_residual_.back()) : nullptr);
      const Tensor g = host_grads().slice(k.begin, {k.numel()}), e = residual_.slice(k.begin, {k.numel()});
      compressors_.push_back(method_ == CompressMethod::PowerSGD
                                 ? make_powersgd_compressor(group, g, e,
                                                            powersgd_layout(table, k, compress.powersgd_rank),
                                                            compress.seed)
                                 : encoder(g, e));
    }
  }
  if (wire != grads.dtype()) {
    CHECK(dtype_size(wire) < dtype_size(grads.dtype()), "gradient buckets: {} gradients sent as {}",
          dtype_name(grads.dtype()), dtype_name(wire));
    wire_ = Tensor::zeros(grads.shape(), wire, grads.device());
  }
}

void GradReducer::launch(int b) {
  const Bucket& k = buckets_[b];
  if (!compressors_.empty()) {
    // Waits for the GPU's backward pass up to here: the host reads the bucket.
    if (staged_.defined()) copy_convert(staged_.slice(k.begin, {k.numel()}), grads_.slice(k.begin, {k.numel()}));
    if (!copy_compressors_[b]) return compressors_[b]->launch();
    // The tp copies out of the bucket (gradients and residual), the bucket's encoding, then theirs apart; their new
    // residual back in its place.
    float* x = host_grads().data_as<float>() + k.begin;
    float* e = residual_.data_as<float>() + k.begin;
    gather_copies(b, x, copies_[b].data_as<float>());
    gather_copies(b, e, copy_residual_[b].data_as<float>());
    compressors_[b]->launch();
    copy_compressors_[b]->launch();
    scatter_copies(b, copy_residual_[b].data_as<float>(), e);
    return;
  }
  const Tensor& buf = wire_.defined() ? wire_ : grads_;
  Tensor full = buf.slice(k.begin, {k.numel()});
  if (wire_.defined()) copy_convert(full, grads_.slice(k.begin, {k.numel()}));
  FlightSite site("gradient bucket", b);
  if (zero_)  // in place: the output is this rank's own slice of the input (the backend allows that)
    work_.push_back(dp_.reduce_scatter_async(full, buf.slice(k.begin + shard(b).begin, {shard(b).size()}),
                                             ReduceOp::Avg));
  else
    work_.push_back(dp_.all_reduce_async(full, ReduceOp::Avg));
}

void GradReducer::grads_ready(int64_t end) {
  if (!armed_) return;
  while (next_ < static_cast<int>(buckets_.size()) && buckets_[next_].end <= end) launch(next_++);
}

void GradReducer::finish() {
  while (next_ < static_cast<int>(buckets_.size())) launch(next_++);
  if (!compressors_.empty()) return finish_compressed();
  for (auto& w : work_) w->wait();
  work_.clear();
  next_ = 0;
  armed_ = false;
  if (!wire_.defined()) return;
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {  // back into the fp32 gradients
    const Bucket& k = buckets_[b];
    const int64_t begin = zero_ ? k.begin + shard(b).begin : k.begin, n = zero_ ? shard(b).size() : k.numel();
    copy_convert(grads_.slice(begin, {n}), wire_.slice(begin, {n}));
  }
}

// Every bucket's second phase first (PowerSGD's Q all-reduces then travel while later buckets compute), then
// the decoding.
void GradReducer::finish_compressed() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    compressors_[b]->exchange();
    if (copy_compressors_[b]) copy_compressors_[b]->exchange();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    compressors_[b]->complete();
    if (!copy_compressors_[b]) continue;
    copy_compressors_[b]->complete();  // the copies' average into their places
    scatter_copies(int(b), copies_[b].data_as<float>(), host_grads().data_as<float>() + buckets_[b].begin);
  }
  next_ = 0;
  armed_ = false;
  if (staged_.defined())  // the decoded averages back to the GPU
    for (const Bucket& k : buckets_)
      copy_convert(grads_.slice(k.begin, {k.numel()}), staged_.slice(k.begin, {k.numel()}));
}

void GradReducer::gather_copies(int b, float* bucket, float* packed) const {
  for (const ElementRange& r : copy_ranges_[b]) {
    std::copy(bucket + r.offset, bucket + r.offset + r.numel, packed);
    std::fill(bucket + r.offset, bucket + r.offset + r.numel, 0.f);
    packed += r.numel;
  }
}

void GradReducer::scatter_copies(int b, const float* packed, float* bucket) const {
  for (const ElementRange& r : copy_ranges_[b]) {
    std::copy(packed, packed + r.numel, bucket + r.offset);
    packed += r.numel;
  }
}

std::vector<LowRankState> GradReducer::low_rank_state() {
  std::vector<LowRankState> out;
  for (auto& c : compressors_)
    for (LowRankState& s : c->low_rank_state()) out.push_back(std::move(s));
  return out;
}

void GradReducer::reset_feedback() {  // the buckets' residuals cover the copies' places in residual_ too
  for (auto& c : compressors_) c->reset();
  for (auto& c : copy_compressors_)
    if (c) c->reset();
}

int64_t GradReducer::wire_bytes_per_step() const {
  int64_t bytes = 0;
  for (size_t b = 0; b < buckets_.size(); ++b)
    bytes += compressors_.empty() ? buckets_[b].numel() * int64_t(dtype_size(wire_dtype()))
                                  : compressors_[b]->wire_bytes() +
                                        (copy_compressors_[b] ? copy_compressors_[b]->wire_bytes() : 0);
  return bytes;
}

int64_t GradReducer::compress_state_bytes() const {
  int64_t bytes = residual_.defined() ? int64_t(residual_.nbytes()) : 0;
  for (const auto& c : compressors_) bytes += c->state_bytes();
  return bytes;
}

int64_t GradReducer::compress_buffer_bytes() const {
  int64_t bytes = staged_.defined() ? int64_t(staged_.nbytes()) : 0;
  for (const auto& c : compressors_) bytes += c->buffer_bytes();
  for (size_t b = 0; b < copies_.size(); ++b)  // the copies' gradients and residual, packed, and their encoder's
    if (copy_compressors_[b])
      bytes += int64_t(copies_[b].nbytes() + copy_residual_[b].nbytes()) + copy_compressors_[b]->buffer_bytes();
  if (topk_scratch_) {  // topk_select's magnitudes, as large as the largest bucket
    int64_t most = 0;
    for (const Bucket& k : buckets_) most = std::max(most, k.numel());
    bytes += 4 * most;
  }
  return bytes;
}

}  // namespace mt
