// Written by ftx: the one kernel of the captured decoding step's host side (see ftx_cuda_graph.h).

#include "src/fastertransformer/kernels/ftx_cuda_graph.h"

namespace fastertransformer {

namespace {

__global__ void store_int(int* destination, int value)
{
    *destination = value;
}

}  // namespace

// The step's timestep, written in stream order before the graph that reads it is launched (a kernel argument is
// copied when launched: the host may change its own value at once, unlike a copy from host memory).
void invokeFtxStoreInt(int* destination, int value, cudaStream_t stream)
{
    store_int<<<1, 1, 0, stream>>>(destination, value);
}

}  // namespace fastertransformer
