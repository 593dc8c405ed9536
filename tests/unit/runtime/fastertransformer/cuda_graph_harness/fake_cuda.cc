// The fake CUDA runtime of cuda_runtime.h (see there).
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <vector>

struct FakeGraph {
    std::vector<std::function<void()>> nodes;
};
struct FakeGraphExec {
    std::vector<std::function<void()>> nodes;
};
struct FakeStream {
    FakeGraph* graph       = nullptr;
    bool       invalidated = false;
};

namespace {
cudaError_t last_error   = cudaSuccess;
int         graphs_alive = 0;
int         instantiated = 0;
int         allocations  = 0;
FakeStream  the_stream;

cudaError_t fail(cudaError_t error)
{
    last_error = error;
    return error;
}
}  // namespace

cudaStream_t fakeStream()
{
    return &the_stream;
}

cudaError_t cudaMalloc(void** ptr, size_t size)
{
    *ptr = std::calloc(1, size);
    allocations++;
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr)
{
    std::free(ptr);
    allocations--;
    return cudaSuccess;
}

cudaError_t cudaGetLastError()
{
    const cudaError_t error = last_error;
    last_error              = cudaSuccess;
    return error;
}

const char* cudaGetErrorString(cudaError_t error)
{
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
        default: return "some error";
    }
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode)
{
    if (stream->graph != nullptr || mode != cudaStreamCaptureModeThreadLocal || std::getenv("FAKE_BEGIN_FAIL")) {
        return fail(cudaErrorInvalidValue);
    }
    stream->graph = new FakeGraph();
    graphs_alive++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph)
{
    if (stream->graph == nullptr) {
        return fail(cudaErrorInvalidValue);
    }
    FakeGraph* captured = stream->graph;
    stream->graph       = nullptr;
    if (stream->invalidated) {
        stream->invalidated = false;
        delete captured;
        graphs_alive--;
        *graph = nullptr;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *graph = captured;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long)
{
    if (std::getenv("FAKE_INSTANTIATE_FAIL")) {
        return fail(cudaErrorInvalidValue);
    }
    *exec = new FakeGraphExec{graph->nodes};
    graphs_alive++;
    instantiated++;
    return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t*, size_t* count)
{
    *count = graph->nodes.size();
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    graphs_alive--;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    graphs_alive--;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    if (stream->graph != nullptr) {
        return fail(cudaErrorInvalidValue);
    }
    for (auto& node : exec->nodes) {
        node();
    }
    return cudaSuccess;
}

void fakeLaunch(cudaStream_t stream, std::function<void()> kernel)
{
    if (stream->graph != nullptr) {
        stream->graph->nodes.push_back(std::move(kernel));
    }
    else {
        kernel();
    }
}

cudaError_t fakeUnsafeCall(cudaStream_t stream)
{
    if (stream->graph != nullptr) {
        stream->invalidated = true;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    return cudaSuccess;
}

int fakeGraphsAlive()
{
    return graphs_alive;
}

int fakeInstantiated()
{
    return instantiated;
}

int fakeDeviceAllocations()
{
    return allocations;
}

namespace fastertransformer {
// the real one is a one-thread kernel (ftx_cuda_graph_kernels.cu)
void invokeFtxStoreInt(int* destination, int value, cudaStream_t stream)
{
    fakeLaunch(stream, [destination, value]() { *destination = value; });
}
}  // namespace fastertransformer
