"""ftx's patch set: what upstream FasterTransformer and its Triton backend need to build with
CUDA 13 (CCCL 3), C++17 and CMake 4.

Each :class:`Edit` replaces one exact text in one file of the source layout, ``count`` times (once,
unless said); each :class:`NewFile` adds a file of ftx's own (``patch_files/``: the custom all-reduce
for 2, 4 and 8 GPUs, built instead of upstream's 8-GPU-only one). :func:`apply_patches` first checks
every change against the files — the old text must occur exactly ``count`` times and the new text
must not be there already; a new file must not exist — and only then writes, so drifted sources
(another commit, an already patched copy) are refused with nothing changed. The patch set's digest
(with the new files' text) is part of the backend build's cache key.

Written as text edits rather than diff files: each states its reason next to it, needs no patch
tool, and applies or refuses as a whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import structlog

from ftx_triton.errors import SourceError
from ftx_triton.repository.stream_interval import (
    STREAM_AUTO,
    STREAM_AUTO_RESPONSES,
    STREAM_AUTO_RESPONSES_PARAMETER,
    STREAM_INTERVAL_PARAMETER,
)

log = structlog.get_logger(__name__)

FT = "FasterTransformer"
BACKEND_CC = "fastertransformer_backend/src/libfastertransformer.cc"
CUB_INCLUDE = "#include <cub/cub.cuh>\n"
GPTJ_DECODER_CC = f"{FT}/src/fastertransformer/models/gptj/GptJDecoder.cc"
GPTJ_DECODER_H = f"{FT}/src/fastertransformer/models/gptj/GptJDecoder.h"
MEMORY_UTILS_CU = f"{FT}/src/fastertransformer/utils/memory_utils.cu"
GPTJ_CC = f"{FT}/src/fastertransformer/models/gptj/GptJ.cc"
GPTJ_H = f"{FT}/src/fastertransformer/models/gptj/GptJ.h"
MMHA_H = f"{FT}/src/fastertransformer/kernels/decoder_masked_multihead_attention.h"
MMHA_TEMPLATE = (
    f"{FT}/src/fastertransformer/kernels/decoder_masked_multihead_attention/"
    "decoder_masked_multihead_attention_template.hpp"
)
SELF_ATTENTION_CC = f"{FT}/src/fastertransformer/layers/attention_layers/DecoderSelfAttentionLayer.cc"
CUB_INCLUDE_CCCL3 = "#include <cub/cub.cuh>\n#include <cuda/functional>\n#include <cuda/std/functional>\n"


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` with ``new`` in ``path`` (relative to the source root), ``count`` times."""

    path: str
    old: str
    new: str
    why: str
    count: int = 1


@dataclass(frozen=True)
class NewFile:
    """Add ``path`` (relative to the source root) with the text of ftx's ``patch_files/<name>``."""

    path: str
    name: str
    why: str

    @property
    def text(self) -> str:
        return resources.files(__package__).joinpath("patch_files", self.name).read_text(encoding="utf-8")


Change = Edit | NewFile

CUSTOM_AR_FITS = (
    "  // ftx: the custom all-reduce joins this model instance's own GPUs, counted from its first (one node, one\n"
    "  // pipeline stage); otherwise every rank gets none and reduces through NCCL\n"
    "  cudaSetDevice(model_instance_device_id_start_);\n"
    "  shared_ft_model->createCustomComms(&custom_all_reduce_comms_,\n"
    "      num_nodes == 1 && shared_ft_model->getPipelineParaSize() == 1 ? tp_pp_size_ : 1);\n"
    "  custom_all_reduce_comms_.resize(model_instance_gpu_size_);\n"
)


def _cccl3(path: str, sums: int, maxes: int, sum_objects: int = 0) -> list[Edit]:
    """cub::Sum / cub::Max were removed in CCCL 3: use libcu++'s functors (and include them)."""
    edits = [Edit(path, CUB_INCLUDE, CUB_INCLUDE_CCCL3, "CCCL 3: include the libcu++ functors used below")]
    if sums:
        edits.append(Edit(path, "cub::Sum()", "cuda::std::plus<>()", "CCCL 3 removed cub::Sum", sums))
    if sum_objects:
        edits.append(Edit(path, "cub::Sum sum;", "cuda::std::plus<> sum;", "CCCL 3 removed cub::Sum", sum_objects))
    if maxes:
        edits.append(Edit(path, "cub::Max()", "cuda::maximum<>()", "CCCL 3 removed cub::Max", maxes))
    return edits


