// Written by ftx: FasterTransformer's custom all-reduce kernels for 2, 4 and 8 GPUs of one process.
//
// Replaces custom_ar_kernels.cu in the build (same header, same entry point). Every rank's input lies in its
// own communication buffer (the layer wrote its output there), readable by its peers over NVLink/P2P.
//
// - one-shot: each rank reads the whole message from every rank and sums it (one barrier in, one out);
//   used at 2 ranks always (a two-shot moves as many bytes over the link there) and for small messages at 4
//   and 8.
// - two-shot: rank r sums part r of the message from every rank into its own buffer, then every rank gathers
//   the other parts (a barrier in, one between the phases, one out); at 4 and 8 ranks for large messages.
//
// Every rank sums in rank order 0..N-1, so all ranks hold the same bits; at 2 ranks the sum is a + b, the
// value NCCL computes. The barrier that ends each call (upstream's kernels had none) keeps a rank from
// writing its next input into its buffer while a peer still reads the previous one. Flags count up from 1
// and are compared for equality (no wrap-around at which the wait would be skipped).
//
// Device-counted flags (ftx_block_flags set: the CUDA graph is on, where a decoding step is captured in a CUDA
// graph and replayed, so a flag passed by value would repeat): block b of each rank keeps its own counter on its
// GPU, takes the next flag from it, meets block b of every rank at a start barrier of its own and stores the flag
// back when it is done. Every rank launches the same grids in the same order, so block b's counters agree.

#include "custom_ar_kernels.h"

#include <algorithm>
#include "src/fastertransformer/utils/cuda_type_utils.cuh"

