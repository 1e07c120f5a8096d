#include "decode/cached_model.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "model/embedding_bodies.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

namespace {
constexpr int kEncodeTag = 1, kStepTag = 2;  // pipe-axis messages of encode() and step()
}  // namespace

template <typename T>
CachedModel<T>::CachedModel(Transformer<T>& model, Comm* pipe) : model_(model), pipe_(pipe) {
  if ((!model.first_stage() || !model.last_stage()) && !pipe)
    throw std::logic_error("CachedModel: a pipeline stage needs the pipe axis");
  const int first = model.first_block(), blocks = int(model.blocks().size());
  first_decoder_block_ = size_t(std::clamp(model.shape().encoder_layers - first, 0, blocks));
  caches_.resize(model.blocks().size() - first_decoder_block_);
  if (model.encdec()) cross_.resize(caches_.size());
}

template <typename T>
void CachedModel<T>::reset(int streams, int capacity) {
  if (streams < 0 || capacity < 1) throw std::logic_error("CachedModel: no room");
  auto& blocks = model_.blocks();
  for (size_t b = 0; b < caches_.size(); ++b)
    caches_[b].reset(streams, capacity, model_.shape().d_model, blocks[first_decoder_block_ + b].attn);
  capacity_ = capacity;
  length_.assign(size_t(streams), 0);
}

template <typename T>
void CachedModel<T>::append(const CachedTokens& tok) {
  where_.resize(size_t(tok.n));
  for (int i = 0; i < tok.n; ++i) {
    const int s = tok.stream[i];
    if (s < 0 || s >= int(length_.size())) throw std::logic_error("CachedModel::step: token of an unknown stream");
    if (length_[size_t(s)] == capacity_)
      throw Error("decoding: stream " + std::to_string(s) + " holds its " + std::to_string(capacity_) +
                  " tokens already (the cache's capacity)");
    where_[size_t(i)] = length_[size_t(s)]++;
  }
}

template <typename T>
void CachedModel<T>::receive(Buffer<T>& x, size_t n, int tag) {
  x.resize(n);
  if (!model_.first_stage()) pipe_->recv(x.data(), n, pipe_->rank() - 1, tag);
}

template <typename T>
void CachedModel<T>::pass_on(const Buffer<T>& x, size_t n, int tag) {
  if (!model_.last_stage()) pipe_->send(x.data(), n, pipe_->rank() + 1, tag);
}

template <typename T>
void CachedModel<T>::encode(const std::vector<std::vector<int32_t>>& sources) {
  if (!model_.encdec()) throw std::logic_error("CachedModel::encode: the model has no encoder");
  if (sources.empty() && !lockstep()) throw std::logic_error("CachedModel::encode: no sources");
  const int V = model_.shape().vocab, seq_len = model_.shape().seq_len, M = model_.shape().d_model;
  int len = 1;  // also with no source: an embedding of no sequence of length 1
  for (const std::vector<int32_t>& src : sources) {
    if (src.empty() || int(src.size()) > seq_len)
      throw Error("decoding: a source of " + std::to_string(src.size()) + " tokens (the encoder takes 1 to model.seq_len = " +
                  std::to_string(seq_len) + ")");
    for (int32_t t : src)
      if (t < 0 || t >= V)
        throw Error("decoding: source token id " + std::to_string(t) + " outside the vocabulary [0, " +
                    std::to_string(V) + ")");
    len = std::max(len, int(src.size()));
  }
  // Source s is row s, example 0 at positions 0, 1, ...; the rest of the row padding, an example
  // of its own (segment 1), as the Batcher pads the encoder's rows.
  const int rows = int(sources.size());
  std::vector<int32_t> tokens(size_t(rows) * len, 0), segment(tokens.size(), 1), position(tokens.size());
  std::vector<int> begin{0};
  for (int s = 0; s < rows; ++s) {
    const std::vector<int32_t>& src = sources[size_t(s)];
    for (int t = 0; t < len; ++t) {
      const size_t at = size_t(s) * len + size_t(t);
      const bool in = t < int(src.size());
      if (in) tokens[at] = src[size_t(t)], segment[at] = 0;
      position[at] = in ? t : t - int(src.size());
    }
    begin.push_back(begin.back() + int(src.size()));
  }
  StepContext ctx;
  ctx.training = false;
  ctx.decoding = true;
  ctx.moe_group_size = int(tokens.size());
  const size_t NM = tokens.size() * size_t(M);
  receive(enc_in_, NM, kEncodeTag);
  model_.encode(ctx, rows, len, tokens.data(), segment.data(), position.data(), enc_in_.data());
  pass_on(model_.encoder_stream(), NM, kEncodeTag);
  sources_ = rows;
  if (cross_.empty()) return;  // no decoder block on this stage
  // The sources' rows of the encoder output, packed [begin.back(), M]
  enc_.resize(size_t(begin.back()) * M);
  for (int s = 0; s < rows; ++s)
    copy_from(enc_.data() + size_t(begin[size_t(s)]) * M, model_.encoder_output().data() + size_t(s) * len * M,
              sources[size_t(s)].size() * M);
  for (size_t b = 0; b < cross_.size(); ++b)
    cross_[b].reset(*model_.blocks()[first_decoder_block_ + b].cross, M, enc_.data(), begin);
}

