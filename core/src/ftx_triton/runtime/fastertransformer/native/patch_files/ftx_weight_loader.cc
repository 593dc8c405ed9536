/*
 * ftx: the pinned weight loader and the per-thread load counts (see ftx_weight_loader.h).
 */
#include "src/fastertransformer/utils/ftx_weight_loader.h"

#include "src/fastertransformer/utils/cuda_utils.h"
#include "src/fastertransformer/utils/logger.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace fastertransformer {

namespace {

// Each of the two staging buffers: a 16 MB read from the page cache takes a few milliseconds, its copy over
// PCIe a fraction of that, so the copies hide behind the reads. (ftx's CPU tests build it with small chunks.)
#ifndef FTX_WEIGHT_CHUNK_BYTES
#define FTX_WEIGHT_CHUNK_BYTES (size_t(16) << 20)
#endif
const size_t kFtxChunkBytes = FTX_WEIGHT_CHUNK_BYTES;

thread_local FtxWeightLoadStats ftx_stats;

// The two pinned buffers of one loading thread, kept for the thread's life: pinning takes milliseconds and a
// model has hundreds of files. Portable: any device's copies may read them.
struct FtxStaging {
    char* buffer[2] = {nullptr, nullptr};
    bool  failed    = false;

    FtxStaging() = default;
    FtxStaging(const FtxStaging&)            = delete;
    FtxStaging& operator=(const FtxStaging&) = delete;

    ~FtxStaging()
    {
        for (char* b : buffer) {
            if (b != nullptr) {
                cudaFreeHost(b);  // not checked: when the process exits the CUDA runtime may be gone already
            }
        }
    }

    bool ready()
    {
        for (int i = 0; i < 2 && !failed; ++i) {
            if (buffer[i] != nullptr) {
                continue;
            }
            void*             p      = nullptr;
            const cudaError_t result = cudaHostAlloc(&p, kFtxChunkBytes, cudaHostAllocPortable);
            if (result != cudaSuccess) {
                cudaGetLastError();  // clear it: FasterTransformer's later error checks must not see it
                failed = true;
                FT_LOG_WARNING("ftx: cannot pin %zu bytes to load weights through (%s); this thread reads them "
                               "as upstream does",
                               kFtxChunkBytes,
                               cudaGetErrorString(result));
            }
            else {
                buffer[i] = static_cast<char*>(p);
            }
        }
        return !failed;
    }
};

thread_local FtxStaging ftx_staging;

// Closes the file however the load ends.
struct FtxFile {
    int fd;
    explicit FtxFile(int descriptor): fd(descriptor) {}
    FtxFile(const FtxFile&)            = delete;
    FtxFile& operator=(const FtxFile&) = delete;
    ~FtxFile()
    {
        if (fd >= 0) {
            close(fd);
        }
    }
};

// Reads `n` bytes into `dst`, fewer only at the end of the file or on a read error; returns the bytes read.
size_t ftxReadFully(int fd, char* dst, size_t n)
{
    size_t done = 0;
    while (done < n) {
        const ssize_t got = read(fd, dst + done, n - done);
        if (got > 0) {
            done += static_cast<size_t>(got);
        }
        else if (got < 0 && errno == EINTR) {
            continue;
        }
        else {
            break;  // the end of the file, or an error: the caller reports a short file
        }
    }
    return done;
}

// The chunks' copies, on the legacy default stream: ordered after the weight's allocation and random
// initialization there, as upstream's synchronous cudaMemcpy is. Buffer i is refilled only once the event
// recorded after its last copy has passed; no copy is left reading a buffer when this ends, however it ends.
class FtxCopies {
public:
    FtxCopies() = default;
    FtxCopies(const FtxCopies&)            = delete;
    FtxCopies& operator=(const FtxCopies&) = delete;

    ~FtxCopies()
    {
        for (int i = 0; i < 2; ++i) {
            if (pending_[i]) {
                cudaEventSynchronize(done_[i]);  // not checked: an error was thrown already
            }
            if (done_[i] != nullptr) {
                cudaEventDestroy(done_[i]);
            }
        }
    }

    void start()
    {
        for (int i = 0; i < 2; ++i) {
            check_cuda_error(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
        }
    }

    // Wait until buffer i may be written again.
    void wait(int i)
    {
        if (pending_[i]) {
            pending_[i] = false;
            check_cuda_error(cudaEventSynchronize(done_[i]));
        }
    }

    void copy(char* dst, const char* src, size_t n, int i)
    {
        check_cuda_error(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, cudaStreamLegacy));
        check_cuda_error(cudaEventRecord(done_[i], cudaStreamLegacy));
        pending_[i] = true;
    }