namespace fastertransformer {

namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void flag_store_release(uint32_t* addr, uint32_t value)
{
    asm volatile("st.global.release.sys.b32 [%1], %0;" ::"r"(value), "l"(addr) : "memory");
}

__device__ __forceinline__ uint32_t flag_load_acquire(const uint32_t* addr)
{
    uint32_t value;
    asm volatile("ld.global.acquire.sys.b32 %0, [%1];" : "=r"(value) : "l"(addr) : "memory");
    return value;
}

// Block `slot_block` of every rank meets here: thread q < NRANKS writes this rank's flag into rank q's slots,
// then waits for rank q's flag in this rank's slots.
template<int NRANKS>
__device__ __forceinline__ void barrier(uint32_t* const* peer_flags, size_t local_rank, size_t base, uint32_t flag)
{
    __syncthreads();
    if (threadIdx.x < NRANKS) {
        const int q = threadIdx.x;
        flag_store_release(peer_flags[q] + base + local_rank, flag);
        const uint32_t* mine = peer_flags[local_rank] + base + q;
        while (flag_load_acquire(mine) != flag) {}
    }
    __syncthreads();
}

// The start: block 0 of each rank says its input is written; every block waits for all ranks.
template<int NRANKS>
__device__ __forceinline__ void start(uint32_t* const* peer_flags, size_t local_rank, uint32_t flag)
{
    if (threadIdx.x < NRANKS) {
        const int q = threadIdx.x;
        if (blockIdx.x == 0) {
            flag_store_release(peer_flags[q] + local_rank, flag);
        }
        while (flag_load_acquire(peer_flags[local_rank] + q) != flag) {}
    }
    __syncthreads();
}

__device__ __forceinline__ size_t smaller(size_t a, size_t b)
{
    return a < b ? a : b;
}

// 16 bytes of T summed element-wise.
template<typename T>
__device__ __forceinline__ uint4 add16(uint4 a, uint4 b);

template<>
__device__ __forceinline__ uint4 add16<uint16_t>(uint4 a, uint4 b)
{
    uint4 c;
    half2* x = reinterpret_cast<half2*>(&a);
    half2* y = reinterpret_cast<half2*>(&b);
    half2* z = reinterpret_cast<half2*>(&c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        z[i] = __hadd2(x[i], y[i]);
    }
    return c;
}

template<>
__device__ __forceinline__ uint4 add16<uint32_t>(uint4 a, uint4 b)
{
    uint4 c;
    c.x = __float_as_uint(__uint_as_float(a.x) + __uint_as_float(b.x));
    c.y = __float_as_uint(__uint_as_float(a.y) + __uint_as_float(b.y));
    c.z = __float_as_uint(__uint_as_float(a.z) + __uint_as_float(b.z));
    c.w = __float_as_uint(__uint_as_float(a.w) + __uint_as_float(b.w));
    return c;
}

#ifdef ENABLE_BF16
template<>
__device__ __forceinline__ uint4 add16<__nv_bfloat16>(uint4 a, uint4 b)
{
    uint4           c;
    __nv_bfloat162* x = reinterpret_cast<__nv_bfloat162*>(&a);
    __nv_bfloat162* y = reinterpret_cast<__nv_bfloat162*>(&b);
    __nv_bfloat162* z = reinterpret_cast<__nv_bfloat162*>(&c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        z[i] = bf16hadd2(x[i], y[i]);
    }
    return c;
}
#endif

// The message in 16-byte units, read from every rank and summed in rank order.
template<typename T, int NRANKS>
__device__ __forceinline__ uint4 sum_ranks(const uint4* const* src, size_t unit)
{
    uint4 v[NRANKS];
#pragma unroll
    for (int r = 0; r < NRANKS; ++r) {
        v[r] = __ldcg(src[r] + unit);
    }
    uint4 s = v[0];
#pragma unroll
    for (int r = 1; r < NRANKS; ++r) {
        s = add16<T>(s, v[r]);
    }
    return s;
}

// Each rank's flags: [start: RANKS_PER_NODE][middle: FTX_AR_MAX_BLOCKS x RANKS_PER_NODE][end: the same]
// [each block's start, device-counted flags: the same].
__device__ __forceinline__ size_t middle_slots(int block)
{
    return RANKS_PER_NODE * (1 + block);
}

__device__ __forceinline__ size_t end_slots(int block)
{
    return RANKS_PER_NODE * (1 + FTX_AR_MAX_BLOCKS + block);
}

__device__ __forceinline__ size_t start_slots(int block)
{
    return RANKS_PER_NODE * (1 + 2 * FTX_AR_MAX_BLOCKS + block);
}

// This call's flag: the host's, or (device-counted) the next of this block's counter, and the start barrier.
template<typename T, int NRANKS>
__device__ __forceinline__ uint32_t begin_call(const AllReduceParams<T>& params)
{
    uint32_t* const* peer_flags = params.peer_barrier_ptrs;
    if (params.ftx_block_flags == nullptr) {
        start<NRANKS>(peer_flags, params.local_rank, params.barrier_flag);
        return params.barrier_flag;
    }
    const uint32_t last = *(volatile uint32_t*)(params.ftx_block_flags + blockIdx.x);
    const uint32_t flag = last + 1 == 0 ? 1 : last + 1;
    barrier<NRANKS>(peer_flags, params.local_rank, start_slots(blockIdx.x), flag);
    return flag;
}

// After the end barrier (every thread of the block has read the counter): the block's counter moves on.
template<typename T>
__device__ __forceinline__ void end_call(const AllReduceParams<T>& params, uint32_t flag)
{
    if (params.ftx_block_flags != nullptr && threadIdx.x == 0) {
        params.ftx_block_flags[blockIdx.x] = flag;
    }
}

template<typename T, int NRANKS>
__global__ void __launch_bounds__(kThreads) one_shot(AllReduceParams<T> params)
{
    const uint32_t   flag       = begin_call<T, NRANKS>(params);
    const size_t     local_rank = params.local_rank;
    uint32_t* const* peer_flags = params.peer_barrier_ptrs;

    const uint4* src[NRANKS];
#pragma unroll
    for (int r = 0; r < NRANKS; ++r) {
        src[r] = reinterpret_cast<const uint4*>(params.peer_comm_buffer_ptrs[r]);
    }
    uint4*       out   = reinterpret_cast<uint4*>(params.local_output_buffer_ptr);
    const size_t units = params.elts_total * sizeof(T) / 16;
    for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units; u += (size_t)gridDim.x * blockDim.x) {
        out[u] = sum_ranks<T, NRANKS>(src, u);
    }
    // the end: this block's share of every peer's buffer has been read by every rank's block of this index
    barrier<NRANKS>(peer_flags, local_rank, end_slots(blockIdx.x), flag);
    end_call(params, flag);
}

