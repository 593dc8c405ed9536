// Written by ftx: FasterTransformer's custom all-reduce communicator for 2, 4 and 8 GPUs of one process.
//
// Replaces custom_ar_comm.cc in the build (same header). The ranks are the model instance's GPUs, counted
// from the current device when initCustomAllReduceComm runs (the backend sets it to the instance's first
// GPU). Every pair of them must reach each other's memory (NVLink or PCIe peer access); where one cannot,
// the log says so and every rank uses NCCL.

#include "custom_ar_comm.h"
#include "src/fastertransformer/kernels/ftx_cuda_graph.h"

namespace fastertransformer {

namespace {

constexpr size_t kFlagBytes = FTX_AR_FLAG_WORDS * sizeof(uint32_t);

// Peer access between every pair of devices [first, first + count); false (and why) where one is missing.
bool peers_reach(int first, size_t count, std::string* why)
{
    int devices = 0;
    check_cuda_error(cudaGetDeviceCount(&devices));
    if (first + (int)count > devices) {
        *why = fmtstr("%zu ranks from GPU %d but only %d GPU(s) are visible", count, first, devices);
        return false;
    }
    for (size_t i = 0; i < count; i++) {
        for (size_t j = 0; j < count; j++) {
            int can = 0;
            if (i != j) {
                check_cuda_error(cudaDeviceCanAccessPeer(&can, first + (int)i, first + (int)j));
                if (!can) {
                    *why = fmtstr("GPU %d cannot access the memory of GPU %d (no NVLink or PCIe peer access)",
                                  first + (int)i,
                                  first + (int)j);
                    return false;
                }
            }
        }
    }
    return true;
}

}  // namespace

template<typename T>
CustomAllReduceComm<T>::CustomAllReduceComm(size_t rank_size, size_t rank): rank_size_(rank_size), rank_(rank)
{
    param_              = AllReduceParams<T>{};
    param_.barrier_flag = 0;
    param_.ranks        = rank_size;
    param_.rank         = rank;
    param_.local_rank   = rank;
    param_.node_id      = 0;
}

template<typename T>
CustomAllReduceComm<T>::~CustomAllReduceComm()
{
    // rank 0 allocated every rank's buffers; each rank frees its own
    if (param_.peer_comm_buffer_ptrs[rank_] != nullptr) {
        cudaFree(param_.peer_comm_buffer_ptrs[rank_]);
    }
    if (param_.peer_barrier_ptrs[rank_] != nullptr) {
        cudaFree(param_.peer_barrier_ptrs[rank_]);
    }
    if (param_.ftx_block_flags != nullptr) {
        cudaFree(param_.ftx_block_flags);
    }
}

template<typename T>
void CustomAllReduceComm<T>::customAllReduce(size_t elts, cudaStream_t stream)
{
    param_.elts_total   = elts;
    param_.barrier_flag = param_.barrier_flag + 1 == 0 ? 1 : param_.barrier_flag + 1;
    invokeOneOrTwoShotAllReduceKernel<T>(param_, stream);
    output_tensor_->at(0).data = (const void*)tmp_tensor_data_;  // the layer's own output buffer again
}

template<typename T>
void CustomAllReduceComm<T>::enableP2P(int ngpus)
{
    int first = 0;
    check_cuda_error(cudaGetDevice(&first));
    for (int i = 0; i < ngpus; i++) {
        check_cuda_error(cudaSetDevice(first + i));
        for (int j = 0; j < ngpus; j++) {
            if (i != j) {
                const cudaError_t done = cudaDeviceEnablePeerAccess(first + j, 0);
                if (done == cudaErrorPeerAccessAlreadyEnabled) {
                    cudaGetLastError();  // enabled before (NCCL, another model instance): fine
                }
                else {
                    check_cuda_error(done);
                }
            }
        }
    }
    check_cuda_error(cudaSetDevice(first));
}

template<typename T>
void CustomAllReduceComm<T>::allocateAndExchangePeerAccessPointer(
    std::vector<std::shared_ptr<AbstractCustomComm>>* custom_all_reduce_comms)
{
    FT_CHECK(custom_all_reduce_comms->size() == rank_size_ && rank_ == 0);
    int first = 0;
    check_cuda_error(cudaGetDevice(&first));
    enableP2P((int)rank_size_);
    std::vector<CustomAllReduceComm<T>*> comms;
    for (auto& comm : *custom_all_reduce_comms) {
        comms.push_back(static_cast<CustomAllReduceComm<T>*>(comm.get()));
    }
    for (size_t i = 0; i < rank_size_; i++) {
        check_cuda_error(cudaSetDevice(first + (int)i));
        T*        buffer = nullptr;
        uint32_t* flags  = nullptr;
        check_cuda_error(cudaMalloc(&buffer, CUSTOM_AR_SIZE_THRESHOLD));
        check_cuda_error(cudaMalloc(&flags, kFlagBytes));
        check_cuda_error(cudaMemset(flags, 0, kFlagBytes));
        for (auto* comm : comms) {
            comm->param_.peer_comm_buffer_ptrs[i] = buffer;
            comm->param_.peer_barrier_ptrs[i]     = flags;
        }
        if (ftxCudaGraphRequested(std::is_same<T, half>::value)) {
            // each block's flag counter, on this rank's GPU (the decoding step may be replayed from a CUDA graph)
            uint32_t* counters = nullptr;
            check_cuda_error(cudaMalloc(&counters, FTX_AR_MAX_BLOCKS * sizeof(uint32_t)));
            check_cuda_error(cudaMemset(counters, 0, FTX_AR_MAX_BLOCKS * sizeof(uint32_t)));
            comms[i]->param_.ftx_block_flags = counters;
        }
    }
    check_cuda_error(cudaDeviceSynchronize());
    check_cuda_error(cudaSetDevice(first));
    for (size_t i = 0; i < rank_size_; i++) {
        comms[i]->param_.local_output_buffer_ptr = comms[i]->param_.peer_comm_buffer_ptrs[i];
    }
}

template<typename T>
bool CustomAllReduceComm<T>::swapInternalBuffer(std::vector<Tensor>* tensor_buffer, size_t elts)
{
    // the kernels move 16-byte units; a message that fits the buffer and is made of them goes through them,
    // any other through NCCL (every rank decides alike: the sizes are the same on all)
    const size_t bytes = elts * sizeof(T);
    if (rank_size_ > 1 && bytes <= CUSTOM_AR_SIZE_THRESHOLD && bytes % 16 == 0) {
        tmp_tensor_data_               = (T*)(tensor_buffer->at(0).data);
        output_tensor_                 = tensor_buffer;
        tensor_buffer->at(0).data      = param_.peer_comm_buffer_ptrs[rank_];
        param_.local_output_buffer_ptr = tmp_tensor_data_;
        return true;
    }
    return false;
}

template<typename T>
void initCustomAllReduceComm(std::vector<std::shared_ptr<AbstractCustomComm>>* custom_all_reduce_comms,
                             int                                               enable_custom_all_reduce,
                             size_t                                            rank_size)
{
    std::string why;
    bool        use = enable_custom_all_reduce != 0 && rank_size > 1;
    if (use && rank_size != 2 && rank_size != 4 && rank_size != 8) {
        why = fmtstr("it runs on 2, 4 or 8 GPUs, not %zu", rank_size);
        use = false;
    }
    int first = 0;
    check_cuda_error(cudaGetDevice(&first));
    if (use && !peers_reach(first, rank_size, &why)) {
        use = false;
    }
    if (!use) {
        if (!why.empty()) {
            FT_LOG_WARNING("custom all-reduce is off: %s; using NCCL", why.c_str());
        }
        for (size_t i = 0; i < rank_size; i++) {
            custom_all_reduce_comms->push_back(nullptr);
        }
        return;
    }
    for (size_t i = 0; i < rank_size; i++) {
        custom_all_reduce_comms->push_back(std::make_shared<CustomAllReduceComm<T>>(rank_size, i));
    }
    custom_all_reduce_comms->at(0)->allocateAndExchangePeerAccessPointer(custom_all_reduce_comms);
    FT_LOG_INFO("custom all-reduce on GPUs %d-%d (%zu ranks, messages up to %d bytes; larger ones through NCCL)",
                first,
                first + (int)rank_size - 1,
                rank_size,
                CUSTOM_AR_SIZE_THRESHOLD);
}

template class CustomAllReduceComm<uint16_t>;
#ifdef ENABLE_BF16
template class CustomAllReduceComm<__nv_bfloat16>;
#endif
template class CustomAllReduceComm<uint32_t>;
template void
initCustomAllReduceComm<uint16_t>(std::vector<std::shared_ptr<AbstractCustomComm>>* custom_all_reduce_comms,
                                  int                                               enable_custom_all_reduce,
                                  size_t                                            rank_size);
#ifdef ENABLE_BF16
template void
initCustomAllReduceComm<__nv_bfloat16>(std::vector<std::shared_ptr<AbstractCustomComm>>* custom_all_reduce_comms,
                                       int                                               enable_custom_all_reduce,
                                       size_t                                            rank_size);
#endif
template void
initCustomAllReduceComm<uint32_t>(std::vector<std::shared_ptr<AbstractCustomComm>>* custom_all_reduce_comms,
                                  int                                               enable_custom_all_reduce,
                                  size_t                                            rank_size);

}  // namespace fastertransformer
