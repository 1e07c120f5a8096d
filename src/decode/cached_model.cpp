#include "decode/cached_model.hpp"

#include <string>

#include "core/error.hpp"
#include "model/embedding_bodies.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

template <typename T>
CachedModel<T>::CachedModel(Transformer<T>& model) : model_(model) {
  if (!model.first_stage() || !model.last_stage())
    throw InputError("decoding runs the whole model on every rank: a pipeline mesh (mesh.pipe > 1) is not supported");
  first_decoder_block_ = size_t(model.shape().encoder_layers);
  caches_.resize(model.blocks().size() - first_decoder_block_);
  if (model.encdec()) cross_.resize(caches_.size());
}

template <typename T>
void CachedModel<T>::reset(int streams, int capacity) {
  auto& blocks = model_.blocks();
  for (size_t b = 0; b < caches_.size(); ++b)
    caches_[b].reset(streams, capacity, model_.shape().d_model, blocks[first_decoder_block_ + b].attn);
}

template <typename T>
void CachedModel<T>::encode(const std::vector<std::vector<int32_t>>& sources) {
  if (!model_.encdec()) throw std::logic_error("CachedModel::encode: the model has no encoder");
  if (sources.empty()) throw std::logic_error("CachedModel::encode: no sources");
  const int V = model_.shape().vocab, seq_len = model_.shape().seq_len;
  // All sources in one packed sequence: source s is example s (segment s) at positions 0, 1, ...
  std::vector<int32_t> tokens, segment, position;
  std::vector<int> begin{0};
  for (size_t s = 0; s < sources.size(); ++s) {
    const std::vector<int32_t>& src = sources[s];
    if (src.empty() || int(src.size()) > seq_len)
      throw Error("decoding: a source of " + std::to_string(src.size()) + " tokens (the encoder takes 1 to model.seq_len = " +
                  std::to_string(seq_len) + ")");
    for (size_t t = 0; t < src.size(); ++t) {
      if (src[t] < 0 || src[t] >= V)
        throw Error("decoding: source token id " + std::to_string(src[t]) + " outside the vocabulary [0, " +
                    std::to_string(V) + ")");
      tokens.push_back(src[t]);
      segment.push_back(int32_t(s));
      position.push_back(int32_t(t));
    }
    begin.push_back(int(tokens.size()));
  }
  const int n = int(tokens.size());
  StepContext ctx;
  ctx.training = false;
  ctx.moe_group_size = n;
  model_.encode(ctx, 1, n, tokens.data(), segment.data(), position.data());
  for (size_t b = 0; b < cross_.size(); ++b)
    cross_[b].reset(*model_.blocks()[first_decoder_block_ + b].cross, model_.shape().d_model,
                    model_.encoder_output().data(), begin);
}

template <typename T>
const Buffer<T>& CachedModel<T>::step(const int32_t* tokens, const CachedTokens& tok) {
  const int n = tok.n, M = model_.shape().d_model, V = model_.shape().vocab;
  const size_t nM = size_t(n) * M;
  StepContext ctx;
  ctx.training = false;
  ctx.moe_group_size = n;
  tokens_.assign(tokens, tokens + n);
  positions_.assign(tok.position, tok.position + n);
  if (model_.encdec())
    for (int i = 0; i < n; ++i)
      if (tok.stream[i] < 0 || tok.stream[i] >= cross_.front().sources())
        throw std::logic_error("CachedModel::step: stream " + std::to_string(tok.stream[i]) + " has no source (encode() " +
                               std::to_string(cross_.front().sources()) + " sources first)");
  for (int i = 0; i < n; ++i) {
    if (tokens_[i] < 0 || tokens_[i] >= V)
      throw Error("decoding: token id " + std::to_string(tokens_[i]) + " outside the vocabulary [0, " + std::to_string(V) + ")");
    if (positions_[i] < 0 || positions_[i] >= model_.shape().seq_len)
      throw Error("decoding: position " + std::to_string(positions_[i]) + " beyond model.seq_len = " +
                  std::to_string(model_.shape().seq_len));
  }
  x_.resize(nM);
  h_.resize(nM);
  f_.resize(nM);
  // x [n, M] = wte[token] + wpe[position] (the embedding's forward, at the tokens' own positions)
  const Embedding<T>& emb = model_.embedding();
  for_each_index_2d(n, M, EmbeddingForwardElement<T>{emb.wte.w, emb.wpe.w, tokens_.data(), positions_.data(), x_.data(), M});
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
  model_.final_norm().forward(ctx, x_.data(), h_.data(), n);
  logits_.resize(size_t(n) * V);
  model_.output_head().forward(ctx, h_.data(), logits_.data(), n);
  if (agree_logits) agree_logits(logits_.data(), logits_.size());
  return logits_;
}

template <typename T>
const Buffer<T>& CachedModel<T>::prefill(const std::vector<std::vector<int32_t>>& prompts, std::vector<int>& last_row) {
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
