"""``python -m ftx_triton.openai_api``: run the OpenAI-compatible endpoint for one deployment until SIGTERM."""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ftx_triton.openai_api", description=__doc__)
    parser.add_argument("--triton", required=True, help="Triton's HTTP address, http://HOST:PORT")
    parser.add_argument("--model-id", required=True, help="The model name clients send (and /v1/models lists)")
    parser.add_argument("--tokenizer", required=True, type=Path, help="The repository's preprocessing/1 directory")
    parser.add_argument("--ensemble", default="text", help="The text model (generate extension)")
    parser.add_argument(
        "--triton-grpc", help="Triton's gRPC address, HOST:PORT: a streaming model's token ids are read from it"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--home", type=Path, help="The FTX_HOME of its record: the endpoint stops once it is deleted")
    args = parser.parse_args(argv)

    from ftx_triton.front.server import Front, Limits
    from ftx_triton.openai_api.app import MAX_BODY_BYTES, make_app
    from ftx_triton.server.home_watch import HomeWatch

    app = make_app(args.triton, args.model_id, args.tokenizer, args.ensemble, triton_grpc=args.triton_grpc)
    front = Front(app, args.host, args.port, Limits(max_body_bytes=MAX_BODY_BYTES))

    def home_gone() -> None:
        print(f"{args.home} (FTX_HOME) was deleted: no `ftx stop` could find this endpoint, so it stops", flush=True)
        front.stop()

    HomeWatch(args.home).on_gone(home_gone)
    front.run()


if __name__ == "__main__":
    main()
