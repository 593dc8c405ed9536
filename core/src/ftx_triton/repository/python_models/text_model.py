"""Triton Python-backend model: ``preprocessing`` or ``postprocessing`` of an ftx repository.

Written by ftx into ``<repository>/<model>/1/model.py``; the logic lives in ``ftx_textproc.py``
next to it (a copy of ``ftx_triton.repository.textproc``), the tokenizer files too. The role, the I/O kind
and the model's start/end/pad ids come from this model's ``config.pbtxt`` parameters. Nothing is
downloaded, at load or per request.
"""

import json
import traceback
from pathlib import Path

import ftx_textproc as textproc
import triton_python_backend_utils as pb_utils


def invalid_argument(message):
    """A TritonError that Triton answers with 400 / INVALID_ARGUMENT (a bad request, not a fault)."""
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


def requested_outputs(request):
    """The outputs the caller asked for (an ensemble step asks for those it maps), or None for all."""
    names = getattr(request, "requested_output_names", None)
    asked = list(names()) if names is not None else []
    return asked or None


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = textproc.model_parameters(config)
        here = Path(args.get("model_repository") or Path(__file__).parent)
        version_dir = here / str(args.get("model_version") or "1")
        if not version_dir.is_dir():
            version_dir = Path(__file__).resolve().parent
        self.role = params.get("role", "")
        self.processor = textproc.build_processor(self.role, version_dir, params, int(config.get("max_batch_size", 0)))
        self.input_names = [item["name"] for item in config.get("input", [])]
        self.output_names = [item["name"] for item in config.get("output", [])]

    def execute(self, requests):
        responses = []
        for request in requests:
            arrays = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    arrays[name] = tensor.as_numpy()
            try:
                result = self.processor.run(arrays, requested_outputs(request))
            except textproc.RequestError as exc:
                responses.append(pb_utils.InferenceResponse(error=invalid_argument(f"{self.role}: {exc}")))
                continue
            except Exception as exc:  # noqa: BLE001 - a fault here: logged in full, answered without a traceback
                traceback.print_exc()
                message = f"{self.role} failed: {type(exc).__name__}: {exc}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
                continue
            ordered = textproc.outputs_in_order(result, self.output_names)
            tensors = [pb_utils.Tensor(name, value) for name, value in ordered]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self):
        self.processor = None
