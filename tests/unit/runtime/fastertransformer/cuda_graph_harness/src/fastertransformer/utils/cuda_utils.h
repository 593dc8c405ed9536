// A stand-in for FasterTransformer's cuda_utils.h: check_cuda_error throws as FasterTransformer's does.
#pragma once

#include <cuda_runtime.h>
#include <stdexcept>
#include <string>

#include "src/fastertransformer/utils/logger.h"

namespace fastertransformer {

inline void fakeCheck(cudaError_t result, const char* what)
{
    if (result != cudaSuccess) {
        throw std::runtime_error(std::string("[FT][ERROR] CUDA runtime error: ") + cudaGetErrorString(result) + " "
                                 + what);
    }
}

#define check_cuda_error(val) fastertransformer::fakeCheck((val), #val)

}  // namespace fastertransformer
