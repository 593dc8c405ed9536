// The fake CUDA runtime of cuda_utils.h: pinned memory is malloc'ed, copies wait in a queue until an event
// recorded after them is synchronized (then they read their source), and only the legacy stream is accepted.
#include "src/fastertransformer/utils/cuda_utils.h"

#include <cstdlib>
#include <cstring>
#include <deque>

struct FakeEvent {
    int recorded = 0;
};

namespace {

struct Op {
    char*       dst;
    const char* src;
    size_t      count;
    FakeEvent*  event;  // a record when set, else a copy
};

std::deque<Op> queue;
cudaError_t    last_error = cudaSuccess;
size_t         pinned     = 0;

cudaError_t fail(cudaError_t error)
{
    last_error = error;
    return error;
}

}  // namespace

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags)
{
    if (std::getenv("FAKE_PIN_FAIL") != nullptr || flags != cudaHostAllocPortable) {
        return fail(cudaErrorMemoryAllocation);
    }
    *ptr = std::malloc(size);
    pinned += 1;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr)
{
    std::free(ptr);
    pinned -= 1;
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
    return error == cudaErrorMemoryAllocation ? "out of memory" : "error";
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags)
{
    *event = new FakeEvent();
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (stream != cudaStreamLegacy) {
        return fail(cudaErrorInvalidValue);
    }
    event->recorded += 1;
    queue.push_back(Op{nullptr, nullptr, 0, event});
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    size_t last = queue.size();
    for (size_t i = 0; i < queue.size(); ++i) {
        if (queue[i].event == event) {
            last = i;
        }
    }
    if (last == queue.size()) {
        return cudaSuccess;  // nothing of it in flight
    }
    for (size_t i = 0; i <= last; ++i) {
        const Op op = queue.front();
        queue.pop_front();
        if (op.event == nullptr) {
            std::memcpy(op.dst, op.src, op.count);
        }
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream)
{
    if (stream != cudaStreamLegacy || kind != cudaMemcpyHostToDevice) {
        return fail(cudaErrorInvalidValue);
    }
    queue.push_back(Op{static_cast<char*>(dst), static_cast<const char*>(src), count, nullptr});
    return cudaSuccess;
}

size_t fakePendingCopies()
{
    size_t copies = 0;
    for (const Op& op : queue) {
        copies += op.event == nullptr ? 1 : 0;
    }
    return copies;
}

size_t fakePinnedBuffers()
{
    return pinned;
}