template <typename T>
const Buffer<T>& CachedModel<T>::step(const int32_t* tokens, const CachedTokens& tok) {
  const int n = tok.n, M = model_.shape().d_model, V = model_.shape().vocab;
  const size_t nM = size_t(n) * M;
  StepContext ctx;
  ctx.training = false;
  ctx.decoding = true;
  ctx.moe_group_size = n;
  tokens_.assign(tokens, tokens + n);
  positions_.assign(tok.position, tok.position + n);
  if (model_.encdec())
    for (int i = 0; i < n; ++i)
      if (tok.stream[i] < 0 || tok.stream[i] >= sources_)
        throw std::logic_error("CachedModel::step: stream " + std::to_string(tok.stream[i]) + " has no source (" +
                               std::to_string(sources()) + " encoded)");
  for (int i = 0; i < n; ++i) {
    if (tokens_[i] < 0 || tokens_[i] >= V)
      throw Error("decoding: token id " + std::to_string(tokens_[i]) + " outside the vocabulary [0, " + std::to_string(V) + ")");
    if (positions_[i] < 0 || positions_[i] >= model_.shape().seq_len)
      throw Error("decoding: position " + std::to_string(positions_[i]) + " beyond model.seq_len = " +
                  std::to_string(model_.shape().seq_len));
  }
  append(tok);
  receive(x_, nM, kStepTag);
  h_.resize(nM);
  f_.resize(nM);
  if (model_.first_stage()) {
    // x [n, M] = wte[token] + wpe[position] (the embedding's forward, at the tokens' own positions;
    // with rotary positions the token row alone: the cache rotates the queries and keys)
    const Embedding<T>& emb = model_.embedding();
    const T* wpe = emb.learned_positions() ? emb.wpe.w : nullptr;
    for_each_index_2d(n, M, EmbeddingForwardElement<T>{emb.wte.w, wpe, tokens_.data(), positions_.data(), x_.data(), M});
  }
  for (size_t b = 0; b < caches_.size(); ++b) {
    auto& block = model_.blocks()[first_decoder_block_ + b];
    block.ln1.forward(ctx, x_.data(), h_.data(), n);
    caches_[b].forward(block.attn, tok, h_.data(), f_.data());
    add_into(x_.data(), f_.data(), nM);
    if (block.cross) {
      block.ln_cross->forward(ctx, x_.data(), h_.data(), n);
      cross_[b].forward(*block.cross, n, tok.stream, h_.data(), f_.data());
      add_into(x_.data(), f_.data(), nM);
    }
    block.ln2.forward(ctx, x_.data(), h_.data(), n);
    if (block.moe)
      block.moe->forward(ctx, h_.data(), f_.data(), n);
    else
      block.mlp->forward(ctx, h_.data(), f_.data(), n);
    add_into(x_.data(), f_.data(), nM);
  }
  pass_on(x_, nM, kStepTag);
  logits_.resize(size_t(n) * V);
  if (model_.last_stage()) {
    model_.final_norm().forward(ctx, x_.data(), h_.data(), n);
    model_.output_head().forward(ctx, h_.data(), logits_.data(), n);
  }
  if (pipe_ && pipe_->size() > 1) pipe_->broadcast(logits_.data(), logits_.size(), pipe_->size() - 1);
  if (agree_logits) agree_logits(logits_.data(), logits_.size());
  return logits_;
}

template <typename T>
const Buffer<T>& CachedModel<T>::prefill(const std::vector<std::vector<int32_t>>& prompts, std::vector<int>& last_row) {
  if (encdec() && size_t(sources()) != prompts.size())
    throw std::logic_error("CachedModel::prefill: " + std::to_string(prompts.size()) + " prompts for " +
                           std::to_string(sources()) + " encoded sources");
  std::vector<int32_t> tokens, stream, position;
  last_row.clear();
  for (size_t b = 0; b < prompts.size(); ++b) {
    if (prompts[b].empty()) throw std::logic_error("CachedModel::prefill: an empty prompt");
    for (size_t t = 0; t < prompts[b].size(); ++t) {
      tokens.push_back(prompts[b][t]);
      stream.push_back(int32_t(b));
      position.push_back(int32_t(t));
    }
    last_row.push_back(int(tokens.size()) - 1);
  }
  return step(tokens.data(), CachedTokens{int(tokens.size()), stream.data(), position.data()});
}

template class CachedModel<float>;
template class CachedModel<double>;

}  // namespace meshmoe
