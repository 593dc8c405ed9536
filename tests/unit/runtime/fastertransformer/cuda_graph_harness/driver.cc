// Drives ftx's FtxStepGraph as GptJ's forward does, against the fake CUDA runtime.
//
//   driver setting VALUE|- DEBUG_LEVEL|-         -> "on" or "off", and the problem if any
//   driver bands T...                            -> each timestep's band and the band's last timestep
//   driver forward MAX_INPUT MAX_OUTPUT PREFIX USABLE MODE [MAX_INPUT MAX_OUTPUT PREFIX USABLE MODE ...]
//     MODE: ok | unsafe (the step makes a call no capture allows) | throw (that call's error is checked)
//     prints each attention kernel that ran: "timestep T band B sized M" (B: the band of the launch's timestep
//     M, which sizes its shared memory), then the fake's counts
#include "src/fastertransformer/kernels/ftx_cuda_graph.h"
#include "src/fastertransformer/utils/cuda_utils.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace fastertransformer;

namespace {

// the attention dispatch as patched: the host's timestep, or the device's while a step is captured
void attention(cudaStream_t stream, int timestep)
{
    const FtxGraphStep& captured = ftxGraphStep();
    const int*          device   = captured.device_timestep;
    const int           launch   = device != nullptr ? captured.max_timestep : timestep;
    fakeLaunch(stream, [=]() {
        const int seen = device != nullptr ? *device : timestep;
        std::printf("timestep %d band %d sized %d\n", seen, ftxMmhaBand(launch), launch);
    });
}

void forward(FtxStepGraph& graph, int max_input, int max_output, int prefix, bool usable, const std::string& mode)
{
    cudaStream_t stream = fakeStream();
    graph.begin(usable);
    for (int step = max_input; step < max_output; step++) {
        if (max_input > 1 && step == max_input) {
            continue;  // the context decoder's step: GptJ runs no decoder layers then
        }
        graph.run(stream, step + prefix - 1, max_output - 2 + prefix, [&]() {
            if (mode == "unsafe") {
                fakeUnsafeCall(stream);
            }
            else if (mode == "throw") {
                check_cuda_error(fakeUnsafeCall(stream));
            }
            attention(stream, step + prefix - 1);
        });
    }
}

}  // namespace

int main(int argc, char** argv)
{
    const std::string what = argc > 1 ? argv[1] : "";
    if (what == "setting" && argc == 5) {
        std::string problem;
        const bool  on = ftxCudaGraphSetting(std::strcmp(argv[2], "-") == 0 ? nullptr : argv[2],
                                            std::strcmp(argv[3], "-") == 0 ? nullptr : argv[3],
                                            std::strcmp(argv[4], "on") == 0,
                                            &problem);
        std::printf("%s\n%s\n", on ? "on" : "off", problem.c_str());
        return 0;
    }
    if (what == "bands") {
        for (int i = 2; i < argc; i++) {
            const int band = ftxMmhaBand(std::atoi(argv[i]));
            std::printf("%s %d %d\n", argv[i], band, ftxMmhaBandLast(band));
        }
        return 0;
    }
    if (what == "forward" && (argc - 2) % 5 == 0) {
        {
            FtxStepGraph graph;
            for (int i = 2; i < argc; i += 5) {
                forward(graph, std::atoi(argv[i]), std::atoi(argv[i + 1]), std::atoi(argv[i + 2]),
                        std::atoi(argv[i + 3]) != 0, argv[i + 4]);
                std::printf("forward done: instantiated %d\n", fakeInstantiated());
            }
        }
        std::printf("graphs alive %d allocations %d\n", fakeGraphsAlive(), fakeDeviceAllocations());
        return 0;
    }
    std::fprintf(stderr, "usage: driver setting|bands|forward ...\n");
    return 2;
}
