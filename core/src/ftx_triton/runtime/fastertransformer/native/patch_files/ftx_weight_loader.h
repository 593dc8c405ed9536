/*
 * ftx: FasterTransformer's weight files read straight into pinned staging buffers and copied to the GPU.
 *
 * Upstream's loadWeightFromBinFunc reads every file into a zero-filled std::vector on the host and copies it
 * with a pageable cudaMemcpy: each byte is faulted in, zeroed, read and staged again by the driver. When the
 * file's type is the weight's (ftx's conversion writes it so), ftxLoadWeightToDevice reads the file in chunks
 * into two pinned buffers of this thread and copies each chunk to the GPU asynchronously while the next one is
 * read. Its checks and warnings are upstream's: a missing file, a short file or a zero shape is warned about
 * and the weight is left as it was. FTX_FT_LOADER=upstream in the server's environment keeps upstream's loader
 * (to compare the two), and so does a machine where the buffers cannot be pinned.
 *
 * Each loading thread (the Triton backend loads each GPU's weights on a thread of its own) counts the bytes and
 * seconds of its loads; ftxWeightLoadMessage turns them into the line the backend logs per GPU.
 */
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace fastertransformer {

// Whether this thread's loads take the pinned path: not under FTX_FT_LOADER=upstream, nor when its staging
// buffers cannot be pinned (said once in the log; the loads then read as upstream does).
bool ftxPinnedLoaderReady();

// Load a weight of `shape` (one or two dimensions) of `elem_bytes`-byte elements from `filename` into the device
// memory at `dst`. The same checks and warnings as upstream's loadWeightFromBinHelper; returns the bytes copied,
// 0 when nothing was loaded. Only once ftxPinnedLoaderReady() has returned true on this thread.
size_t
ftxLoadWeightToDevice(void* dst, const std::vector<size_t>& shape, size_t elem_bytes, const std::string& filename);

// The weight loading of the calling thread so far.
struct FtxWeightLoadStats {
    size_t files        = 0;    // files loaded
    size_t pinned_files = 0;    // of which through the pinned loader
    size_t bytes        = 0;    // bytes read from the files
    double seconds      = 0.0;  // seconds inside the loaders (files that failed included)
};

FtxWeightLoadStats ftxWeightLoadStats();

// Count one load on this thread: `bytes` loaded (0: none), in `seconds`.
void ftxCountWeightLoad(size_t bytes, double seconds, bool pinned);

// The server log's line for the weights this thread loaded: rank, GPU, GB, files, seconds, GB/s, the loader,
// and `total_seconds` (the whole of the GPU's weights: allocation and files).
std::string ftxWeightLoadMessage(int rank, int device, double total_seconds);

// Counts one loadWeightFromBinFunc call (its seconds, and the bytes given to loaded()) when it ends.
class FtxWeightLoadTimer {
public:
    FtxWeightLoadTimer(): began_(std::chrono::steady_clock::now()) {}
    FtxWeightLoadTimer(const FtxWeightLoadTimer&)            = delete;
    FtxWeightLoadTimer& operator=(const FtxWeightLoadTimer&) = delete;
    ~FtxWeightLoadTimer()
    {
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - began_;
        ftxCountWeightLoad(bytes_, took.count(), pinned_);
    }
    void loaded(size_t bytes, bool pinned)
    {
        bytes_  = bytes;
        pinned_ = pinned;
    }

private:
    std::chrono::steady_clock::time_point began_;
    size_t                                bytes_  = 0;
    bool                                  pinned_ = false;
};

}  // namespace fastertransformer