    // Wait for every copy: the weight is on the GPU and both buffers are free.
    void finish()
    {
        wait(0);
        wait(1);
    }

private:
    cudaEvent_t done_[2]    = {nullptr, nullptr};
    bool        pending_[2] = {false, false};
};

bool ftxUpstreamLoaderChosen()
{
    const char* value = std::getenv("FTX_FT_LOADER");
    return value != nullptr && std::strcmp(value, "upstream") == 0;
}

}  // namespace

bool ftxPinnedLoaderReady()
{
    static const bool upstream = ftxUpstreamLoaderChosen();
    return !upstream && ftx_staging.ready();
}

size_t
ftxLoadWeightToDevice(void* dst, const std::vector<size_t>& shape, size_t elem_bytes, const std::string& filename)
{
    // upstream's checks, in its order and with its messages (ftx's server-log scan reads them)
    if (shape.size() > 2) {
        printf("[ERROR] shape should have less than two dims \n");
        return 0;
    }
    const size_t dim0 = shape.empty() ? 0 : shape[0];
    const size_t dim1 = shape.size() == 2 ? shape[1] : 1;
    const size_t size = dim0 * dim1;
    if (size == 0) {
        FT_LOG_WARNING("shape is zero, skip loading weight from file %s \n", filename.c_str());
        return 0;
    }
    const size_t bytes = size * elem_bytes;
    FT_CHECK_WITH_INFO(ftx_staging.buffer[0] != nullptr && ftx_staging.buffer[1] != nullptr,
                       "ftxLoadWeightToDevice needs ftxPinnedLoaderReady() to have returned true on this thread");

    FtxFile file(open(filename.c_str(), O_RDONLY | O_CLOEXEC));
    if (file.fd < 0) {
        FT_LOG_WARNING("file %s cannot be opened, loading model fails! \n", filename.c_str());
        return 0;
    }
    struct stat info;
    if (fstat(file.fd, &info) == 0 && S_ISREG(info.st_mode) && static_cast<size_t>(info.st_size) < bytes) {
        // upstream reads the whole short file and then refuses it: nothing of it reaches the GPU
        FT_LOG_WARNING("file %s only has %ld, but request %ld, loading model fails! \n",
                       filename.c_str(),
                       static_cast<long>(info.st_size),
                       static_cast<long>(bytes));
        return 0;
    }
    posix_fadvise(file.fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // a read-ahead hint: its result does not matter
    FT_LOG_DEBUG("Read %zu bytes from %s", bytes, filename.c_str());

    char* const device = static_cast<char*>(dst);
    FtxCopies   copies;
    copies.start();
    size_t offset = 0;
    int    i      = 0;
    while (offset < bytes) {
        const size_t n = std::min(kFtxChunkBytes, bytes - offset);
        copies.wait(i);  // buffer i's previous chunk has reached the GPU
        const size_t got = ftxReadFully(file.fd, ftx_staging.buffer[i], n);
        if (got != n) {
            // the file shrank since fstat, or a read failed: warned as upstream warns of a short file (the chunks
            // before it are on the GPU already; upstream would have copied none)
            copies.finish();
            FT_LOG_WARNING("file %s only has %ld, but request %ld, loading model fails! \n",
                           filename.c_str(),
                           static_cast<long>(offset + got),
                           static_cast<long>(bytes));
            return 0;
        }
        copies.copy(device + offset, ftx_staging.buffer[i], n, i);
        offset += n;
        i = 1 - i;
    }
    copies.finish();
    return bytes;
}

FtxWeightLoadStats ftxWeightLoadStats()
{
    return ftx_stats;
}

void ftxCountWeightLoad(size_t bytes, double seconds, bool pinned)
{
    ftx_stats.seconds += seconds;
    if (bytes > 0) {
        ftx_stats.files += 1;
        ftx_stats.bytes += bytes;
        if (pinned) {
            ftx_stats.pinned_files += 1;
        }
    }
}

std::string ftxWeightLoadMessage(int rank, int device, double total_seconds)
{
    const FtxWeightLoadStats stats  = ftx_stats;
    const double             gb     = static_cast<double>(stats.bytes) / 1e9;
    const double             rate   = stats.seconds > 0.0 ? gb / stats.seconds : 0.0;
    const char*              loader = stats.files == 0                  ? "no" :
                                      stats.pinned_files == stats.files ? "pinned" :
                                      stats.pinned_files == 0           ? "upstream" :
                                                                          "mixed";
    char text[320];
    snprintf(text,
             sizeof(text),
             "ftx: weights of rank %d on GPU %d loaded: %zu bytes (%.3f GB) from %zu files in %.3f s (%.2f GB/s, %s "
             "loader); %.3f s in all",
             rank,
             device,
             stats.bytes,
             gb,
             stats.files,
             stats.seconds,
             rate,
             loader,
             total_seconds);
    return std::string(text);
}

}  // namespace fastertransformer
