// A stand-in for FasterTransformer's cuda_utils.h and the CUDA runtime, for testing ftx's weight loader on a
// machine without a GPU. Copies are deferred, as a real asynchronous copy is: each runs only when an event
// recorded after it is synchronized, and reads its source buffer then, so a buffer refilled before its copy
// was awaited shows as wrong bytes on the "device".
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include "src/fastertransformer/utils/logger.h"

enum cudaError_t {
    cudaSuccess               = 0,
    cudaErrorInvalidValue     = 1,
    cudaErrorMemoryAllocation = 2,
};
enum cudaMemcpyKind {
    cudaMemcpyHostToDevice = 1,
};
struct FakeEvent;
struct FakeStream;
typedef FakeEvent*  cudaEvent_t;
typedef FakeStream* cudaStream_t;

#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaHostAllocPortable 0x01
#define cudaEventDisableTiming 0x02

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream);

// What the fake runtime saw: copies not yet run, pinned buffers alive.
size_t fakePendingCopies();
size_t fakePinnedBuffers();

namespace fastertransformer {

inline void fakeCheck(cudaError_t result, const char* what)
{
    if (result != cudaSuccess) {
        throw std::runtime_error(std::string("[FT][ERROR] CUDA runtime error: ") + what);
    }
}

#define check_cuda_error(val) fastertransformer::fakeCheck((val), #val)
#define FT_CHECK_WITH_INFO(val, info)                                                                                  \
    do {                                                                                                               \
        if (!(val)) {                                                                                                  \
            throw std::runtime_error(std::string("[FT][ERROR] ") + (info));                                         \
        }                                                                                                              \
    } while (0)

}  // namespace fastertransformer
