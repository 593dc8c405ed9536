"""Pinned upstream sources and ftx's patch set for the native FasterTransformer build (no GPU needed).

Synthetic source trees check the digest and patch rules; the real upstream sources (an offline
bundle of the pinned, unpatched sources, when one is beside the checkout) check that the pins and the patch set fit them —
those tests skip where the bundle is absent.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest
from ftx_triton.errors import SourceError
from ftx_triton.runtime.fastertransformer.native import patches as patches_mod
from ftx_triton.runtime.fastertransformer.native.patches import (
    BACKEND_CC,
    PATCHES,
    Edit,
    NewFile,
    apply_patches,
    check_patches,
    patch_set_digest,
)
from ftx_triton.runtime.fastertransformer.native.sources import (
    component_digest,
    sources_from,
    tree_digest,
    used_files,
    verify_sources,
)
from ftx_triton.runtime.fastertransformer.pins import COMPONENTS, Component, component, pins_fingerprint
from repo_paths import REPO

BUNDLE = REPO.parent / "shared" / "ft-sources" / "ft-upstream-sources.tar.xz"
needs_bundle = pytest.mark.skipif(not BUNDLE.is_file(), reason=f"the upstream source bundle is not at {BUNDLE}")


# --------------------------------------------------------------------------- synthetic trees


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _component(root: Path, name: str = "lib", folder: str = "lib") -> Component:
    draft = Component(
        name,
        f"example/{name}",
        "abc1234",
        folder,
        used=("CMakeLists.txt", "src/"),
        exclude=("src/vendored/",),
        tree_sha256="",
    )
    return Component(**{**draft.__dict__, "tree_sha256": component_digest(root, draft)})


def test_tree_digest_covers_used_files_only_and_their_contents(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "lib/CMakeLists.txt": "project(x)",
            "lib/src/a.cc": "int a;",
            "lib/docs/readme": "x",
            "lib/src/vendored/v.h": "v",
        },
    )
    comp = _component(tmp_path)
    assert used_files(tmp_path, comp) == ["CMakeLists.txt", "src/a.cc"]
    before = comp.tree_sha256
    (tmp_path / "lib/docs/readme").write_text("changed")  # not used by the build
    (tmp_path / "lib/src/vendored/v.h").write_text("changed")  # excluded
    assert component_digest(tmp_path, comp) == before
    (tmp_path / "lib/src/a.cc").write_text("int a = 1;")
    assert component_digest(tmp_path, comp) != before


def test_tree_digest_does_not_depend_on_listing_order(tmp_path: Path) -> None:
    _write(tmp_path, {"b": "2", "a": "1"})
    assert tree_digest(tmp_path, ["a", "b"]) == tree_digest(tmp_path, ["b", "a"])
    assert tree_digest(tmp_path, ["a", "b"]) != tree_digest(tmp_path, ["a"])


def test_verify_refuses_a_changed_file_naming_the_component(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "lib/CMakeLists.txt": "project(x)",
            "lib/src/a.cc": "int a;",
            "other/CMakeLists.txt": "project(y)",
            "other/src/b.cc": "int b;",
        },
    )
    comps = [_component(tmp_path), _component(tmp_path, "other", "other")]
    verify_sources(tmp_path, comps)
    (tmp_path / "other/src/b.cc").write_text("int b = 2;")
    with pytest.raises(SourceError, match="the sources of other differ from the pinned example/other@abc1234") as info:
        verify_sources(tmp_path, comps)
    assert "unmodified" in (info.value.hint or "")


def test_verify_refuses_a_missing_component(tmp_path: Path) -> None:
    _write(tmp_path, {"lib/CMakeLists.txt": "project(x)", "lib/src/a.cc": "int a;"})
    comp = _component(tmp_path)
    shutil.rmtree(tmp_path / "lib")
    with pytest.raises(SourceError, match="no lib/"):
        verify_sources(tmp_path, [comp])


def test_sources_argument_that_is_not_a_source_tree_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no FasterTransformer/ folder"):
        sources_from(tmp_path / "empty", tmp_path / "cache")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SourceError, match="neither a directory nor an archive"):
        sources_from(tmp_path / "notes.txt", tmp_path / "cache")
    with pytest.raises(SourceError, match="does not exist"):
        sources_from(tmp_path / "missing", tmp_path / "cache")


def test_pins_name_public_archives_at_the_pinned_revisions() -> None:
    ft = component("FasterTransformer")
    assert ft.archive_url == (
        "https://github.com/NVIDIA/FasterTransformer/archive/df4a7534860137e060e18d2ebf019906120ea204.tar.gz"
    )
    assert component("triton-core").archive_url.endswith("/core/archive/refs/tags/r22.12.tar.gz")
    assert not ft.uses("3rdparty/cutlass/include/cutlass/cutlass.h")  # its own component
    assert component("cutlass").uses("include/cutlass/cutlass.h")
    assert all(len(c.tree_sha256) == 64 for c in COMPONENTS)
    assert set(pins_fingerprint()) == {c.name for c in COMPONENTS}


# --------------------------------------------------------------------------- the patch set (synthetic)


EDITS = (Edit("a/one.txt", "old line\n", "new line\n", "one"), Edit("a/two.txt", "x", "y", "each x", count=2))


def _patchable(root: Path) -> None:
    _write(root, {"a/one.txt": "keep\nold line\n", "a/two.txt": "x and x"})


def test_patches_apply_all_and_then_refuse_a_second_time(tmp_path: Path) -> None:
    _patchable(tmp_path)
    assert apply_patches(tmp_path, EDITS) == 2
    assert (tmp_path / "a/one.txt").read_text() == "keep\nnew line\n"
    assert (tmp_path / "a/two.txt").read_text() == "y and y"
    with pytest.raises(SourceError, match="already patched"):
        apply_patches(tmp_path, EDITS)


def test_drifted_sources_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    _patchable(tmp_path)
    (tmp_path / "a/two.txt").write_text("x only once")
    with pytest.raises(SourceError, match=r"expected 2 occurrence\(s\) of 'x', found 1") as info:
        apply_patches(tmp_path, EDITS)
    assert "unmodified upstream" in (info.value.hint or "")
    assert (tmp_path / "a/one.txt").read_text() == "keep\nold line\n"  # the edit that did fit was not applied


def test_patch_that_contains_its_old_text_is_not_applied_twice(tmp_path: Path) -> None:
    edit = Edit("h.h", "#include <map>\n", "#include <array>\n#include <map>\n", "array")
    _write(tmp_path, {"h.h": "#include <map>\n"})
    apply_patches(tmp_path, [edit])
    assert check_patches(tmp_path, [edit]) == ["h.h is already patched (array)"]


def test_patch_set_digest_changes_with_any_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    before = patch_set_digest()
    assert before == patch_set_digest(PATCHES)
    changed = (*PATCHES[:-1], Edit(PATCHES[-1].path, PATCHES[-1].old, PATCHES[-1].new + " ", PATCHES[-1].why))
    assert patch_set_digest(changed) != before
    assert patches_mod.PATCHES is PATCHES


def test_a_new_file_is_written_once_and_counts_in_the_digest(tmp_path: Path) -> None:
    new = next(e for e in PATCHES if isinstance(e, NewFile))
    (tmp_path / new.path).parent.mkdir(parents=True)
    assert apply_patches(tmp_path, [new]) == 1
    assert (tmp_path / new.path).read_text() == new.text and "ftx" in new.text
    assert check_patches(tmp_path, [new]) == [f"{new.path} is already patched ({new.why})"]
    (tmp_path / new.path).write_text("someone else's file\n")
    assert check_patches(tmp_path, [new]) == [f"{new.path} exists already"]
    assert check_patches(tmp_path / "elsewhere", [new])[0].endswith(f"does not exist (for {new.path})")


def test_the_digest_covers_a_new_files_text(monkeypatch: pytest.MonkeyPatch) -> None:
    before = patch_set_digest()
    monkeypatch.setattr(NewFile, "text", property(lambda self: "changed"))
    assert patch_set_digest() != before


# --------------------------------------------------------------------------- the real upstream sources


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not BUNDLE.is_file():
        pytest.skip(f"the upstream source bundle is not at {BUNDLE}")
    root = tmp_path_factory.mktemp("upstream")
    with tarfile.open(BUNDLE) as tar:
        members = [m for m in tar.getmembers() if not m.name.startswith(("tritonserver", "wheels"))]
        tar.extractall(root, members=members, filter="data")
    return root


@needs_bundle
def test_the_real_sources_match_every_pin(upstream: Path) -> None:
    verify_sources(upstream)
    for comp in COMPONENTS:
        assert component_digest(upstream, comp) == comp.tree_sha256, comp.name


@needs_bundle
def test_the_patch_set_applies_to_the_real_sources_exactly_once(upstream: Path, tmp_path: Path) -> None:
    for rel in {e.path for e in PATCHES if isinstance(e, Edit)}:  # a copy of the touched files is enough
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(upstream / rel, tmp_path / rel)
    assert check_patches(tmp_path) == []
    apply_patches(tmp_path)
    assert len(check_patches(tmp_path)) == len(PATCHES)  # every edit now reports "already patched"
    kernels = tmp_path / "FasterTransformer/src/fastertransformer/kernels"
    assert "ftx_custom_ar_kernels.cu" in (kernels / "CMakeLists.txt").read_text()
    assert "template<typename T, int NRANKS>" in (kernels / "ftx_custom_ar_kernels.cu").read_text()
    cmake = (tmp_path / "FasterTransformer/CMakeLists.txt").read_text()
    assert 'set(CXX_STD "17"' in cmake and "if(FT_BUILD_TESTS)" in cmake and "-lnvToolsExt" not in cmake


@needs_bundle
def test_an_ffn_layer_that_does_not_all_reduce_keeps_its_own_output_and_gptj_can_reduce_once(
    upstream: Path, tmp_path: Path
) -> None:
    """GPT-NeoX's parallel residual builds its FFN layer without an all-reduce; upstream still swapped the custom
    all-reduce's peer buffer in as the FFN's output, so the decoder read a buffer nothing wrote. GPT-J's decoder
    gets the one-all-reduce path: on by default in fp16, FTX_GPTJ_ONE_ALLREDUCE=0/1 decides for any type."""
    ffn = "FasterTransformer/src/fastertransformer/layers/TensorParallelGeluFfnLayer.cc"
    decoder = "FasterTransformer/src/fastertransformer/models/gptj/GptJDecoder.cc"
    for rel in {e.path for e in PATCHES if isinstance(e, Edit)}:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(upstream / rel, tmp_path / rel)
    swap = "if (enable_custom_all_reduce_ && custom_all_reduce_comm_ != nullptr"
    assert f"{swap}) {{" in (tmp_path / ffn).read_text()  # upstream: swapped whether or not it reduces
    apply_patches(tmp_path)
    assert f"{swap} && do_all_reduce_) {{" in (tmp_path / ffn).read_text()
    text = (tmp_path / decoder).read_text()
    assert 'std::string(ftx_one) == "1"' in text and text.count("!ftx_one_all_reduce_,") == 2
    assert "(ftx_one_unset ? std::is_same<T, half>::value :" in text  # the fp16 default
    assert "customAllReduce(ftx_elts, stream_)" in text and "ftNcclAllReduceSum(layer_output" in text


@needs_bundle
def test_weight_files_of_the_weights_own_type_take_the_pinned_loader_and_each_gpu_logs_its_load(
    upstream: Path, tmp_path: Path
) -> None:
    """loadWeightFromBinFunc hands a file already in the weight's type to ftx's pinned loader (built into
    memory_utils, so into libtransformer-shared) before upstream's host vector; other types still convert as
    upstream; the backend times each GPU's weight thread and logs the loader's line."""
    utils = "FasterTransformer/src/fastertransformer/utils"
    for rel in {e.path for e in PATCHES if isinstance(e, Edit)}:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(upstream / rel, tmp_path / rel)
    before = (tmp_path / utils / "memory_utils.cu").read_text()
    assert "ftxPinnedLoaderReady" not in before
    apply_patches(tmp_path)
    text = (tmp_path / utils / "memory_utils.cu").read_text()
    func = text[text.index("int loadWeightFromBinFunc(T* ptr") :]
    func = func[: func.index("\n}\n")]
    pinned = func.index("if (std::is_same<T, T_IN>::value && ftxPinnedLoaderReady()) {")
    assert pinned < func.index("ftxLoadWeightToDevice(ptr, shape, sizeof(T), filename)") < func.index("return 0;")
    assert pinned < func.index("loadWeightFromBinHelper<T_IN>(shape, filename)")  # the vector only for the rest
    assert "invokeCudaD2DcpyConvert(ptr, ptr_2, host_array.size());" in func  # conversions as upstream
    assert text.count('#include "src/fastertransformer/utils/ftx_weight_loader.h"') == 1
    helper = before[
        before.index("std::vector<T> loadWeightFromBinHelper") : before.index("template<typename T, typename T_IN>")
    ]
    assert helper in text  # upstream's helper (its warnings) untouched
    assert "memory_utils.cu ftx_weight_loader.cc)" in (tmp_path / utils / "CMakeLists.txt").read_text()
    loader = (tmp_path / utils / "ftx_weight_loader.cc").read_text()
    assert "cudaHostAlloc" in loader and "cudaMemcpyAsync" in loader and "cudaStreamLegacy" in loader
    backend = (tmp_path / BACKEND_CC).read_text()
    assert "model->createSharedWeights(gid, rank);" in backend
    assert "ft::ftxWeightLoadMessage(rank, gid, ftx_took.count())" in backend
    assert "std::thread(&AbstractTransformerModel::createSharedWeights" not in backend


@needs_bundle
def test_a_modified_upstream_file_is_refused_naming_its_component(upstream: Path) -> None:
    target = upstream / "fastertransformer_backend" / "CMakeLists.txt"
    original = target.read_bytes()
    try:
        target.write_bytes(original + b"\n# local change\n")
        with pytest.raises(SourceError, match="the sources of fastertransformer_backend differ"):
            verify_sources(upstream)
    finally:
        target.write_bytes(original)


# --------------------------------------------------------------------------- the stream interval's C++, compiled

STREAM_HARNESS = r"""
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#define TRITONJSON_STATUSTYPE int
#define TRITONJSON_STATUSRETURN(M) return 1
#define TRITONJSON_STATUSSUCCESS 0
#include "triton/common/triton_json.h"
#define LOG_MESSAGE(LEVEL, MSG) std::fprintf(stderr, "%s %s\n", #LEVEL, MSG)