PATCHES: tuple[Change, ...] = (
    # --- FasterTransformer's CMake
    Edit(
        f"{FT}/CMakeLists.txt",
        'set(CXX_STD "14" CACHE STRING "C++ standard")',
        'set(CXX_STD "17" CACHE STRING "C++ standard")',
        "CUB/Thrust/libcu++ of CUDA 13 need C++17",
    ),
    Edit(
        f"{FT}/CMakeLists.txt",
        "\nadd_subdirectory(tests)\n",
        '\noption(FT_BUILD_TESTS "Build FasterTransformer\'s unit tests (clones googletest)" OFF)\n'
        "if(FT_BUILD_TESTS)\n  add_subdirectory(tests)\nendif()\n",
        "the tests clone googletest at configure time; keep them out of an offline build",
    ),
    Edit(
        f"{FT}/CMakeLists.txt",
        "${PROJECT_SOURCE_DIR}/../repo-core-src/include",
        "${repo-core_SOURCE_DIR}/include",
        "Triton core's headers are where the backend's FetchContent put them, not at a fixed sibling path",
    ),
    Edit(
        f"{FT}/CMakeLists.txt",
        "from distutils import sysconfig;\nprint(sysconfig.get_python_inc());",
        'import sysconfig;\nprint(sysconfig.get_paths()["include"]);',
        "distutils is gone in Python 3.12",
    ),
    Edit(
        f"{FT}/CMakeLists.txt",
        "target_link_libraries(transformer-shared PUBLIC\n  -lnvToolsExt\n)",
        "target_link_libraries(transformer-shared PUBLIC\n  -ldl\n)",
        "CUDA 13 has no libnvToolsExt; NVTX 3 is header-only (and loads its injection with dlopen)",
    ),
    Edit(
        f"{FT}/src/fastertransformer/utils/CMakeLists.txt",
        "target_link_libraries(nvtx_utils PUBLIC -lnvToolsExt)",
        "target_link_libraries(nvtx_utils PUBLIC -ldl)",
        "CUDA 13 has no libnvToolsExt",
    ),
    Edit(
        f"{FT}/src/fastertransformer/models/CMakeLists.txt",
        "add_subdirectory(wenet)",
        "if(CUDNN_FOUND)\n  add_subdirectory(wenet)\nendif()",
        "WeNet links cuDNN, which is optional",
    ),
    Edit(
        f"{FT}/examples/cpp/CMakeLists.txt",
        "add_subdirectory(swin)\nadd_subdirectory(swin_int8)\nadd_subdirectory(vit)\nadd_subdirectory(vit_int8)\n"
        "\nadd_subdirectory(wenet)",
        "if(CUDNN_FOUND)\n  add_subdirectory(swin)\n  add_subdirectory(swin_int8)\n  add_subdirectory(vit)\n"
        "  add_subdirectory(vit_int8)\n  add_subdirectory(wenet)\nendif()",
        "the Swin, ViT and WeNet examples link cuDNN, which is optional",
    ),
    # --- FasterTransformer's C++/CUDA sources
    Edit(
        f"{FT}/src/fastertransformer/utils/nvtx_utils.cc",
        '#include "nvToolsExt.h"',
        "#include <nvtx3/nvToolsExt.h>",
        "CUDA 13 ships NVTX 3 only",
    ),
    Edit(
        f"{FT}/src/fastertransformer/th_op/th_utils.h",
        "#include <nvToolsExt.h>",
        "#include <nvtx3/nvToolsExt.h>",
        "CUDA 13 ships NVTX 3 only",
    ),
    Edit(
        f"{FT}/src/fastertransformer/utils/cublasMMWrapper.h",
        "#include <map>\n",
        "#include <array>\n#include <map>\n",
        "std::array is used without its header (an incomplete type with newer libstdc++)",
    ),
    Edit(
        f"{FT}/src/fastertransformer/kernels/decoder_masked_multihead_attention_utils.h",
        "#include <stdint.h>\n",
        "#include <stdint.h>\n#include <stdio.h>\n",
        "printf is used without its header",
    ),
    *_cccl3(f"{FT}/src/fastertransformer/kernels/moe_kernels.cu", sums=0, maxes=1, sum_objects=1),
    *_cccl3(f"{FT}/src/fastertransformer/layers/attention_layers/DecoderCrossAttentionLayer.cu", sums=0, maxes=1),
    *_cccl3(f"{FT}/src/fastertransformer/kernels/longformer_kernels.cu", sums=2, maxes=2),
    *_cccl3(f"{FT}/3rdparty/trt_fused_multihead_attention/common.cuh", sums=2, maxes=2, sum_objects=2),
    Edit(
        f"{FT}/src/fastertransformer/utils/gemm_test/gemm_func.cc",
        "           matmulTileName[tile],\n",
        "           (tile >= 0 && tile < (int)(sizeof(matmulTileName) / sizeof(matmulTileName[0])) ? "
        'matmulTileName[tile] : "other"),\n',
        "cuBLASLt 13 reports tile ids past the end of the tool's name table; gpt_gemm/t5_gemm read a wild "
        "pointer and crash while printing the results",
    ),
    # --- the Triton backend's CMake
    # --- behaviour: custom all-reduce for 2, 4 and 8 GPUs. Upstream's kernels are compiled for exactly 8 ranks
    # (tp 2 and 4 fell back to NCCL), its comm never read enable_custom_all_reduce (it tested the vector
    # pointer), sums in a rank-dependent order, has no barrier after a call (a rank could overwrite its buffer
    # while a peer still read it) and skips the start barrier when its flag wraps to 0. ftx builds its own
    # kernels and comm instead (same header and entry points), templated on the rank count.
    NewFile(
        f"{FT}/src/fastertransformer/kernels/ftx_custom_ar_kernels.cu",
        "ftx_custom_ar_kernels.cu",
        "one-shot and two-shot all-reduce kernels for 2, 4 and 8 ranks",
    ),
    NewFile(
        f"{FT}/src/fastertransformer/utils/ftx_custom_ar_comm.cc",
        "ftx_custom_ar_comm.cc",
        "the comm: peer access checked (else NCCL, said in the log), the instance's own GPUs, the parameter read",
    ),
    Edit(
        f"{FT}/src/fastertransformer/kernels/CMakeLists.txt",
        "add_library(custom_ar_kernels STATIC custom_ar_kernels.cu)",
        "add_library(custom_ar_kernels STATIC ftx_custom_ar_kernels.cu)",
        "build ftx's all-reduce kernels instead of upstream's 8-rank ones",
    ),
    Edit(
        f"{FT}/src/fastertransformer/utils/CMakeLists.txt",
        "add_library(custom_ar_comm STATIC custom_ar_comm.cc)",
        "add_library(custom_ar_comm STATIC ftx_custom_ar_comm.cc)",
        "build ftx's all-reduce comm instead of upstream's",
    ),
    Edit(
        f"{FT}/src/fastertransformer/kernels/custom_ar_kernels.h",
        "#define MAX_ALL_REDUCE_BLOCKS 24\n",
        "#define MAX_ALL_REDUCE_BLOCKS 24\n"
        "// ftx's kernels: at most this many blocks, one-shot up to this many bytes at 4 and 8 ranks (always at 2),\n"
        "// and each rank's flags: start, then one per block and rank for the middle and the end barriers and for\n"
        "// each block's start (device-counted flags)\n"
        "#define FTX_AR_MAX_BLOCKS 64\n"
        "#define FTX_AR_ONE_SHOT_BYTES 393216\n"
        "#define FTX_AR_FLAG_WORDS (RANKS_PER_NODE * (1 + 3 * FTX_AR_MAX_BLOCKS))\n",
        "the limits of ftx's all-reduce kernels",
    ),
    Edit(
        f"{FT}/src/fastertransformer/kernels/custom_ar_kernels.h",
        "    uint32_t  barrier_flag;\n",
        "    uint32_t  barrier_flag;\n"
        "    size_t    ranks;  // ftx: ranks taking part (2, 4 or 8); the arrays hold RANKS_PER_NODE\n"
        "    uint32_t* ftx_block_flags;  // ftx: each block's flag counter on this GPU (null: barrier_flag, the host's)\n",
        "the kernels are chosen by the rank count; device-counted flags for a decoding step replayed from a CUDA graph",
    ),
    Edit(
        "fastertransformer_backend/src/libfastertransformer.cc",
        "  shared_ft_model->createCustomComms(&custom_all_reduce_comms_, world_size_);\n",
        CUSTOM_AR_FITS,
        "upstream gave the comm every visible GPU of every node (world size), so several instances, pipeline "
        "stages or nodes would have joined GPUs that do not reduce together",
    ),
    # --- behaviour: a GEMM algorithm from gemm_config.in that cuBLASLt refuses was skipped in silence (the
    # status was not checked): the product never ran, its output kept stale values, and decoding looked
    # faster than the memory allows. Now the refused algorithm falls back to cuBLASLt's own choice, and any
    # other failure is an error.
    Edit(
        f"{FT}/src/fastertransformer/utils/cublasMMWrapper.cc",
        "        cublasLtMatmul(cublaslt_handle_,\n",
        "        cublasStatus_t ftx_status = cublasLtMatmul(cublaslt_handle_,\n",
        "keep the status of the tuned cublasLtMatmul",
    ),
    Edit(
        f"{FT}/src/fastertransformer/utils/cublasMMWrapper.cc",
        "                       stream_);\n\n        cublasLtMatmulDescDestroy(operationDesc);",
        "                       stream_);\n"
        "        if (ftx_status != CUBLAS_STATUS_SUCCESS && findAlgo == 1) {\n"
        "            ftx_status = cublasLtMatmul(cublaslt_handle_, operationDesc, alpha, A, Adesc, B, Bdesc, beta, C,\n"
        "                                        Cdesc, C, Cdesc, NULL, workSpace, workspaceSize, stream_);\n"
        "        }\n"
        "        check_cuda_error(ftx_status);\n\n"
        "        cublasLtMatmulDescDestroy(operationDesc);",
        "a refused tuned algorithm falls back to cuBLASLt's choice instead of skipping the GEMM",
    ),
    # --- behaviour: GPT-J's decoder at tp > 1 with one all-reduce per layer instead of two. GPT-J adds attention
    # and FFN of the same normed input to the residual, so each rank can add its two partial sums (with the
    # bias on rank 0 and its 1/tp share of the residual) and one all-reduce sums them: GPT-NeoX's parallel-
    # residual path in FasterTransformer does the same. At tp > 1: on by default in fp16, where it was measured
    # on two H200s (GPT-J-6B shape, tp 2: 1.05x at batch 1, 1.08x at batch 8) and the GPU suite's GPT-J and
    # KoGPT cases at tp 2 equal transformers with it; FTX_GPTJ_ONE_ALLREDUCE=0 or 1 in the server's environment
    # decides for any type (bf16 keeps two until measured). The sums are added in another order, so fp16 ids
    # can differ from the two-all-reduce run's where logits nearly tie.
    Edit(
        GPTJ_DECODER_H,
        "    T* decoder_layer_output_ = nullptr;\n",
        "    T* decoder_layer_output_ = nullptr;\n"
        "    bool ftx_one_all_reduce_ = false;    // ftx: one all-reduce per layer (tp > 1, FTX_GPTJ_ONE_ALLREDUCE=1)\n"
        "    T*   ftx_zero_bias_      = nullptr;  // ftx: the bias that ranks other than 0 add (zeros)\n",
        "the one-all-reduce switch and its zero bias",
    ),
    Edit(
        GPTJ_DECODER_CC,
        "void GptJDecoder<T>::initialize()\n{\n",
        "void GptJDecoder<T>::initialize()\n{\n"
        '    const char* ftx_one = std::getenv("FTX_GPTJ_ONE_ALLREDUCE");\n'
        "    const bool  ftx_one_unset = ftx_one == nullptr || *ftx_one == '\\0';\n"
        "    // unset: on for fp16 (measured, and compared with transformers at tp 2); 1 or 0 decide for any type\n"
        "    ftx_one_all_reduce_ = tensor_para_.world_size_ > 1\n"
        '                          && (ftx_one_unset ? std::is_same<T, half>::value : std::string(ftx_one) == "1");\n',
        "read the one-all-reduce switch from the environment",
    ),
    Edit(
        GPTJ_DECODER_CC,
        "                                                                           allocator_,\n"
        "                                                                           true,\n",
        "                                                                           allocator_,\n"
        "                                                                           !ftx_one_all_reduce_,\n",
        "the attention layer does not all-reduce when the decoder does it once",
    ),
    Edit(
        GPTJ_DECODER_CC,
        "                                                   allocator_,\n"
        "                                                   true,\n",
        "                                                   allocator_,\n"
        "                                                   !ftx_one_all_reduce_,\n",
        "the FFN layer does not all-reduce when the decoder does it once",
    ),
    Edit(
        GPTJ_DECODER_CC,
        "        allocator_->reMalloc(decoder_layer_output_, sizeof(T) * batch_size * hidden_units_, false));\n"
        "    is_allocate_buffer_ = true;\n",
        "        allocator_->reMalloc(decoder_layer_output_, sizeof(T) * batch_size * hidden_units_, false));\n"
        "    if (ftx_one_all_reduce_) {\n"
        "        ftx_zero_bias_ = reinterpret_cast<T*>(allocator_->reMalloc(ftx_zero_bias_, sizeof(T) * hidden_units_, true));\n"
        "    }\n"
        "    is_allocate_buffer_ = true;\n",
        "the zero bias of ranks other than 0",
    ),
    Edit(
        GPTJ_DECODER_CC,
        "        allocator_->free((void**)(&decoder_layer_output_));\n        is_allocate_buffer_ = false;\n",
        "        allocator_->free((void**)(&decoder_layer_output_));\n"
        "        if (ftx_zero_bias_ != nullptr) {\n"
        "            allocator_->free((void**)(&ftx_zero_bias_));\n"
        "        }\n"
        "        is_allocate_buffer_ = false;\n",
        "free the zero bias with the other buffers",
    ),
    Edit(
        GPTJ_DECODER_CC,
        "        invokeAddBiasAttentionFfnResidual(layer_output,\n"
        "                                          ffn_output_,\n"
        "                                          self_attn_output_,\n"
        "                                          layer_input,\n"
        "                                          gpt_decoder_layer_weight->at(l).ffn_weights.output_weight.bias,\n"
        "                                          local_batch_size,\n"
        "                                          hidden_units_,\n"
        "                                          stream_);\n",
        "        if (ftx_one_all_reduce_) {\n"
        "            // ftx: this rank's attention + FFN partial sums + bias (rank 0) + residual / tp, then one all-reduce\n"
        "            const size_t        ftx_elts = local_batch_size * hidden_units_;\n"
        "            std::vector<Tensor> ftx_reduce{\n"
        "                Tensor{MEMORY_GPU, data_type, {local_batch_size, hidden_units_}, layer_output}};\n"
        "            const bool ftx_custom = enable_custom_all_reduce_ && custom_all_reduce_comm_ != nullptr\n"
        "                                    && custom_all_reduce_comm_->swapInternalBuffer(&ftx_reduce, ftx_elts);\n"
        "            invokeAddBiasAttentionFfnResidual((T*)ftx_reduce[0].data,\n"
        "                                              ffn_output_,\n"
        "                                              self_attn_output_,\n"
        "                                              layer_input,\n"
        "                                              tensor_para_.rank_ == 0 ?\n"
        "                                                  gpt_decoder_layer_weight->at(l).ffn_weights.output_weight.bias :\n"
        "                                                  ftx_zero_bias_,\n"
        "                                              (int)local_batch_size,\n"
        "                                              (int)hidden_units_,\n"
        "                                              (int)tensor_para_.world_size_,\n"
        "                                              stream_);\n"
        "            if (ftx_custom) {\n"
        "                custom_all_reduce_comm_->customAllReduce(ftx_elts, stream_);\n"
        "            }\n"
        "            else {\n"
        "                ftNcclAllReduceSum(layer_output, layer_output, ftx_elts, tensor_para_, stream_);\n"
        "            }\n"
        "        }\n"
        "        else {\n"
        "            invokeAddBiasAttentionFfnResidual(layer_output,\n"
        "                                              ffn_output_,\n"
        "                                              self_attn_output_,\n"
        "                                              layer_input,\n"
        "                                              gpt_decoder_layer_weight->at(l).ffn_weights.output_weight.bias,\n"
        "                                              local_batch_size,\n"
        "                                              hidden_units_,\n"
        "                                              stream_);\n"
        "        }\n",
        "one all-reduce of the summed partials instead of one after attention and one after the FFN",
    ),
    Edit(
        f"{FT}/src/fastertransformer/layers/TensorParallelGeluFfnLayer.cc",
        "    if (enable_custom_all_reduce_ && custom_all_reduce_comm_ != nullptr) {\n"
        "        use_custom_all_reduce_kernel =\n",
        "    if (enable_custom_all_reduce_ && custom_all_reduce_comm_ != nullptr && do_all_reduce_) {\n"
        "        use_custom_all_reduce_kernel =\n",
        "an FFN layer that does not all-reduce must write its own output buffer, not the all-reduce's peer buffer "
        "(upstream swapped it in anyway: GPT-NeoX's parallel residual with custom all-reduce read stale sums)",
    ),
    # --- behaviour: GPT-J's decoding step in a CUDA graph (on by default in fp16; FTX_FT_CUDA_GRAPH=1 or 0 in the
    # server's environment decides for any type).
    # At batch 1 and tp 2 the host launched ~318 kernels a step from one thread per GPU and the GPU waited for it
    # (a CUPTI trace on two H200s: 3.9 ms of host time for 3.6 ms of kernels). GptJ's forward now runs the decoder
    # layers of each step through ftx's FtxStepGraph (patch_files/ftx_cuda_graph.*): the first step eagerly, then
    # captured once and replayed, at beam width 1 with one pipeline stage; anything else as upstream. A streaming
    # (decoupled) deployment is served with the graph off (ftx's serve sets FTX_FT_CUDA_GRAPH=0 for it): with the
    # graph on, every streamed request hung after its third response at tp 2 (custom all-reduce; raw ids alone as
    # well as through the ensemble, also with the streaming rank kept eager) and ended the server at tp 4 (NCCL),
    # while the same requests with FTX_FT_CUDA_GRAPH=0 passed. What a step
    # changes comes from device memory: the attention kernel's timestep (a device int, written before each launch)
    # and the custom all-reduce's flags (counted on the device). A capture that fails logs one line and the forward
    # goes on eagerly. Measured on two H200s (GPT-J-6B shape, tp 2, batch 1 and 8): 1.10-1.14x the eager step with
    # the custom all-reduce and with NCCL, ids equal to the eager run's, and the GPU suite's GPT-J cases at tp 2 in
    # fp16 equal transformers with it; bf16 keeps it off until measured.
    NewFile(f"{FT}/src/fastertransformer/kernels/ftx_cuda_graph.h", "ftx_cuda_graph.h", "the captured decoding step"),
    NewFile(f"{FT}/src/fastertransformer/kernels/ftx_cuda_graph.cc", "ftx_cuda_graph.cc", "capture, replay, fallback"),
    NewFile(
        f"{FT}/src/fastertransformer/kernels/ftx_cuda_graph_kernels.cu",
        "ftx_cuda_graph_kernels.cu",
        "the kernel that writes the step's timestep",
    ),
    Edit(
        f"{FT}/src/fastertransformer/kernels/CMakeLists.txt",
        "set(decoder_masked_multihead_attention_files\n    decoder_masked_multihead_attention.cu\n)",
        "set(decoder_masked_multihead_attention_files\n    decoder_masked_multihead_attention.cu\n"
        "    ftx_cuda_graph.cc\n    ftx_cuda_graph_kernels.cu\n)",
        "build the captured decoding step beside the attention kernels that read its timestep",
    ),
    Edit(
        MMHA_H,
        "    int timestep = 0;\n",
        "    int timestep = 0;\n"
        "    // ftx: set while a decoding step is captured in a CUDA graph: the kernel reads its timestep here, and\n"
        "    // `timestep` only sizes the launch (the largest timestep the graph replays)\n"
        "    const int* ftx_timestep_ptr = nullptr;\n",
        "the attention kernel's timestep from device memory in a captured step",
    ),
    Edit(MMHA_TEMPLATE, "params.timestep", "ftx_timestep", "the kernel's timestep is read once, below", count=30),
    Edit(
        MMHA_TEMPLATE,
        "    const int max_timesteps = min(ftx_timestep, params.memory_max_len);\n    size_t qk_sz",
        "    const int max_timesteps = min(params.timestep, params.memory_max_len);\n    size_t qk_sz",
        "the host's shared memory size keeps the host's timestep",
    ),
    Edit(
        MMHA_TEMPLATE,
        "__global__ void masked_multihead_attention_kernel(Multihead_attention_params<T, DO_CROSS_ATTENTION> params)\n"
        "{\n",
        "__global__ void masked_multihead_attention_kernel(Multihead_attention_params<T, DO_CROSS_ATTENTION> params)\n"
        "{\n"
        "    // ftx: the step's timestep from device memory when the step is replayed from a CUDA graph\n"
        "    const int ftx_timestep = params.ftx_timestep_ptr != nullptr ? *params.ftx_timestep_ptr : params.timestep;\n",
        "read the timestep once: the device's in a captured step, else the argument",
    ),
    Edit(
        SELF_ATTENTION_CC,
        '#include "src/fastertransformer/kernels/decoder_masked_multihead_attention.h"\n',
        '#include "src/fastertransformer/kernels/decoder_masked_multihead_attention.h"\n'
        '#include "src/fastertransformer/kernels/ftx_cuda_graph.h"\n',
        "the captured step's timestep",
    ),
    Edit(
        SELF_ATTENTION_CC,
        "    params.timestep             = step + max_prefix_prompt_length - 1;\n",
        "    params.timestep             = step + max_prefix_prompt_length - 1;\n"
        "    const FtxGraphStep& ftx_step = ftxGraphStep();\n"
        "    if (ftx_step.device_timestep != nullptr) {\n"
        "        // ftx: this step is being captured in a CUDA graph: the kernel reads the timestep from the device;\n"
        "        // the launch and its shared memory are sized for the largest timestep the graph replays\n"
        "        params.timestep         = ftx_step.max_timestep;\n"
        "        params.ftx_timestep_ptr = ftx_step.device_timestep;\n"
        "    }\n",
        "in a captured step the attention kernel reads its timestep from the device",
    ),
    Edit(
        GPTJ_H,
        '#include "src/fastertransformer/utils/custom_ar_comm.h"\n',
        '#include "src/fastertransformer/utils/custom_ar_comm.h"\n'
        '#include "src/fastertransformer/kernels/ftx_cuda_graph.h"\n',
        "the captured decoding step",
    ),
    Edit(
        GPTJ_H,
        "    bool* generation_should_stop_ = nullptr;\n",
        "    bool* generation_should_stop_ = nullptr;\n\n"
        "    FtxStepGraph ftx_step_graph_;  // ftx: the decoder layers' step in a CUDA graph (fp16, FTX_FT_CUDA_GRAPH)\n",
        "each model instance's captured decoding step",
    ),
    Edit(
        GPTJ_CC,
        "    for (int step = max_input_length; step < (int)max_output_seq_len; step++) {\n",
        "    // ftx: this forward's decoder step may be captured in a CUDA graph (fp16, FTX_FT_CUDA_GRAPH): beam width 1,\n"
        "    // one pipeline stage, buffers kept between steps (a streaming deployment is served with the graph off)\n"
        "    ftx_step_graph_.begin(ftxCudaGraphRequested(std::is_same<T, half>::value) && beam_width == 1\n"
        "                          && pipeline_para_.world_size_ == 1\n"
        "                          && !is_free_buffer_after_forward_);\n"
        "    for (int step = max_input_length; step < (int)max_output_seq_len; step++) {\n",
        "a new forward drops the last one's graph",
    ),
    Edit(
        GPTJ_CC,
        "                gpt_decoder_->forward(\n"
        "                    &decoder_output_tensors, &decoder_input_tensors, &gpt_weights->decoder_layer_weights);\n",
        "                // ftx: eagerly, or captured once and replayed (ftx_cuda_graph.h)\n"
        "                ftx_step_graph_.run(stream_,\n"
        "                                    step + max_prefix_prompt_length - 1,\n"
        "                                    (int)max_output_seq_len - 2 + max_prefix_prompt_length,\n"
        "                                    [&]() {\n"
        "                                        gpt_decoder_->forward(&decoder_output_tensors,\n"
        "                                                              &decoder_input_tensors,\n"
        "                                                              &gpt_weights->decoder_layer_weights);\n"
        "                                    });\n",
        "the decoder layers' step through the CUDA graph",
    ),
    # --- behaviour: the stream interval. A decoupled model sent a response per generated token to every request
    # of the batch (a Triton response, a device-to-host copy of the whole output so far, and downstream one
    # Python postprocessing call each). With the model parameter ``ftx_stream_interval`` N > 1 the streaming
    # callback sends the first step and then every Nth only; ``auto``: N = ceil(requests of this execution / R),
    # R from ``ftx_stream_auto_responses`` (ftx_triton.repository.stream_interval; the python runtime does the same).
    # The final response (the whole output) always goes. Absent or 1: every step, as upstream. With verbose
    # logging on (tritonserver --log-verbose=1, or POST /v2/logging {"log_verbose_level": 1} from this host) each
    # streaming execution logs its request and row counts and the interval it chose.
    Edit(
        BACKEND_CC,
        "  std::vector<TRITONBACKEND_ResponseFactory*>* factories;\n  BackendModelInstance* model;\n};\n",
        "  std::vector<TRITONBACKEND_ResponseFactory*>* factories;\n  BackendModelInstance* model;\n"
        "  int ftx_stream_interval = 1;\n  int ftx_steps = 0;\n};\n",
        "the streaming callback's context counts steps against the stream interval",
    ),
    Edit(
        BACKEND_CC,
        "  stream_callback_ctx_t* context =\n      reinterpret_cast<stream_callback_ctx_t*>(ctx);\n",
        "  stream_callback_ctx_t* context =\n      reinterpret_cast<stream_callback_ctx_t*>(ctx);\n"
        "  if (context->ftx_stream_interval > 1 && ++context->ftx_steps != 1 &&\n"
        "      context->ftx_steps % context->ftx_stream_interval != 0) {\n"
        "    return;  // ftx: not a step of the stream interval (the final response still carries every token)\n"
        "  }\n",
        "send the first step's streamed response, then every ftx_stream_interval steps",
    ),
    Edit(
        BACKEND_CC,
        "  stream_callback_ctx_t context = {total_batch_size, requests,   request_count,\n"
        "                                   &responses,       &factories, this};\n",
        "  stream_callback_ctx_t context = {total_batch_size, requests,   request_count,\n"
        "                                   &responses,       &factories, this};\n"
        "  {\n"
        "    common::TritonJson::Value ftx_params, ftx_value, ftx_responses_value;\n"
        "    std::string ftx_interval, ftx_responses;\n"
        '    if (model_state_->ModelConfig().Find("parameters", &ftx_params)) {\n'
        f'      if (ftx_params.Find("{STREAM_INTERVAL_PARAMETER}", &ftx_value)) {{\n'
        '        ftx_value.MemberAsString("string_value", &ftx_interval);\n'
        "      }\n"
        f'      if (ftx_params.Find("{STREAM_AUTO_RESPONSES_PARAMETER}", &ftx_responses_value)) {{\n'
        '        ftx_responses_value.MemberAsString("string_value", &ftx_responses);\n'
        "      }\n"
        "    }\n"
        "    int ftx_n = std::atoi(ftx_interval.c_str());\n"
        f'    if (ftx_interval == "{STREAM_AUTO}") {{\n'
        "      // ftx: about ftx_r responses per step for the whole batch, whatever the number of requests\n"
        "      const int ftx_r_given = std::atoi(ftx_responses.c_str());\n"
        f"      const size_t ftx_r = ftx_r_given > 0 ? (size_t)ftx_r_given : (size_t){STREAM_AUTO_RESPONSES};\n"
        "      ftx_n = (int)(((size_t)request_count + ftx_r - 1) / ftx_r);\n"
        "    }\n"
        "    context.ftx_stream_interval = ftx_n > 1 ? ftx_n : 1;\n"
        "    if (is_decoupled_) {\n"
        "      LOG_MESSAGE(\n"
        "          TRITONSERVER_LOG_VERBOSE,\n"
        '          (std::string("ftx stream interval: ") + std::to_string(request_count) + " requests (" +\n'
        '           std::to_string(total_batch_size) + " rows) in this execution, a streamed response every " +\n'
        '           std::to_string(context.ftx_stream_interval) + " steps")\n'
        "              .c_str());\n"
        "    }\n"
        "  }\n",
        "read the stream interval from the model's parameters (absent: every step, as upstream; auto: from the "
        "number of requests in this execution) and log it per execution (verbose)",
    ),
    # --- behaviour: the stream offset. FasterTransformer resends the whole sequence, prompt included, in every
    # streamed response, and Triton lets no ensemble step after a decoupled model read another model's outputs, so
    # postprocessing could not tell which tokens a response adds: generate_stream answered the whole text so far,
    # prompt first, at every step (two H200s, tp 2 and 4). A decoupled model now also answers ``ftx_stream_offset``
    # (as the python runtime does) and, where the model has none of its own, ``response_input_lengths``
    # (``patch_files/ftx_stream_outputs.h`` says how). Outputs are handed to Triton from the memory they are in
    # (upstream called every output GPU memory, its host-side error_message too).
    NewFile(
        "fastertransformer_backend/src/ftx_stream_outputs.h",
        "ftx_stream_outputs.h",
        "the stream offset and prompt length outputs of a decoupled model",
    ),
    Edit(
        BACKEND_CC,
        '#include "src/fastertransformer/utils/nccl_utils.h"\n',
        '#include "src/fastertransformer/utils/nccl_utils.h"\n#include "ftx_stream_outputs.h"\n',
        "the stream outputs",
    ),
    Edit(
        BACKEND_CC,
        "  int ftx_stream_interval = 1;\n  int ftx_steps = 0;\n};\n",
        "  int ftx_stream_interval = 1;\n  int ftx_steps = 0;\n"
        "  ftx::StreamOutputs<Tensor> ftx_stream;  // ftx: where each streamed response's new tokens start\n};\n",
        "the streaming callback's context keeps the execution's stream offsets",
    ),
    Edit(
        BACKEND_CC,
        "  auto output_tensors =\n      Execute(&responses, &context, request_count, input_tensors);\n",
        "  if (is_decoupled_) {\n"
        '    auto ftx_prompt = input_tensors->find("input_lengths");  // ftx: new tokens first follow the prompt\n'
        "    context.ftx_stream.start(\n"
        "        total_batch_size, ftx_prompt == input_tensors->end() ? nullptr : &ftx_prompt->second);\n"
        "  }\n"
        "  auto output_tensors =\n      Execute(&responses, &context, request_count, input_tensors);\n",
        "each row's first stream offset is its prompt length",
    ),
    Edit(
        BACKEND_CC,
        "  model->ReadOutputTensors(\n"
        "      context->total_batch_size, output_tensors, context->requests,\n"
        "      context->request_count, responses);\n",
        "  context->ftx_stream.attach(output_tensors.get());\n"
        "  model->ReadOutputTensors(\n"
        "      context->total_batch_size, output_tensors, context->requests,\n"
        "      context->request_count, responses);\n"
        "  context->ftx_stream.sent(output_tensors.get());\n",
        "a streamed response carries its stream offset; the next starts after what it carried",
    ),
    Edit(
        BACKEND_CC,
        "  ReadOutputTensors(\n      total_batch_size, output_tensors, requests, request_count, &responses);\n",
        "  if (is_decoupled_) {\n"
        "    context.ftx_stream.attach(output_tensors.get());  // ftx: the final response's too\n"
        "  }\n"
        "  ReadOutputTensors(\n      total_batch_size, output_tensors, requests, request_count, &responses);\n",
        "the final streamed response carries its stream offset",
    ),
    Edit(
        BACKEND_CC,
        "        TRITONSERVER_MEMORY_GPU, model_instance_device_id_start_);\n",
        "        output.where,\n"
        "        output.where == TRITONSERVER_MEMORY_GPU ? model_instance_device_id_start_ : 0);  // ftx\n",
        "hand each output to Triton from the memory it is in (the stream outputs are host memory)",
    ),
    # --- behaviour: weight loading. Upstream read every weight file into a zero-filled std::vector and copied it
    # with a pageable cudaMemcpy (each byte faulted in, zeroed, read, then staged again by the driver): 9.0 s of a
    # cached GPT-J-6B start at tp 2 on two H200s (2 x 6 GB). A file already in the weight's type (what ftx's
    # conversion writes) is now read in chunks into two pinned buffers and each chunk copied to the GPU while
    # the next is read; other types, and FTX_FT_LOADER=upstream in the server's environment, load as upstream.
    # Missing, short and zero-shape files are warned about as upstream does. Each GPU's loading thread logs
    # its seconds and GB/s (`ftx: weights of rank R on GPU G loaded: ...`), which `ftx -v` reports.
    NewFile(
        f"{FT}/src/fastertransformer/utils/ftx_weight_loader.h",
        "ftx_weight_loader.h",
        "the pinned weight loader and the per-thread load counts",
    ),
    NewFile(
        f"{FT}/src/fastertransformer/utils/ftx_weight_loader.cc",
        "ftx_weight_loader.cc",
        "the pinned weight loader, the per-thread load counts and the log line",
    ),
    Edit(
        f"{FT}/src/fastertransformer/utils/CMakeLists.txt",
        "add_library(memory_utils STATIC memory_utils.cu)",
        "add_library(memory_utils STATIC memory_utils.cu ftx_weight_loader.cc)",
        "build the pinned weight loader into memory_utils (and so into libtransformer-shared)",
    ),
    Edit(
        MEMORY_UTILS_CU,
        '#include "src/fastertransformer/utils/memory_utils.h"\n#include <curand_kernel.h>\n',
        '#include "src/fastertransformer/utils/memory_utils.h"\n'
        '#include "src/fastertransformer/utils/ftx_weight_loader.h"\n'
        "#include <curand_kernel.h>\n",
        "the pinned weight loader",
    ),
    Edit(
        MEMORY_UTILS_CU,
        "int loadWeightFromBinFunc(T* ptr, std::vector<size_t> shape, std::string filename)\n{\n"
        "    std::vector<T_IN> host_array = loadWeightFromBinHelper<T_IN>(shape, filename);\n\n"
        "    if (host_array.empty()) {\n        return 0;\n    }\n",
        "int loadWeightFromBinFunc(T* ptr, std::vector<size_t> shape, std::string filename)\n{\n"
        "    FtxWeightLoadTimer ftx_timer;  // ftx: this thread's bytes and seconds of loading, for the backend's log\n"
        "    if (std::is_same<T, T_IN>::value && ftxPinnedLoaderReady()) {\n"
        "        // ftx: the file holds the weight's type: read it in chunks into pinned buffers, each copied to the GPU\n"
        "        // while the next is read (no zero-filled host vector, no pageable copy); upstream's checks and warnings\n"
        "        ftx_timer.loaded(ftxLoadWeightToDevice(ptr, shape, sizeof(T), filename), true);\n"
        "        return 0;\n"
        "    }\n"
        "    std::vector<T_IN> host_array = loadWeightFromBinHelper<T_IN>(shape, filename);\n\n"
        "    if (host_array.empty()) {\n        return 0;\n    }\n"
        "    ftx_timer.loaded(sizeof(T_IN) * host_array.size(), false);\n",
        "a file in the weight's own type goes to the GPU through pinned buffers; other types load as upstream",
    ),
    Edit(
        BACKEND_CC,
        "#include <exception>\n",
        "#include <chrono>\n#include <exception>\n",
        "std::chrono for the load time",
    ),
    Edit(
        BACKEND_CC,
        '#include "src/fastertransformer/utils/Tensor.h"\n',
        '#include "src/fastertransformer/utils/Tensor.h"\n#include "src/fastertransformer/utils/ftx_weight_loader.h"\n',
        "the weight load line",
    ),
    Edit(
        BACKEND_CC,
        "    threads.push_back(std::thread(&AbstractTransformerModel::createSharedWeights,\n"
        "      ft_model, gid, rank));\n",
        "    threads.push_back(std::thread([model = ft_model, gid, rank]() {\n"
        "      // ftx: this GPU's weights (allocation and files) timed, and how fast its files came, in the log\n"
        "      const auto ftx_began = std::chrono::steady_clock::now();\n"
        "      model->createSharedWeights(gid, rank);\n"
        "      const std::chrono::duration<double> ftx_took = std::chrono::steady_clock::now() - ftx_began;\n"
        "      LOG_MESSAGE(TRITONSERVER_LOG_INFO, ft::ftxWeightLoadMessage(rank, gid, ftx_took.count()).c_str());\n"
        "    }));\n",
        "log each GPU's weight loading: GB, files, seconds, GB/s and the loader",
    ),
    Edit(
        "fastertransformer_backend/CMakeLists.txt",
        'set(CMAKE_CUDA_FLAGS "-include stdio.h")',
        'set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} -include stdio.h")',
        "append to the CUDA flags instead of dropping the include paths and flags given on the command line",
    ),
    Edit(
        "fastertransformer_backend/CMakeLists.txt",
        "target_compile_features(triton-fastertransformer-backend PRIVATE cxx_std_14)",
        "target_compile_features(triton-fastertransformer-backend PRIVATE cxx_std_17)",
        "FasterTransformer's headers need C++17 with CUDA 13",
    ),
    # --- Triton's backend utilities (r22.12)
    Edit(
        "triton/backend/CMakeLists.txt",
        "OPTIONS -arch compute_53\n",
        "OPTIONS -arch compute_75\n",
        "nvcc 13 dropped compute_53",
    ),
    Edit(
        "triton/backend/CMakeLists.txt",
        "OPTIONS -code compute_53,sm_53,sm_60,sm_61,sm_62,sm_70,sm_72,sm_75\n",
        "OPTIONS -code compute_75,sm_75,sm_80,sm_90\n",
        "nvcc 13 builds for sm_75 and newer only",
    ),
)


