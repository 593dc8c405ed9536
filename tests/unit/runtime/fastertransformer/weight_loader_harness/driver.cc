// Loads weight files through ftx's pinned loader against the fake CUDA runtime, one after the other:
//
//   driver OUT_DIR FILE:DIMS:ELEM_BYTES ...     (DIMS: comma-separated, e.g. 3,5)
//
// Each load's "device" memory starts as 0xAB bytes and is written to OUT_DIR/<n>.bin; stdout gets `ready N`
// per load, `pending N` (copies left in flight after it), and at the end the backend's log line.
#include "src/fastertransformer/utils/cuda_utils.h"
#include "src/fastertransformer/utils/ftx_weight_loader.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv)
{
    using namespace fastertransformer;
    const std::string out = argv[1];
    for (int a = 2; a < argc; ++a) {
        std::stringstream   spec(argv[a]);
        std::string         file, dims, elem;
        std::getline(spec, file, ':');
        std::getline(spec, dims, ':');
        std::getline(spec, elem, ':');
        std::vector<size_t> shape;
        std::stringstream   dim_list(dims);
        size_t              total = 1;
        for (std::string d; std::getline(dim_list, d, ',');) {
            shape.push_back(std::stoul(d));
            total *= shape.back();
        }
        const size_t      bytes = total * std::stoul(elem);
        std::vector<char> device(bytes, static_cast<char>(0xAB));
        const bool        ready = ftxPinnedLoaderReady();
        {
            FtxWeightLoadTimer timer;
            if (ready) {
                timer.loaded(ftxLoadWeightToDevice(device.data(), shape, std::stoul(elem), file), true);
            }
        }
        std::printf("ready %d\npending %zu\n", ready ? 1 : 0, fakePendingCopies());
        FILE* f = std::fopen((out + "/" + std::to_string(a - 2) + ".bin").c_str(), "wb");
        std::fwrite(device.data(), 1, device.size(), f);
        std::fclose(f);
    }
    std::printf("pinned %zu\n%s\n", fakePinnedBuffers(), ftxWeightLoadMessage(3, 1, 2.5).c_str());
    return 0;
}