template<typename T, int NRANKS>
__global__ void __launch_bounds__(kThreads) two_shot(AllReduceParams<T> params)
{
    const uint32_t   flag       = begin_call<T, NRANKS>(params);
    const size_t     local_rank = params.local_rank;
    uint32_t* const* peer_flags = params.peer_barrier_ptrs;

    const uint4* src[NRANKS];
#pragma unroll
    for (int r = 0; r < NRANKS; ++r) {
        src[r] = reinterpret_cast<const uint4*>(params.peer_comm_buffer_ptrs[r]);
    }
    uint4*       mine   = reinterpret_cast<uint4*>(params.peer_comm_buffer_ptrs[local_rank]);
    uint4*       out    = reinterpret_cast<uint4*>(params.local_output_buffer_ptr);
    const size_t units  = params.elts_total * sizeof(T) / 16;
    const size_t part   = (units + NRANKS - 1) / NRANKS;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first  = blockIdx.x * (size_t)blockDim.x + threadIdx.x;

    // phase 1: part `local_rank`, summed from every rank, into this rank's buffer and the output
    {
        const size_t begin = local_rank * part;
        const size_t stop  = smaller(begin + part, units);
        for (size_t u = begin + first; u < stop; u += stride) {
            const uint4 s = sum_ranks<T, NRANKS>(src, u);
            mine[u]       = s;
            out[u]        = s;
        }
    }
    __threadfence_system();  // the sums this thread wrote, seen by the peers that gather them
    barrier<NRANKS>(peer_flags, local_rank, middle_slots(blockIdx.x), flag);
    // phase 2: the other parts, from the rank that summed each
#pragma unroll
    for (int k = 1; k < NRANKS; ++k) {
        const int    r     = (local_rank + k) % NRANKS;
        const size_t begin = r * part;
        const size_t stop  = smaller(begin + part, units);
        for (size_t u = begin + first; u < stop; u += stride) {
            out[u] = __ldcg(src[r] + u);
        }
    }
    barrier<NRANKS>(peer_flags, local_rank, end_slots(blockIdx.x), flag);
    end_call(params, flag);
}

template<typename T, int NRANKS>
void launch(AllReduceParams<T>& param, cudaStream_t stream)
{
    const size_t bytes   = param.elts_total * sizeof(T);
    const bool   one     = NRANKS == 2 || bytes <= FTX_AR_ONE_SHOT_BYTES;
    const size_t units   = bytes / 16;
    const size_t per_run = one ? units : (units + NRANKS - 1) / NRANKS;
    int          threads = kThreads;
    if (per_run < (size_t)kThreads) {
        threads = (int)std::max<size_t>(32, (per_run + 31) / 32 * 32);
    }
    const int blocks = (int)std::min<size_t>(FTX_AR_MAX_BLOCKS, std::max<size_t>(1, (per_run + threads - 1) / threads));
    if (one) {
        one_shot<T, NRANKS><<<blocks, threads, 0, stream>>>(param);
    }
    else {
        two_shot<T, NRANKS><<<blocks, threads, 0, stream>>>(param);
    }
}

}  // namespace

template<typename T>
void invokeOneOrTwoShotAllReduceKernel(AllReduceParams<T>& param, cudaStream_t stream)
{
    switch (param.ranks) {
        case 2: launch<T, 2>(param, stream); break;
        case 4: launch<T, 4>(param, stream); break;
        case 8: launch<T, 8>(param, stream); break;
        default: FT_CHECK_WITH_INFO(false, fmtstr("custom all-reduce for %zu ranks: only 2, 4 and 8", param.ranks));
    }
}

template void invokeOneOrTwoShotAllReduceKernel<uint16_t>(AllReduceParams<uint16_t>& param, cudaStream_t stream);
#ifdef ENABLE_BF16
template void invokeOneOrTwoShotAllReduceKernel<__nv_bfloat16>(AllReduceParams<__nv_bfloat16>& param,
                                                               cudaStream_t                    stream);
#endif
template void invokeOneOrTwoShotAllReduceKernel<uint32_t>(AllReduceParams<uint32_t>& param, cudaStream_t stream);

}  // namespace fastertransformer