def _record(change: Change) -> dict[str, object]:
    return {**asdict(change), "text": change.text} if isinstance(change, NewFile) else asdict(change)


def patch_set_digest(edits: Sequence[Change] = PATCHES) -> str:
    """sha256 of the patch set, new files' text included (part of the build key)."""
    text = json.dumps([_record(e) for e in edits], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _new_file_problem(root: Path, new: NewFile, texts: dict[str, str]) -> str | None:
    path = root / new.path
    if new.path in texts or path.exists():
        same = texts.get(new.path) == new.text or (path.is_file() and path.read_text(errors="replace") == new.text)
        return f"{new.path} is already patched ({new.why})" if same else f"{new.path} exists already"
    if not path.parent.is_dir():
        return f"{path.parent.relative_to(root)} does not exist (for {new.path})"
    return None


def _problem(root: Path, edit: Change, texts: dict[str, str]) -> str | None:
    if isinstance(edit, NewFile):
        return _new_file_problem(root, edit, texts)
    if edit.path not in texts:
        path = root / edit.path
        if not path.is_file():
            return f"{edit.path} does not exist"
        texts[edit.path] = path.read_text(encoding="utf-8", errors="surrogateescape")
    text = texts[edit.path]
    if edit.old in edit.new and edit.new in text:
        return f"{edit.path} is already patched ({edit.why})"
    found = text.count(edit.old)
    if found == edit.count:
        return None
    if found == 0 and edit.new in text:
        return f"{edit.path} is already patched ({edit.why})"
    return f"{edit.path}: expected {edit.count} occurrence(s) of {edit.old.strip()[:60]!r}, found {found}"


def _changed(text: str | None, change: Change) -> str:
    if isinstance(change, NewFile):
        return change.text
    assert text is not None
    return text.replace(change.old, change.new)


def check_patches(root: Path, edits: Sequence[Change] = PATCHES) -> list[str]:
    """Every way the changes do not fit the files under ``root`` (empty: they all apply exactly)."""
    texts: dict[str, str] = {}
    problems = []
    for edit in edits:
        if (problem := _problem(Path(root), edit, texts)) is not None:
            problems.append(problem)
            continue
        texts[edit.path] = _changed(texts.get(edit.path), edit)  # later edits see earlier ones
    return problems


def apply_patches(root: Path, edits: Sequence[Change] = PATCHES) -> int:
    """Apply every edit under ``root`` or none: raise SourceError if any does not fit. Returns the count."""
    root = Path(root)
    problems = check_patches(root, edits)
    if problems:
        shown = "\n  ".join(problems[:8])
        raise SourceError(
            f"ftx's patch set does not fit these sources ({len(problems)} edit(s)):\n  {shown}",
            hint="the sources differ from the pinned upstream commits, or were patched already; "
            "start from unmodified upstream sources",
        )
    texts: dict[str, str] = {}
    for edit in edits:
        if edit.path not in texts and isinstance(edit, Edit):
            texts[edit.path] = (root / edit.path).read_text(encoding="utf-8", errors="surrogateescape")
        texts[edit.path] = _changed(texts.get(edit.path), edit)
    for rel, text in texts.items():
        (root / rel).write_text(text, encoding="utf-8", errors="surrogateescape")
    log.info("patches.applied", root=str(root), edits=len(edits), files=len(texts))
    return len(edits)


__all__ = ["PATCHES", "Change", "Edit", "NewFile", "apply_patches", "check_patches", "patch_set_digest"]
