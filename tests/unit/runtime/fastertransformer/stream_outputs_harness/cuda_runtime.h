// A FAKE CUDA runtime for the stream outputs' test (no GPU here): "device" memory is host memory; each copy is
// counted, and FAKE_COPY_FAILS=1 makes copies fail.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
enum cudaMemcpyKind { cudaMemcpyDefault = 4 };

inline int fake_copies = 0;

inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind)
{
    fake_copies++;
    const char* fails = std::getenv("FAKE_COPY_FAILS");
    if (fails != nullptr && fails[0] == '1') {
        return cudaErrorInvalidValue;
    }
    std::memcpy(dst, src, bytes);
    return cudaSuccess;
}
