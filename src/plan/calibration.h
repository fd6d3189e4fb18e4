// The compute side of the planner's time model: this machine's time for the passes of a pipeline stage, measured
// by running the real model code (model/gpt.h, kernels/) on one process at the stage's shapes: its blocks, the
// embedding on the first stage, the final LayerNorm, head and loss on the last, for the layout's micro-batch and
// one tensor-parallel rank's shard (the tp collectives are no-ops here, counted as the passes ask for them: the time
// model charges them), with the compute threads a rank of the layout gets. Timings are cached per distinct shape.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "plan/null_communicator.h"
#include "train/config.h"

namespace mt::plan {

// What a stage's compute depends on.
struct StageShape {
  int blocks = 1;  // transformer blocks in the stage
  bool first = true, last = true;  // holds the embedding / the head and loss
  int B = 1;       // sequences per micro-batch
  int tp = 1;
  bool sp = false;  // sequence parallelism
  DType dtype = DType::F32;
  bool split = false;  // zero-bubble backward (input pass + weight pass) instead of one backward pass
  int inflight = 1;    // activation records the schedule keeps: passes between a forward and its backward
  Recompute recompute = Recompute::None;  // train.recompute: its forward work again inside the backward
  int cp = 1;  // context parallelism: seq_len / cp tokens of each sequence, attention by the ring (a null one)
  auto key() const {
    return std::make_tuple(blocks, first, last, B, tp, sp, int(dtype), split, inflight, int(recompute), cp);
  }
  bool operator<(const StageShape& o) const { return key() < o.key(); }
};

// Microseconds per micro-batch at full speed (no other rank competing for the cores).
struct PassTimes {
  double fwd = 0;
  double bwd = 0;                         // one-pass backward (split = false)
  double bwd_input = 0, bwd_weight = 0;   // split backward (split = true)
};

// The tensor-parallel collectives of a stage's passes, in the order the passes ask for them: Megatron's f/g
// all-reduces, or with sequence parallelism the all-gathers and reduce-scatters that replace them, the vocabulary-
// parallel cross-entropy's two all-reduces, the norms' and Llama's kv copies' gradient sums. Each one blocks the
// compute thread, so its whole time is in the pass. None when tp == 1. With context parallelism the passes' ring
// messages too (kind Send: k|v, and in the backward dk|dv), which overlap the ring's attention blocks instead.
struct TpTraffic {
  std::vector<TpOp> fwd, bwd, bwd_input, bwd_weight;
};

struct CalibrationOptions {
  int threads = 1;           // compute threads of one rank
  int reps = 5;              // timed repetitions per shape (their median counts), after one warm-up
  int max_timed_blocks = 4;  // a stage of more blocks is timed with this many and extrapolated per block
  bool verbose = false;      // print each measurement to stderr
  bool progress = false;     // keep one line on stderr up to date: shapes timed and seconds spent
  double progress_every_s = 0;  // or print such a line each time this many more seconds are spent (0: none)
  // Called before each timing with the shape about to be timed (nullptr: the optimizer's and the zeroing's), so
  // that the other cores run what a layout runs on them meanwhile (plan/neighbours.h); empty: timed alone.
  std::function<void(const StageShape*)> beside;
  int neighbours = 0;  // how many processes `beside` keeps computing: part of the file's header where > 0
  // Bytes written before each pass that cold() times: twice the last-level cache, so that the pass finds none of
  // its data in any cache; 0: cold() returns the warm times.
  int64_t evict_bytes = 0;
};

// A shape and its times as one line of text (a calibration file's, and what the neighbours are told), and back.
std::string shape_line(const StageShape& s, const PassTimes& t);
bool read_shape_line(std::istream& in, StageShape& s, PassTimes& t);

class Calibration {
 public:
  Calibration(const ModelConfig& model, const CalibrationOptions& opts);

  // The stage's pass times (measured once per shape, then cached), each pass right after the last: warm caches.
  PassTimes stage(const StageShape& s);
  // The same passes each timed after evict_bytes of other writes, as a rank finds its weights, gradients and
  // activations when its turn on a core comes after other ranks' passes (measured once per shape, then cached;
  // not retimed in rounds). The warm times where options().evict_bytes is 0.
  PassTimes cold(const StageShape& s);
  // Times every shape measured so far (not those loaded from a file) once more, in another order, and keeps for
  // each pass the median of its rounds: a machine whose speed changes over seconds (a VM) then no longer makes one
  // shape look fast and another slow by the moment each was timed. Returns the shapes timed.
  int retime();
  // The tensor-parallel collectives its passes asked for while they were timed (a stage of more blocks than are
  // timed: the timed stage's, plus a middle stage's per block for the rest).
  const TpTraffic& traffic(const StageShape& s);
  // One optimizer step over `numel` elements of state (the gradient norm and AdamW; with 16-bit compute the
  // fp32 masters and the cast into the compute copy), in us.
  double optimizer_us(int64_t numel, DType compute);
  // Zeroing a gradient buffer of `numel` fp32 elements (the step's start), in us.
  double zero_grads_us(int64_t numel);
  // What taking turns on the cores costs when `copies` ranks share them (plan/time_sharing.h: TimeSharing::slicing),
  // as measured by the caller and kept here with the timings; -1 when not measured yet.
  double slicing(int copies) const;
  void set_slicing(int copies, double slicing);  // kept to 4 decimals, as the file keeps it

  // A calibration file: the measurements as text lines, headed by what they depend on (the model's widths, the
  // threads, the timed-blocks limit). load() takes a file's measurements when its header matches and returns
  // how many it took (0 for a missing file or another header); save() writes every measurement so far. Reusing
  // one keeps the timings of repeated plans identical (and quick); delete it when the machine changes.
  int load(const std::string& path);
  void save(const std::string& path) const;

  const CalibrationOptions& options() const { return opts_; }
  int measurements() const { return measurements_; }
  double seconds() const { return seconds_; }  // spent measuring

 private:
  PassTimes times(const StageShape& s, bool cold);
  PassTimes measure(const StageShape& s, TpTraffic& traffic, bool cold);
  void evict();
  void count_measurement(double seconds);  // and show the progress the options ask for
  std::string header() const;
  ModelConfig model_;
  CalibrationOptions opts_;
  std::map<StageShape, PassTimes> stages_, cold_;
  std::map<StageShape, std::vector<PassTimes>> rounds_;  // each round's times of the shapes measured here
  std::map<StageShape, TpTraffic> traffic_;
  std::map<std::pair<int64_t, int>, double> optim_;
  std::map<int64_t, double> zeroing_;
  std::map<int, double> slicing_;
  std::vector<char> evict_buffer_;
  int measurements_ = 0;
  double seconds_ = 0;
  double progress_printed_s_ = 0;  // seconds_ at the last progress line
};

}  // namespace mt::plan