namespace triton { namespace harness {
struct stream_callback_ctx_t {  // the fields the patch adds (the backend's own ones are not read here)
  int ftx_stream_interval = 1;
  int ftx_steps = 0;
};
struct ModelState {
  common::TritonJson::Value config;
  common::TritonJson::Value& ModelConfig() { return config; }
};

int Interval(const std::string& json, const uint32_t request_count, const size_t total_batch_size) {
  ModelState state;
  ModelState* model_state_ = &state;
  if (state.config.Parse(json) != 0) {
    return -1;
  }
  bool is_decoupled_ = false;  // as the backend reads it when the instance starts
  common::TritonJson::Value policy;
  if (state.config.Find("model_transaction_policy", &policy)) {
    policy.MemberAsBool("decoupled", &is_decoupled_);
  }
  stream_callback_ctx_t context;
@FILL@
  return context.ftx_stream_interval;
}

int Sent(const int interval, const int steps) {
  stream_callback_ctx_t ctx;
  ctx.ftx_stream_interval = interval;
  stream_callback_ctx_t* context = &ctx;
  int sent = 0;
  for (int step = 0; step < steps; ++step) {
    [&]() {
@SKIP@
      ++sent;
    }();
  }
  return sent;
}
}}  // namespace triton::harness

int main(int argc, char** argv) {
  for (int i = 1; i + 3 < argc; i += 4) {  // config JSON, requests and rows in the execution, generated steps
    const int interval =
        triton::harness::Interval(argv[i], (uint32_t)std::atoi(argv[i + 1]), (size_t)std::atoll(argv[i + 2]));
    std::printf("%d %d\n", interval, triton::harness::Sent(interval, std::atoi(argv[i + 3])));
  }
  return 0;
}
"""


def _inserted(needle: str) -> str:
    """What the backend patch's edit holding ``needle`` adds after its old text (the edits append)."""
    edit = next(
        e for e in PATCHES if isinstance(e, Edit) and e.path.endswith("libfastertransformer.cc") and needle in e.new
    )
    assert edit.new.startswith(edit.old)
    return edit.new[len(edit.old) :]


