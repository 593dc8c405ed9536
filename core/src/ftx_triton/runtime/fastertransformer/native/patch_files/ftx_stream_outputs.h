// ftx: where each streamed response's new tokens start. A decoupled FasterTransformer model resends the whole
// sequence, prompt included, in every streamed response, and Triton lets no ensemble step after it read another
// model's outputs, so postprocessing cannot tell by itself which tokens a response adds. StreamOutputs adds two
// outputs to each response: ftx_stream_offset ([rows, beams] UINT32: the row's prompt length, then the longest
// beam's sequence_length in the previous streamed response) and, where the model answers none of its own,
// response_input_lengths ([rows, beams] INT32: the prompt lengths, which align output_log_probs with output_ids).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime.h>

#include "triton/core/tritonserver.h"

namespace ftx {

constexpr const char* kStreamOffset = "ftx_stream_offset";
constexpr const char* kPromptLengths = "response_input_lengths";

// One execution's stream state. Tensor is the backend's tensor type: where, type, shape, data, built from all four.
template <typename Tensor>
class StreamOutputs {
 public:
  // rows: the execution's batch rows. prompt: the execution's input_lengths in host memory, or nullptr for a model
  // without them (T5's output holds decoder tokens only, so its new tokens start at 0).
  void start(size_t rows, const Tensor* prompt)
  {
    offsets_.assign(rows, 0);
    prompts_.clear();
    if (prompt != nullptr && prompt->where != TRITONSERVER_MEMORY_GPU && FourByteInteger(prompt->type) &&
        Elements(*prompt) >= rows) {
      const uint32_t* lengths = static_cast<const uint32_t*>(prompt->data);
      prompts_.assign(lengths, lengths + rows);
      offsets_ = prompts_;
    }
  }

  // Add the stream offset, and the prompt lengths where the model gave none, to a response's outputs.
  void attach(std::unordered_map<std::string, Tensor>* outputs)
  {
    const size_t rows = offsets_.size();
    if (outputs == nullptr || rows == 0) {
      return;
    }
    auto ids = outputs->find("output_ids");
    if (ids == outputs->end() || ids->second.shape.empty() || ids->second.shape[0] != rows) {
      return;
    }
    const size_t beams = ids->second.shape.size() > 2 ? ids->second.shape[1] : 1;
    offset_out_ = PerBeam<uint32_t>(offsets_, beams);
    outputs->erase(kStreamOffset);
    outputs->insert({kStreamOffset, Tensor{TRITONSERVER_MEMORY_CPU, TRITONSERVER_TYPE_UINT32,
                                           std::vector<size_t>{rows, beams}, offset_out_.data()}});
    if (prompts_.size() == rows && outputs->find(kPromptLengths) == outputs->end()) {
      prompt_out_ = PerBeam<int32_t>(prompts_, beams);
      outputs->insert({kPromptLengths, Tensor{TRITONSERVER_MEMORY_CPU, TRITONSERVER_TYPE_INT32,
                                              std::vector<size_t>{rows, beams}, prompt_out_.data()}});
    }
  }

  // After a streamed response went: the next one's new tokens start after the longest beam it carried.
  void sent(const std::unordered_map<std::string, Tensor>* outputs)
  {
    const size_t rows = offsets_.size();
    if (outputs == nullptr || rows == 0) {
      return;
    }
    auto lengths = outputs->find("sequence_length");
    if (lengths == outputs->end() || !FourByteInteger(lengths->second.type)) {
      return;
    }
    const size_t count = Elements(lengths->second);
    if (count == 0 || count % rows != 0) {
      return;
    }
    std::vector<int32_t> host(count);
    if (lengths->second.where == TRITONSERVER_MEMORY_GPU) {
      if (cudaMemcpy(host.data(), lengths->second.data, count * sizeof(int32_t), cudaMemcpyDefault) != cudaSuccess) {
        return;  // the offsets stay: the next response repeats text rather than loses any
      }
    } else {
      std::memcpy(host.data(), lengths->second.data, count * sizeof(int32_t));
    }
    const size_t beams = count / rows;
    for (size_t r = 0; r < rows; r++) {
      int32_t longest = 0;
      for (size_t k = 0; k < beams; k++) {
        longest = host[r * beams + k] > longest ? host[r * beams + k] : longest;
      }
      if (longest > 0) {
        offsets_[r] = static_cast<uint32_t>(longest);
      }
    }
  }

 private:
  static bool FourByteInteger(TRITONSERVER_DataType type)
  {
    return type == TRITONSERVER_TYPE_UINT32 || type == TRITONSERVER_TYPE_INT32;
  }

  static size_t Elements(const Tensor& tensor)
  {
    size_t count = 1;
    for (const size_t dim : tensor.shape) {
      count *= dim;
    }
    return count;
  }

  template <typename T>
  static std::vector<T> PerBeam(const std::vector<uint32_t>& per_row, size_t beams)
  {
    std::vector<T> out(per_row.size() * beams);
    for (size_t r = 0; r < per_row.size(); r++) {
      for (size_t k = 0; k < beams; k++) {
        out[r * beams + k] = static_cast<T>(per_row[r]);
      }
    }
    return out;
  }

  std::vector<uint32_t> offsets_;  // per row: where the next response's new tokens start
  std::vector<uint32_t> prompts_;  // per row: the prompt length (decoder models)
  std::vector<uint32_t> offset_out_;
  std::vector<int32_t> prompt_out_;
};

}  // namespace ftx
