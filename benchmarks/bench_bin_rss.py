"""Peak memory of reading a ~1 GB ``pytorch_model.bin`` the way the converter does.

Writes a GPT-J-shaped fp32 checkpoint (``pytorch_model.bin`` with torch.save, and the same
tensors as ``model.safetensors``), then, each in a fresh process, reads every tensor and copies it
out as the converter's writer does, sampling ``/proc/self/status``:

- ``ftx .bin``         ftx's ``TorchBinFile``: ``torch.load(mmap=True, weights_only=True)``
- ``torch.load``       plain ``torch.load(weights_only=True)`` (the whole file in anonymous memory)
- ``ftx safetensors``  ftx's ``SafetensorsFile`` (preads into per-tensor buffers)

Peak RSS (VmHWM) counts file pages mapped in; peak anonymous RSS (RssAnon, sampled every 5 ms) is
what the process really owns. Usage: ``python benchmarks/bench_bin_rss.py [--gb 1.0] [--dir DIR]``.
Run it on a quiet machine with free memory (not on a shared development box).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HIDDEN = 1024


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def make_checkpoint(directory: Path, gigabytes: float) -> int:
    """GPT-J-shaped fp32 tensors (12 H^2 per layer) adding up to about ``gigabytes``; return bytes."""
    import numpy as np
    import torch

    layers = max(1, round(gigabytes * 1e9 / (12 * HIDDEN * HIDDEN * 4)))
    state: dict[str, torch.Tensor] = {"transformer.wte.weight": torch.randn(512, HIDDEN)}
    for i in range(layers):
        p = f"transformer.h.{i}"
        square = (HIDDEN, HIDDEN)
        shapes = {
            "attn.q_proj": square,
            "attn.k_proj": square,
            "attn.v_proj": square,
            "attn.out_proj": square,
            "mlp.fc_in": (4 * HIDDEN, HIDDEN),
            "mlp.fc_out": (HIDDEN, 4 * HIDDEN),
        }
        for name, shape in shapes.items():
            state[f"{p}.{name}.weight"] = torch.randn(*shape)
    torch.save(state, directory / "pytorch_model.bin")
    # the same tensors as safetensors (header + raw little-endian data)
    header, offset, blobs = {}, 0, []
    for name, tensor in state.items():
        data = tensor.numpy().astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(directory / "model.safetensors", "wb") as fh:
        fh.write(len(text).to_bytes(8, "little") + text)
        for blob in blobs:
            fh.write(blob)
    return sum(t.numel() * 4 for t in state.values())


def measure(mode: str, directory: Path) -> dict[str, float]:
    """In this process: read every tensor of the checkpoint in ``mode`` and copy it out."""
    import numpy as np

    peak_anon = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak_anon[0] = max(peak_anon[0], _status().get("RssAnon", 0))
            time.sleep(0.005)

    import torch  # imported before the baseline so its own footprint is not counted
    from ftx_triton.formats.checkpoint import SafetensorsFile, TorchBinFile

    base = _status()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    started = time.perf_counter()
    if mode == "ftx .bin":
        bin_reader = TorchBinFile(directory / "pytorch_model.bin")
        arrays = (bin_reader.read(n) for n in bin_reader.names())
    elif mode == "ftx safetensors":
        reader = SafetensorsFile(directory / "model.safetensors")
        arrays = (reader.read(n) for n in reader.names())
    else:
        state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
        arrays = (t.numpy() for t in state.values())
    total = 0
    for array in arrays:
        copy = np.array(array, copy=True)  # what the writer does with each tensor
        total += copy.nbytes
        del copy
    seconds = time.perf_counter() - started
    stop.set()
    thread.join()
    end = _status()
    return {
        "bytes": total,
        "seconds": seconds,
        "peak_rss": end["VmHWM"] - base["VmRSS"],
        "peak_anon": peak_anon[0] - base.get("RssAnon", 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.dir)))
        return
    with tempfile.TemporaryDirectory(prefix="ftx-bin-rss-", dir=args.dir) as tmp:
        directory = Path(tmp)
        size = make_checkpoint(directory, args.gb)
        on_disk = os.path.getsize(directory / "pytorch_model.bin") / 1e9
        print(f"checkpoint: {size / 1e9:.2f} GB of fp32 tensors ({on_disk:.2f} GB .bin)")
        print(f"{'reader':<18}{'peak RSS':>12}{'peak anon RSS':>16}{'seconds':>10}")
        for mode in ("ftx .bin", "torch.load", "ftx safetensors"):
            done = subprocess.run(
                [sys.executable, __file__, "--measure", mode, "--dir", str(directory)],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{mode:<18}{r['peak_rss'] / 1e9:>10.2f} GB{r['peak_anon'] / 1e9:>13.2f} GB{r['seconds']:>10.2f}")


if __name__ == "__main__":
    main()
