// A CUDA injection library that writes every kernel, memcpy/memset and CUDA API call of a process to a
// tab-separated file, for the decode profile of benchmarks/bench_ft_profile.py (the device image has no
// Nsight Systems). Load it with CUDA_INJECTION64_PATH=.../libftx_cupti_trace.so and name the file with
// FTX_CUPTI_OUT; records are flushed every 200 ms, so a server stopped hard still leaves what it ran.
//
//   nvcc -shared -Xcompiler -fPIC -o libftx_cupti_trace.so cupti_trace.cc -lcupti
//
// Lines: K dev stream start end correlation name | M dev stream start end bytes
// | A thread start end correlation api_name
// (times in ns on CUPTI's clock).
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace {

FILE*      out = nullptr;
std::mutex mu;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records)
{
    *size        = 16 << 20;
    *buffer      = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
    *max_records = 0;
}

const char* api_name(CUpti_CallbackDomain domain, uint32_t cbid)
{
    const char* name = nullptr;
    if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || name == nullptr) {
        return "?";
    }
    return name;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid)
{
    std::lock_guard<std::mutex> lock(mu);
    CUpti_Activity*             record = nullptr;
    while (out != nullptr && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        switch (record->kind) {
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
            case CUPTI_ACTIVITY_KIND_KERNEL: {
                auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(record);
                std::fprintf(out,
                             "K\t%u\t%u\t%llu\t%llu\t%u\t%s\n",
                             k->deviceId,
                             k->streamId,
                             (unsigned long long)k->start,
                             (unsigned long long)k->end,
                             k->correlationId,
                             k->name);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMCPY: {
                auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(record);
                std::fprintf(out,
                             "M\t%u\t%u\t%llu\t%llu\t%llu\n",
                             m->deviceId,
                             m->streamId,
                             (unsigned long long)m->start,
                             (unsigned long long)m->end,
                             (unsigned long long)m->bytes);
                break;
            }
            case CUPTI_ACTIVITY_KIND_RUNTIME:
            case CUPTI_ACTIVITY_KIND_DRIVER: {
                auto* a = reinterpret_cast<CUpti_ActivityAPI*>(record);
                std::fprintf(out,
                             "A\t%u\t%llu\t%llu\t%u\t%s\n",
                             a->threadId,
                             (unsigned long long)a->start,
                             (unsigned long long)a->end,
                             a->correlationId,
                             api_name(record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API :
                                                                                   CUPTI_CB_DOMAIN_DRIVER_API,
                                      a->cbid));
                break;
            }
            default:
                break;
        }
    }
    if (out != nullptr) {
        std::fflush(out);
    }
    std::free(buffer);
}

void flush_at_exit()
{
    cuptiActivityFlushAll(1);
}

}  // namespace

extern "C" int InitializeInjection(void)
{
    const char* path = std::getenv("FTX_CUPTI_OUT");
    out              = std::fopen(path != nullptr ? path : "cupti-trace.tsv", "w");
    if (out == nullptr) {
        return 0;
    }
    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
    cuptiActivityFlushPeriod(200);
    std::atexit(flush_at_exit);
    return 1;
}