@needs_bundle
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_stream_interval_patch_compiled_reads_what_the_config_writer_writes(upstream: Path, tmp_path: Path) -> None:
    """The C++ the patch adds where the backend fills the streaming callback's context, and its step filter,
    compiled with g++ against Triton's real JSON reader (the backend itself needs CUDA): for config.pbtxt as ftx
    writes it and Triton hands it over (JSON), the interval for 1 … 64 requests in one execution is the python
    runtime's (``auto``: ceil(requests / R)), and a stream of 12 steps sends the first and every interval-th one.
    A streaming execution logs (verbose) its requests, its rows and the interval: what a GPU run reads to see the
    batches the backend was given (requests of two rows each here, so the two counts differ)."""
    import subprocess

    from ftx_triton.plan.settings import AUTO
    from ftx_triton.repository.model_config import FtModelOptions, build_ft_model_config
    from ftx_triton.repository.stream_interval import StreamInterval
    from google.protobuf import json_format

    source = STREAM_HARNESS.replace("@FILL@", _inserted("ftx_stream_auto_responses")).replace(
        "@SKIP@", _inserted("% context->ftx_stream_interval")
    )
    (tmp_path / "harness.cc").write_text(source)
    includes = [f"-I{upstream / 'triton' / 'common' / 'include'}", f"-I{upstream / 'rapidjson' / 'include'}"]
    build = subprocess.run(
        [
            "g++",
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Wno-deprecated-declarations",
            *includes,
            "harness.cc",
            "-o",
            "harness",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    assert not re.search(r"harness\.cc:\d+:\d+: warning", build.stderr), build.stderr  # none in the patch's lines

    def config(interval: object, streaming: bool = True, **edit: str) -> tuple[str, dict[str, str]]:
        opts = FtModelOptions("GPT-J", "decoder", Path("/x/1-gpu"), 1, streaming=streaming, stream_interval=interval)  # type: ignore[arg-type]
        message = build_ft_model_config(opts)
        for key, value in edit.items():  # a hand-edited config.pbtxt
            message.parameters[key].string_value = value
        params = {k: v.string_value for k, v in message.parameters.items()}
        return json.dumps(json_format.MessageToDict(message, preserving_proto_field_name=True)), params

    configs = [
        config(AUTO),
        config(AUTO, ftx_stream_auto_responses="2"),
        config(AUTO, ftx_stream_auto_responses="0"),  # not a count: the default R
        config(3),
        config(1),
        config(AUTO, streaming=False),
    ]
    cases = [(text, params, n) for text, params in configs for n in (1, 2, 4, 5, 8, 9, 32, 64)]
    args = [str(a) for text, _params, n in cases for a in (text, n, 2 * n, 12)]
    run = subprocess.run([str(tmp_path / "harness"), *args], capture_output=True, text=True, check=True)
    got = [tuple(map(int, line.split())) for line in run.stdout.splitlines()]
    expected, logged = [], []
    for text, params, n in cases:
        interval = StreamInterval.from_parameters(params).for_batch(n)
        expected.append((interval, sum(StreamInterval.sends(step, interval) for step in range(1, 13))))
        if json.loads(text).get("model_transaction_policy", {}).get("decoupled"):
            logged.append(
                f"TRITONSERVER_LOG_VERBOSE ftx stream interval: {n} requests ({2 * n} rows) in this execution, "
                f"a streamed response every {interval} steps"
            )
    assert got == expected
    assert run.stderr.splitlines() == logged and len(logged) == 5 * 8  # the not-streaming model logs nothing
    # auto, R = 4: the first step, then every interval-th
    assert got[:8] == [(1, 12), (1, 12), (1, 12), (2, 7), (2, 7), (3, 5), (8, 2), (16, 1)]


# --------------------------------------------------------------------------- GPT-J's decoding step in a CUDA graph

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)


def _patched_copy(upstream: Path, tmp_path: Path) -> Path:
    for rel in {e.path for e in PATCHES if isinstance(e, Edit)}:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(upstream / rel, tmp_path / rel)
    apply_patches(tmp_path)
    return tmp_path


@needs_bundle
def test_gptj_runs_its_decoder_step_through_the_graph_and_the_attention_reads_the_devices_timestep(
    upstream: Path, tmp_path: Path
) -> None:
    """The pieces FTX_FT_CUDA_GRAPH=1 needs, on the pinned sources: GptJ's forward starts a graph per forward
    (beam width 1, one pipeline stage, buffers kept) and runs its decoder layers through it; the dispatch gives the
    kernel the device's timestep while a step is captured; inside the kernel every read of the timestep is the
    one taken at its start (the device's when set), while the host still sizes the launch from its own; the custom
    all-reduce counts its flags on the device when the graph is on."""
    root = _patched_copy(upstream, tmp_path)
    ft = root / "FasterTransformer/src/fastertransformer"
    gptj = (ft / "models/gptj/GptJ.cc").read_text()
    begin = gptj.index("ftx_step_graph_.begin(ftxCudaGraphRequested(std::is_same<T, half>::value) && beam_width == 1")
    loop = gptj.index("for (int step = max_input_length; step < (int)max_output_seq_len; step++)")
    run = gptj.index("ftx_step_graph_.run(stream_,")
    assert (
        begin
        < loop
        < run
        < gptj.index("gpt_decoder_->forward(&decoder_output_tensors,")
        < gptj.index("invokeGeneralLayerNorm(normed_decoder_output_buf_")
    )
    assert (
        "pipeline_para_.world_size_ == 1" in gptj[begin:loop] and "!is_free_buffer_after_forward_" in gptj[begin:loop]
    )
    assert gptj.count("gpt_decoder_->forward(") == 1  # the decoder runs only through the graph's runner
    assert "FtxStepGraph ftx_step_graph_;" in (ft / "models/gptj/GptJ.h").read_text()

    template = (
        ft / "kernels/decoder_masked_multihead_attention/decoder_masked_multihead_attention_template.hpp"
    ).read_text()
    kernel = template[template.index("__global__ void masked_multihead_attention_kernel(") :]
    kernel = kernel[: kernel.index("\n}\n")]
    first = "const int ftx_timestep = params.ftx_timestep_ptr != nullptr ? *params.ftx_timestep_ptr : params.timestep;"
    assert kernel.count("params.timestep") == 1 and first in kernel  # only the read at its start
    assert kernel.index(first) < kernel.index("ftx_timestep, params.memory_max_len")
    host = template[template.index("inline size_t smem_size_in_bytes(") : template.index("inline __device__ constexpr")]
    assert "min(params.timestep, params.memory_max_len)" in host and "ftx_timestep" not in host
    assert "const int* ftx_timestep_ptr = nullptr;" in (ft / "kernels/decoder_masked_multihead_attention.h").read_text()
    dispatch = (ft / "layers/attention_layers/DecoderSelfAttentionLayer.cc").read_text()
    assert (
        dispatch.index("params.timestep             = step + max_prefix_prompt_length - 1;")
        < dispatch.index("params.ftx_timestep_ptr = ftx_step.device_timestep;")
        < dispatch.index("masked_multihead_attention(params, stream);")
    )
    assert "ftx_cuda_graph.cc\n    ftx_cuda_graph_kernels.cu\n" in (ft / "kernels/CMakeLists.txt").read_text()
    comm = (ft / "utils/ftx_custom_ar_comm.cc").read_text()
    assert (
        "if (ftxCudaGraphRequested(std::is_same<T, half>::value)) {" in comm
        and "param_.ftx_block_flags = counters;" in comm
    )
    assert "uint32_t* ftx_block_flags;" in (ft / "kernels/custom_ar_kernels.h").read_text()
    kernels = (ft / "kernels/ftx_custom_ar_kernels.cu").read_text()
    assert kernels.count("begin_call<T, NRANKS>(params)") == 2 and kernels.count("end_call(params, flag);") == 2


@needs_bundle
def test_the_graphs_bands_are_the_attention_launchers_thresholds(upstream: Path) -> None:
    """A graph serves the timesteps of one launch configuration (ftxMmhaBand): every head size's launcher must
    change its configuration at exactly those timesteps, or a replayed kernel would differ from the eager one."""
    graph = patches_mod.NewFile("x", "ftx_cuda_graph.cc", "").text
    assert "timestep < 32 ? 0 : (timestep < 2048 ? 1 : 2)" in graph
    launchers = sorted(
        (upstream / "FasterTransformer/src/fastertransformer/kernels/decoder_masked_multihead_attention").glob("*.cu")
    )
    assert len(launchers) == 12
    for launcher in launchers:
        text = launcher.read_text()
        assert re.findall(r"tlength < (\d+)", text) == ["32", "2048", "32", "2048"], launcher.name


@needs_bundle
@pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit) to compile the graph's kernel")
def test_the_graphs_kernel_compiles_with_nvcc(upstream: Path, tmp_path: Path) -> None:
    """ftx_cuda_graph_kernels.cu (with its header) compiled by this machine's nvcc for sm_90, as the build does."""
    import subprocess

    root = _patched_copy(upstream, tmp_path) / "FasterTransformer"  # the patched files, the rest upstream's
    source = root / "src/fastertransformer/kernels/ftx_cuda_graph_kernels.cu"
    includes = [f"-I{root}", f"-I{upstream / 'FasterTransformer'}"]
    command = [str(NVCC), "-std=c++17", *includes, "-gencode=arch=compute_90,code=sm_90", "-c", str(source)]
    done = subprocess.run([*command, "-o", str(tmp_path / "k.o")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
