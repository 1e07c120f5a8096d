#include "parallel/pipeline_executor.hpp"

#include <algorithm>
#include <stdexcept>

#include "parallel/pipeline_schedule.hpp"

namespace meshmoe {

std::vector<Micro> split_micro_batches(const Batch& batch, int micro_batches, int data, int d, uint64_t seed, int64_t step,
                                       bool training, PhaseTimers* timers) {
  const int B = batch.rows, T = batch.seq_len;
  const int per_micro = B / micro_batches, per_rank = per_micro / data;
  std::vector<Micro> out;
  for (int m = 0; m < micro_batches; ++m) {
    const int begin = m * per_micro + d * per_rank;
    out.push_back({batch.slice(begin, begin + per_rank), StepContext{seed, uint32_t(step), training, uint64_t(begin) * T, timers}});
  }
  return out;
}

namespace {
// A wait on the pipe axis: timed as the phase pipeline_wait and added to the step's bubble.
class PipeWait {
 public:
  PipeWait(PhaseTimers& timers, double& total) : phase_(&timers, "pipeline_wait"), total_(total), start_(wall_seconds()) {}
  ~PipeWait() { total_ += wall_seconds() - start_; }

 private:
  ScopedPhase phase_;
  double& total_;
  double start_;
};
}  // namespace

void PipelineExecutor::park(int micro) {
  for (size_t i = 0; i < stash_.size(); ++i)
    if (stash_owner_[i] < 0) {
      stash_[i].swap_with(model_);
      stash_owner_[i] = micro;
      parked_peak_ = std::max(parked_peak_, int(std::count_if(stash_owner_.begin(), stash_owner_.end(),
                                                                [](int m) { return m >= 0; })));
      return;
    }
  throw std::logic_error("PipelineExecutor: more micro-batches in flight than the 1F1B bound of this stage");
}

void PipelineExecutor::unpark(int micro, int displaced) {
  for (size_t i = 0; i < stash_.size(); ++i)
    if (stash_owner_[i] == micro) {
      stash_[i].swap_with(model_);
      stash_owner_[i] = displaced;
      return;
    }
  throw std::logic_error("PipelineExecutor: micro-batch " + std::to_string(micro) + " was not parked");
}

void PipelineExecutor::train(std::vector<Micro>& micros, const LossWeights& w,
                             const std::function<void(const ForwardStats&)>& on_forward) {
  const double start = wall_seconds();
  Comm& pipe = mesh_.axis(Axis::Pipe);
  const int stage = mesh_.coord(Axis::Pipe), stages = mesh_.extent(Axis::Pipe);
  const bool park_states = recompute_ == Recompute::None;
  // One micro-batch's message between stages: stage_streams() x [N, M].
  const size_t message = size_t(micros[0].rows.rows) * micros[0].rows.seq_len * size_t(model_.shape().d_model) *
                         size_t(model_.stage_streams());
  // Recompute::Block keeps every in-flight micro-batch's stage input; None needs one receive buffer.
  std::vector<Buffer<float>> x_in(park_states ? 1 : micros.size()), x_out(micros.size()), d_in(micros.size());
  Buffer<float> d_out(message);
  first_nonfinite_.clear();
  const size_t stashes = park_states ? size_t(std::max(0, stages - stage - 1)) : 0;
  stash_.resize(stashes);
  stash_owner_.assign(stashes, -1);
  parked_peak_ = 0;
  double waited = 0;
  int in_layers = -1;  // the micro-batch whose saved state the layers hold, awaiting its backward
  for (const PipelineOp& op : one_f_one_b(stage, stages, int(micros.size()))) {
    Micro& mb = micros[size_t(op.micro)];
    const int tag = 2 * op.micro;
    if (op.forward) {
      Buffer<float>& in = x_in[park_states ? 0 : size_t(op.micro)];
      if (!model_.first_stage()) {
        PipeWait t(timers_, waited);
        in.resize(message);
        pipe.recv(in.data(), message, stage - 1, tag);
      }
      if (park_states && in_layers >= 0) park(in_layers);
      // Its figures and finite flags as the host learns them: at the read of the step's scalars
      // (tensor/step_scalars.hpp), in the forwards' order.
      model_.forward(mb.ctx, mb.view(), w, in.data(), [this, on_forward](const ForwardStats& f) {
        on_forward(f);
        if (first_nonfinite_.empty()) first_nonfinite_ = model_.first_nonfinite();
      });
      in_layers = op.micro;
      if (!model_.last_stage()) {
        x_out[op.micro] = model_.stage_output();
        pipe.isend(x_out[op.micro].data(), message, stage + 1, tag);
      }
    } else {
      if (in_layers != op.micro) {
        if (park_states) {
          unpark(op.micro, in_layers);
        } else {
          ScopedPhase t(&timers_, "pipeline_recompute");
          model_.forward(mb.ctx, mb.view(), w, x_in[op.micro].data());
        }
      }
      if (!model_.last_stage()) {
        PipeWait t(timers_, waited);
        pipe.recv(d_out.data(), message, stage + 1, tag + 1);
      }
      model_.backward(mb.ctx, w, d_out.data());
      in_layers = -1;
      if (!park_states) x_in[op.micro] = {};
      if (!model_.first_stage()) {
        d_in[op.micro] = model_.input_grad();
        pipe.isend(d_in[op.micro].data(), message, stage - 1, tag + 1);
      }
    }
  }
  {
    PipeWait t(timers_, waited);
    pipe.wait_sends();
  }
  bubble_.wait_s += waited;
  bubble_.train_s += wall_seconds() - start;
}

ForwardStats PipelineExecutor::forward_only(const Micro& mb, int index, const StepContext& ctx) {
  Comm& pipe = mesh_.axis(Axis::Pipe);
  const int stage = mesh_.coord(Axis::Pipe);
  eval_x_.resize(size_t(mb.rows.rows) * mb.rows.seq_len * size_t(model_.shape().d_model) * size_t(model_.stage_streams()));
  if (!model_.first_stage()) pipe.recv(eval_x_.data(), eval_x_.size(), stage - 1, index);
  const ForwardStats f = model_.forward(ctx, mb.view(), LossWeights{}, eval_x_.data());
  if (!model_.last_stage()) pipe.send(model_.stage_output().data(), eval_x_.size(), stage + 1, index);
  return f;
}

void PipelineExecutor::sync_tied_embedding(bool tied_embeddings) {
  if (mesh_.extent(Axis::Pipe) == 1 || !tied_embeddings) return;
  ParamView<float>* v = model_.first_stage() ? model_.tied_embedding() : model_.tied_copy();
  if (!v) return;
  Comm& pipe = mesh_.axis(Axis::Pipe);
  const int other = model_.first_stage() ? pipe.size() - 1 : 0;
  HostCopy<float> grads(v->g, v->size);  // transfer points: the gradients go through the host
  std::vector<float> mine(grads.data(), grads.data() + v->size), theirs(v->size);
  pipe.isend(mine.data(), mine.size(), other, 1 << 20);
  pipe.recv(theirs.data(), theirs.size(), other, 1 << 20);
  pipe.wait_sends();
  // Same order of the two terms on both stages, so the copies stay bitwise equal.
  const bool first = model_.first_stage();
  for (size_t i = 0; i < v->size; ++i) grads.data()[i] = first ? mine[i] + theirs[i] : theirs[i] + mine[i];
  grads.upload();
}

}  // namespace meshmoe
