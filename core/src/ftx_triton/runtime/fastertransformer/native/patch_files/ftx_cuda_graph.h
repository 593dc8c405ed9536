/*
 * ftx: GPT-J's decoding step (every decoder layer, for one generation step) captured once in a CUDA graph and
 * replayed at the following steps, so the host launches one graph instead of ~300 kernels a step.
 *
 * On by default in fp16 (measured: two H200s, GPT-J-6B shape, tp 2, 1.10-1.14x the eager step, ids equal);
 * FTX_FT_CUDA_GRAPH=1 or 0 in the server's environment decides for any type (ftxCudaGraphRequested). What a step
 * changes reaches the graph through device memory:
 * - the masked multi-head attention kernel's timestep: while a step is captured, ftxGraphStep() names a device
 *   int that the kernel reads instead of its by-value timestep (the dispatch sets it); the host's value only
 *   picks the launch configuration and sizes the shared memory, for the largest timestep the graph will replay.
 *   The launcher changes its configuration at timesteps 32 and 2048 (ftxMmhaBand), so a graph serves one band
 *   and is captured again when the step enters the next one: the kernels run as in the eager path.
 * - the custom all-reduce's barrier flags: while the capture is on every all-reduce counts its flags on the
 *   device (ftx_custom_ar_kernels.cu), eager or replayed alike.
 * The first decoding step of a forward runs eagerly (its buffers are sized then, outside any capture); a capture
 * that fails (any CUDA error, any call a capture refuses) logs one line and that forward goes on eagerly. A
 * streaming (decoupled) deployment is served with FTX_FT_CUDA_GRAPH=0: its streamed requests hung with the graph on.
 */
#pragma once

#include "src/fastertransformer/utils/logger.h"

#include <cstdlib>
#include <cuda_runtime.h>
#include <functional>
#include <string>
#include <type_traits>

namespace fastertransformer {

// FTX_FT_CUDA_GRAPH: "1" turns the capture on, "0" off; absent or empty leaves it at `default_on` (the model's type
// decides: on in fp16); anything else is refused (off, and *problem says why, for the log). FT_DEBUG_LEVEL=DEBUG (a
// device sync after every kernel, which no capture allows) keeps it off too.
inline bool ftxCudaGraphSetting(const char* value, const char* debug_level, bool default_on, std::string* problem)
{
    const std::string text = value == nullptr ? "" : value;
    if (text != "" && text != "0" && text != "1") {
        *problem = "FTX_FT_CUDA_GRAPH='" + text + "' is neither 1 nor 0; the decoding step is not captured";
        return false;
    }
    const bool on = text.empty() ? default_on : text == "1";
    if (on && debug_level != nullptr && std::string(debug_level) == "DEBUG") {
        *problem = "FT_DEBUG_LEVEL=DEBUG synchronizes after every kernel; the decoding step is not captured";
        return false;
    }
    return on;
}

// this process's setting for a model whose type has `default_on` (read once per default; a refused value is logged)
inline bool ftxCudaGraphRequested(bool default_on)
{
    const auto read = [](bool fallback) {
        std::string problem;
        const bool  on =
            ftxCudaGraphSetting(std::getenv("FTX_FT_CUDA_GRAPH"), std::getenv("FT_DEBUG_LEVEL"), fallback, &problem);
        if (!problem.empty()) {
            FT_LOG_WARNING("ftx: %s", problem.c_str());
        }
        return on;
    };
    if (default_on) {
        static const bool on_by_default = read(true);
        return on_by_default;
    }
    static const bool off_by_default = read(false);
    return off_by_default;
}

// The timestep the attention kernels of a captured step read from the device (null: none is being captured).
struct FtxGraphStep {
    const int* device_timestep = nullptr;
    int        max_timestep    = 0;  // the launch configuration's and shared memory's timestep
};
FtxGraphStep& ftxGraphStep();  // this thread's (each GPU's rank runs on a thread of its own)

// The masked attention launcher's configuration band of a timestep (below 32, below 2048, the rest), and the
// largest timestep of that band.
int ftxMmhaBand(int timestep);
int ftxMmhaBandLast(int band);

void invokeFtxStoreInt(int* destination, int value, cudaStream_t stream);

// One model instance's captured decoding step.
class FtxStepGraph {
public:
    FtxStepGraph() = default;
    FtxStepGraph(const FtxStepGraph&) = delete;
    FtxStepGraph& operator=(const FtxStepGraph&) = delete;
    ~FtxStepGraph();

    // A new forward: drop the last forward's graph (its buffers may have moved); `usable` says whether this
    // forward may capture at all.
    void begin(bool usable);
    bool usable() const
    {
        return usable_;
    }
    // Run `step` (one decoding step's kernels on `stream`) for `timestep`: eagerly at the first step of a forward,
    // then captured once per band and replayed. `max_timestep`: the largest timestep of this forward.
    void run(cudaStream_t stream, int timestep, int max_timestep, const std::function<void()>& step);

private:
    bool capture(cudaStream_t stream, int band, int max_timestep, const std::function<void()>& step);
    void drop();

    bool            usable_          = false;
    int             steps_           = 0;
    int             band_            = -1;
    int*            device_timestep_ = nullptr;
    cudaGraphExec_t exec_            = nullptr;
    bool            said_captured_   = false;
};

}  // namespace fastertransformer
