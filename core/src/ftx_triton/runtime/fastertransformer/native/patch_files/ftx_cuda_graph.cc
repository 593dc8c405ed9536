// Written by ftx: the captured decoding step of GPT-J (see ftx_cuda_graph.h).

#include "src/fastertransformer/kernels/ftx_cuda_graph.h"
#include "src/fastertransformer/utils/cuda_utils.h"
#include "src/fastertransformer/utils/logger.h"

#include <algorithm>
#include <cstdio>
#include <exception>

namespace fastertransformer {

FtxGraphStep& ftxGraphStep()
{
    static thread_local FtxGraphStep step;
    return step;
}

// the thresholds of mmha_launch_kernel (decoder_masked_multihead_attention_*.cu)
int ftxMmhaBand(int timestep)
{
    return timestep < 32 ? 0 : (timestep < 2048 ? 1 : 2);
}

int ftxMmhaBandLast(int band)
{
    return band == 0 ? 31 : (band == 1 ? 2047 : 1 << 30);
}

FtxStepGraph::~FtxStepGraph()
{
    drop();
    if (device_timestep_ != nullptr) {
        cudaFree(device_timestep_);
    }
}

void FtxStepGraph::drop()
{
    if (exec_ != nullptr) {
        cudaGraphExecDestroy(exec_);
        exec_ = nullptr;
    }
    band_ = -1;
}

void FtxStepGraph::begin(bool usable)
{
    drop();
    usable_ = usable;
    steps_  = 0;
}

void FtxStepGraph::run(cudaStream_t stream, int timestep, int max_timestep, const std::function<void()>& step)
{
    if (!usable_ || steps_++ == 0) {
        step();  // the first step of a forward sizes the layers' buffers: never inside a capture
        return;
    }
    if (device_timestep_ == nullptr) {
        check_cuda_error(cudaMalloc(&device_timestep_, sizeof(int)));
    }
    invokeFtxStoreInt(device_timestep_, timestep, stream);
    const int band = ftxMmhaBand(timestep);
    if (exec_ == nullptr || band != band_) {
        drop();
        if (!capture(stream, band, max_timestep, step)) {
            usable_ = false;  // this forward goes on eagerly (the step itself included: nothing of it has run)
            step();
            return;
        }
    }
    check_cuda_error(cudaGraphLaunch(exec_, stream));
}

bool FtxStepGraph::capture(cudaStream_t stream, int band, int max_timestep, const std::function<void()>& step)
{
    std::string  why;
    cudaGraph_t  graph = nullptr;
    cudaError_t  error = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (error == cudaSuccess) {
        ftxGraphStep() = FtxGraphStep{device_timestep_, std::min(ftxMmhaBandLast(band), max_timestep)};
        try {
            step();
        }
        catch (const std::exception& e) {
            why = e.what();
        }
        ftxGraphStep()          = FtxGraphStep{};
        const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
        if (why.empty() && ended != cudaSuccess) {
            why = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
        }
    }
    else {
        why = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(error);
    }
    if (why.empty()) {
        error = cudaGraphInstantiate(&exec_, graph, 0);
        if (error != cudaSuccess) {
            why   = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(error);
            exec_ = nullptr;
        }
    }
    size_t nodes = 0;
    if (graph != nullptr) {
        cudaGraphGetNodes(graph, nullptr, &nodes);
        cudaGraphDestroy(graph);
    }
    if (!why.empty()) {
        cudaGetLastError();  // clear the capture's error: the eager path goes on from here
        FT_LOG_WARNING("ftx: the decoding step could not be captured in a CUDA graph (%s); this forward runs "
                       "eagerly",
                       why.c_str());
        std::fflush(stdout);  // as below: the log file should hold the line now, not at the server's exit
        return false;
    }
    band_ = band;
    if (!said_captured_) {
        said_captured_ = true;
        FT_LOG_INFO("ftx: decoding step captured in a CUDA graph (%zu nodes), replayed at each step", nodes);
        std::fflush(stdout);  // the logger writes INFO to stdout, which a server's log file would hold until exit
    }
    return true;
}

}  // namespace fastertransformer
