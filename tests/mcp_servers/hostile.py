"""A small MCP server (stdio, stdlib only) that does what a hostile or broken third-party
server would: write wherever it is told, open connections, read its environment, crash,
send garbage. The gateway's tests run it under the daemon's confinement.

``--start=die`` exits before answering; ``--start=garbage`` answers initialize with a
line that is not JSON.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

TOOLS = [
    {
        "name": "write",
        "description": "Write text to any path.",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
            "required": ["path", "text"],
        },
    },
    {"name": "whoami", "description": "uid, pid, environment.", "inputSchema": {"type": "object"}},
    {
        "name": "connect",
        "description": "Open a TCP connection.",
        "inputSchema": {"type": "object", "properties": {"port": {"type": "integer"}}, "required": ["port"]},
    },
    {"name": "crash", "description": "Exit at once.", "inputSchema": {"type": "object"}},
    {"name": "garbage", "description": "Answer with a line that is not JSON.", "inputSchema": {"type": "object"}},
    {
        "name": "sleep",
        "description": "Sleep.",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
    },
    {
        "name": "run",
        "description": "Run a program.",
        "inputSchema": {
            "type": "object",
            "properties": {"argv": {"type": "array", "items": {"type": "string"}}},
            "required": ["argv"],
        },
    },
    {"name": "bad name!", "description": "Refused by the gateway.", "inputSchema": {"type": "object"}},
    {"name": "no_schema", "description": "Refused by the gateway."},
]


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(request_id: int, body: str, *, error: bool = False, data: dict | None = None) -> None:
    result: dict = {"content": [{"type": "text", "text": body}], "isError": error}
    if data is not None:
        result["structuredContent"] = data
    send({"jsonrpc": "2.0", "id": request_id, "result": result})


def call(request_id: int, name: str, args: dict) -> None:
    if name == "write":
        try:
            with open(args["path"], "w") as f:
                f.write(args["text"])
        except OSError as exc:
            text(request_id, f"write failed: {exc.strerror}", error=True)
            return
        text(request_id, "wrote")
    elif name == "whoami":
        data = {"uid": os.getuid(), "pid": os.getpid(), "env": dict(os.environ), "cwd": os.getcwd()}
        text(request_id, json.dumps(data), data=data)
    elif name == "connect":
        try:
            socket.create_connection(("127.0.0.1", args["port"]), timeout=3).close()
        except OSError as exc:
            text(request_id, f"connect failed: {exc}", error=True)
            return
        text(request_id, "connected")
    elif name == "run":
        done = subprocess.run(args["argv"], capture_output=True, text=True, timeout=30)
        text(request_id, f"rc={done.returncode}\n{done.stdout}{done.stderr}")
    elif name == "crash":
        sys.stderr.write("hostile: crashing on purpose\n")
        sys.stderr.flush()
        os._exit(3)
    elif name == "garbage":
        sys.stdout.write("this is not json\n")
        sys.stdout.flush()
    elif name == "sleep":
        time.sleep(float(args.get("seconds", 30)))
        text(request_id, "slept")
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": f"no tool {name}"}})


def main() -> None:
    start = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--start=")), "")
    if start == "die":
        sys.stderr.write("hostile: refusing to start\n")
        sys.exit(2)
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if method == "initialize":
            if start == "garbage":
                sys.stdout.write("<html>not an MCP server</html>\n")
                sys.stdout.flush()
                continue
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "result": {
                        "protocolVersion": message["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "hostile", "version": "1"},
                    },
                }
            )
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            call(request_id, message["params"]["name"], message["params"].get("arguments") or {})
        elif request_id is not None:
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})


if __name__ == "__main__":
    main()
