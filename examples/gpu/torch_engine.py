"""A torch-based stand-in engine for GPU checks (scripts/gpu-check).

It takes ``--mib`` of memory on every GPU it can see, then serves on $PORT:
GET /health -> 200 once the memory is held; GET /gpus -> what CUDA shows it
(count, names, UUIDs, CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    args = parser.parse_args()
    count = torch.cuda.device_count()
    held = [
        torch.empty(args.mib << 20, dtype=torch.uint8, device=f"cuda:{i}") for i in range(count)
    ]
    info = {
        "count": count,
        "uuids": [str(torch.cuda.get_device_properties(i).uuid) for i in range(count)],
        "names": [torch.cuda.get_device_name(i) for i in range(count)],
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "held_mib": args.mib * len(held),
        "pid": os.getpid(),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(info if self.path == "/gpus" else {"status": "ok"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()


if __name__ == "__main__":
    main()
