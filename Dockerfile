# ftx itself as an image: the python runtime (the embedded tritonserver of the nvidia-pytriton wheel, models
# generating with transformers on CPU or one GPU) and the OpenAI-compatible endpoint. The FasterTransformer
# variant is built by ftx itself: `ftx image build` (the backend image) and `ftx package` (a model baked in).
#
#   docker build -t ftx:local .
#   docker run --rm -p 8000-8002:8000-8002 -p 9000:9000 -v ftx-home:/ftx-home ftx:local            # tiny-gptj
#   docker run --rm -p 8000:8000 -p 9000:9000 -v ftx-home:/ftx-home ftx:local run gpt2 --runtime python \
#       --host 0.0.0.0 --openai-host 0.0.0.0 --http-port 8000 --openai-port 9000
#
# Probes: GET /v2/health/live (the server answers), GET /v2/health/ready (every model loaded: send traffic),
# GET /v1/models on the OpenAI port. SIGTERM (docker stop, a pod's deletion) stops tritonserver and the OpenAI
# endpoint cleanly (in-flight requests end, shared memory is removed) and exits 0; a second SIGTERM during that
# stop is ignored. Allow it 60 s (docker stop -t 60, terminationGracePeriodSeconds: 60).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
# The CPU build of torch (several GB smaller); pass --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124
# for the python runtime on a GPU.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 FTX_HOME=/ftx-home FTX_LOG_FORMAT=json
RUN apt-get update && apt-get install -y --no-install-recommends openssh-server openssh-client \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/ftx/src
COPY core ./core
COPY plugins ./plugins
RUN pip install --index-url "${TORCH_INDEX}" torch \
    && pip install ./core[torch] ./plugins/gptj ./plugins/t5 ./plugins/gptneox ./plugins/kogpt \
    && pip install --no-deps "nvidia-pytriton>=0.5" \
    && ftx --version
VOLUME /ftx-home
EXPOSE 8000 8001 8002 9000
STOPSIGNAL SIGTERM
ENTRYPOINT ["ftx"]
CMD ["run", "tiny-gptj", "--runtime", "python", "--host", "0.0.0.0", "--openai-host", "0.0.0.0", \
     "--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002", "--openai-port", "9000"]
