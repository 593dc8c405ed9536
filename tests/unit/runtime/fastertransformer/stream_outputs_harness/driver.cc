// Drives ftx::StreamOutputs as the patched backend does: start per execution, then for each streamed response
// attach, (Triton reads the outputs), sent; the final response attach only. Each response prints
//   response <n> offsets <per row and beam...> prompts <per row and beam... | none> copies <fake device copies>
// Usage: driver ROWS BEAMS PROMPTS|none LENGTHS_PER_STEP... (each step "a,b,..": sequence_length per row and beam,
// e.g. "5,7"; the last one is the final response). Env: FAKE_LENGTHS_ON_HOST=1 (sequence_length in host memory),
// FAKE_MODEL_PROMPTS=9 (the model answers response_input_lengths itself, all 9).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "ftx_stream_outputs.h"

struct Tensor {  // the backend's tensor: const members, built from all four
    const TRITONSERVER_MemoryType where;
    const TRITONSERVER_DataType   type;
    const std::vector<size_t>     shape;
    const void*                   data;
    Tensor(TRITONSERVER_MemoryType w, TRITONSERVER_DataType t, std::vector<size_t> s, const void* d):
        where(w), type(t), shape(s), data(d)
    {
    }
};

static std::vector<uint32_t> numbers(const std::string& text)
{
    std::vector<uint32_t> out;
    std::stringstream     in(text);
    std::string           item;
    while (std::getline(in, item, ',')) {
        out.push_back(static_cast<uint32_t>(std::strtoul(item.c_str(), nullptr, 10)));
    }
    return out;
}

template<typename T>
static void print(const char* label, const std::unordered_map<std::string, Tensor>& outputs, const char* name)
{
    std::printf(" %s", label);
    auto it = outputs.find(name);
    if (it == outputs.end()) {
        std::printf(" none");
        return;
    }
    size_t count = 1;
    for (size_t d : it->second.shape) {
        count *= d;
    }
    const T* values = static_cast<const T*>(it->second.data);
    for (size_t i = 0; i < count; i++) {
        std::printf(" %lld", static_cast<long long>(values[i]));
    }
}

int main(int argc, char** argv)
{
    if (argc < 5) {
        std::fprintf(stderr, "usage: driver ROWS BEAMS PROMPTS|none LENGTHS...\n");
        return 2;
    }
    const size_t rows  = std::strtoul(argv[1], nullptr, 10);
    const size_t beams = std::strtoul(argv[2], nullptr, 10);
    const std::string prompt_text = argv[3];
    std::vector<uint32_t> prompts = prompt_text == "none" ? std::vector<uint32_t>{} : numbers(prompt_text);
    const bool host_lengths = std::getenv("FAKE_LENGTHS_ON_HOST") != nullptr;
    const char* model_prompts = std::getenv("FAKE_MODEL_PROMPTS");

    ftx::StreamOutputs<Tensor> stream;
    std::unique_ptr<Tensor>    prompt_tensor;
    if (!prompts.empty()) {
        prompt_tensor.reset(new Tensor{TRITONSERVER_MEMORY_CPU, TRITONSERVER_TYPE_UINT32, {rows, 1}, prompts.data()});
    }
    stream.start(rows, prompt_tensor.get());

    std::vector<uint32_t> ids(rows * beams * 64, 0);
    std::vector<int32_t>  model_prompt_values(rows * beams, model_prompts ? std::atoi(model_prompts) : 0);
    for (int step = 4; step < argc; step++) {
        std::vector<uint32_t> lengths = numbers(argv[step]);
        std::unordered_map<std::string, Tensor> outputs;
        outputs.insert({"output_ids", Tensor{TRITONSERVER_MEMORY_GPU, TRITONSERVER_TYPE_UINT32, {rows, beams, 64}, ids.data()}});
        outputs.insert({"sequence_length",
                        Tensor{host_lengths ? TRITONSERVER_MEMORY_CPU : TRITONSERVER_MEMORY_GPU,
                               TRITONSERVER_TYPE_UINT32, {rows, beams}, lengths.data()}});
        if (model_prompts) {
            outputs.insert({"response_input_lengths",
                            Tensor{TRITONSERVER_MEMORY_GPU, TRITONSERVER_TYPE_INT32, {rows, beams}, model_prompt_values.data()}});
        }
        const bool final_response = step == argc - 1;
        stream.attach(&outputs);
        std::printf("response %d", step - 3);
        print<uint32_t>("offsets", outputs, "ftx_stream_offset");
        print<int32_t>("prompts", outputs, "response_input_lengths");
        std::printf(" copies %d\n", fake_copies);
        if (!final_response) {
            stream.sent(&outputs);
        }
    }
    return 0;
}
