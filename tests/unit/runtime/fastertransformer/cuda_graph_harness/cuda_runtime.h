// A stand-in for the CUDA runtime's stream capture and graphs, for testing ftx's captured decoding step
// (patch_files/ftx_cuda_graph.*) on a machine without a GPU. "Device" memory is host memory. Work given to a
// stream runs at once, unless the stream is capturing: then it is recorded, and each launch of the instantiated
// graph runs the recorded work again (reading the device memory of that moment, as a replayed kernel does).
#pragma once

#include <cstddef>
#include <functional>

enum cudaError_t {
    cudaSuccess                        = 0,
    cudaErrorInvalidValue              = 1,
    cudaErrorMemoryAllocation          = 2,
    cudaErrorStreamCaptureUnsupported  = 900,
    cudaErrorStreamCaptureInvalidated  = 901,
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal      = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed     = 2,
};
struct FakeStream;
struct FakeGraph;
struct FakeGraphExec;
struct FakeGraphNode;
typedef FakeStream*    cudaStream_t;
typedef FakeGraph*     cudaGraph_t;
typedef FakeGraphExec* cudaGraphExec_t;
typedef FakeGraphNode* cudaGraphNode_t;

cudaError_t cudaMalloc(void** ptr, size_t size);
template<typename T>
cudaError_t cudaMalloc(T** ptr, size_t size)
{
    return cudaMalloc(reinterpret_cast<void**>(ptr), size);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);

// The fake's own: a kernel launch on `stream` (run now, or recorded while capturing); a call that a capture
// refuses (the capture is invalidated, as by cudaMalloc's sync or a host sync); what it counted.
void        fakeLaunch(cudaStream_t stream, std::function<void()> kernel);
cudaError_t fakeUnsafeCall(cudaStream_t stream);
cudaStream_t fakeStream();
int fakeGraphsAlive();
int fakeInstantiated();
int fakeDeviceAllocations();
