#include "parallel/pipeline_executor.hpp"

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

void PipelineExecutor::train(std::vector<Micro>& micros, const LossWeights& w,
                             const std::function<void(const ForwardStats&)>& on_forward) {
  Comm& pipe = mesh_.axis(Axis::Pipe);
  const int stage = mesh_.coord(Axis::Pipe), stages = mesh_.extent(Axis::Pipe);
  const size_t NM = size_t(micros[0].rows.rows) * micros[0].rows.seq_len * size_t(model_.shape().d_model);
  std::vector<Buffer<float>> x_in(micros.size()), x_out(micros.size()), d_in(micros.size());
  Buffer<float> d_out(NM);
  first_nonfinite_.clear();
  int last_forward = -1;
  for (const PipelineOp& op : one_f_one_b(stage, stages, int(micros.size()))) {
    Micro& mb = micros[size_t(op.micro)];
    const int tag = 2 * op.micro;
    if (op.forward) {
      if (!model_.first_stage()) {
        ScopedPhase t(&timers_, "pipeline_wait");
        x_in[op.micro].resize(NM);
        pipe.recv(x_in[op.micro].data(), NM, stage - 1, tag);
      }
      on_forward(model_.forward(mb.ctx, mb.view(), w, x_in[op.micro].data()));
      if (first_nonfinite_.empty()) first_nonfinite_ = model_.first_nonfinite();
      last_forward = op.micro;
      if (!model_.last_stage()) {
        x_out[op.micro] = model_.stage_output();
        pipe.isend(x_out[op.micro].data(), NM, stage + 1, tag);
      }
    } else {
      if (last_forward != op.micro) {
        ScopedPhase t(&timers_, "pipeline_recompute");
        model_.forward(mb.ctx, mb.view(), w, x_in[op.micro].data());
        last_forward = op.micro;
      }
      if (!model_.last_stage()) {
        ScopedPhase t(&timers_, "pipeline_wait");
        pipe.recv(d_out.data(), NM, stage + 1, tag + 1);
      }
      model_.backward(mb.ctx, w, d_out.data());
      x_in[op.micro] = {};
      if (!model_.first_stage()) {
        d_in[op.micro] = model_.input_grad();
        pipe.isend(d_in[op.micro].data(), NM, stage - 1, tag + 1);
      }
    }
  }
  ScopedPhase t(&timers_, "pipeline_wait");
  pipe.wait_sends();
}

ForwardStats PipelineExecutor::forward_only(const Micro& mb, int index) {
  Comm& pipe = mesh_.axis(Axis::Pipe);
  const int stage = mesh_.coord(Axis::Pipe);
  eval_x_.resize(size_t(mb.rows.rows) * mb.rows.seq_len * size_t(model_.shape().d_model));
  if (!model_.first_stage()) pipe.recv(eval_x_.data(), eval_x_.size(), stage - 1, index);
  const ForwardStats f = model_.forward(mb.ctx, mb.view(), LossWeights{}, eval_x_.data());
  if (!model_.last_stage()) pipe.send(model_.stage_output().data(), eval_x_.size(), stage + 1, index);
  return f;
}

void PipelineExecutor::sync_tied_embedding(bool tied_embeddings) {
  if (mesh_.extent(Axis::Pipe) == 1 || !tied_embeddings) return;
  ParamView<float>* v = model_.first_stage() ? model_.tied_embedding() : model_.tied_copy();
  if (!v) return;
  Comm& pipe = mesh_.axis(Axis::Pipe);
  const int other = model_.first_stage() ? pipe.size() - 1 : 0;
  std::vector<float> mine(v->g, v->g + v->size), theirs(v->size);
  pipe.isend(mine.data(), mine.size(), other, 1 << 20);
  pipe.recv(theirs.data(), theirs.size(), other, 1 << 20);
  pipe.wait_sends();
  // Same order of the two terms on both stages, so the copies stay bitwise equal.
  const bool first = model_.first_stage();
  for (size_t i = 0; i < v->size; ++i) v->g[i] = first ? mine[i] + theirs[i] : theirs[i] + mine[i];
}

}  // namespace meshmoe
